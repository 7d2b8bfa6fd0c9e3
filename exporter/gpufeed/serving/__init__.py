"""Inference serving: the demand a serving stack (vLLM, Triton, TGI) reports, and where its
metrics are (docs/serving.md)."""
