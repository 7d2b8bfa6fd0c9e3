"""The window engine and its reasoning: per-unit state, features, rules, evidence, summaries."""
