"""Benchmarks: operation cost, whole-trace replay, hashing, radix matching, the GPU kernel."""
