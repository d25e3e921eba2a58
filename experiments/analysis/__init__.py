"""Analysis: per-request metrics and the offline bounds (LRU / Belady models, the DFS oracle)."""
