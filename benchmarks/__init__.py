"""Benchmarks: eager vs inductor vs ember, run from the repository root as `python -m benchmarks.NAME`."""
