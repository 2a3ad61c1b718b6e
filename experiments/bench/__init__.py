"""Benchmark scripts: each runs its variants side by side in one process and writes
its ratios as JSON to experiments/results/, from which RESULTS.md is generated."""
