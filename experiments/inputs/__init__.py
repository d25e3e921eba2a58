"""Inputs: built-in synthetic workloads and real-trace readers."""
