"""Mutants of the decomposition study's ablation switches (issue 30, item 2): each switch must
do what it names, and only that."""

SUITES = ["tests/test_decomposition_switches.py"]

MUTANTS = {
    "hashchain publish='commit': a decode step's commit publishes too": (
        "backends/hashchain/backend.py",
        "        if self._prefill_end is not None and req.num_computed_tokens <= self._prefill_end[req.request_id]:",  # noqa: E501
        "        if self._prefill_end is not None:",
    ),
    "hashchain publish='commit': blocks still published at allocation": (
        "backends/hashchain/kv_cache_manager.py",
        "        self.publish_at_allocation = publish == \"allocation\"",
        "        self.publish_at_allocation = True",
    ),
    "hashchain dedupe: the duplicate kept in the request's table": (
        "backends/hashchain/block_pool.py",
        "        self.touch([existing])\n        blocks[i] = existing\n"
        "        self.free_blocks([duplicate])\n        return True",
        "        return False",
    ),
    "radix page granularity: the victim leaf still evicted whole": (
        "backends/radix/radix_cache.py",
        "            if not self.whole_leaves:",
        "            if False:",
    ),
    "radix page granularity: evicting for SGLang's over-estimated demand": (
        "backends/radix/backend.py",
        "        short = (num_pages * p if self.page_granular else demand) - self.pool.num_free * p",
        "        short = demand - self.pool.num_free * p",
    ),
    "hashchain leaf-lru: the free queue kept (the switch a no-op)": (
        "backends/hashchain/eviction.py",
        "    ranked = leaf_lru or eviction_policy.lower() != \"lru\"",
        "    ranked = eviction_policy.lower() not in (\"lru\", \"leaf-lru\")",
    ),
}
