"""Benchmarks of ebpo: speed scripts run as files (``python benchmarks/bench_eval.py``) and the learning
benchmark, a package run as ``python -m benchmarks.learning`` from the repository root (docs/benchmarks.md)."""
