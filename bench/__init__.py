"""Benchmarks and the labelled-trace generator; run from the repository root as
`python -m bench.NAME` (`make bench`), imported by tests as `bench.NAME`."""
