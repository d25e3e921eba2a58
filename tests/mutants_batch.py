"""Mutants of the batched engine step (issue 28): the batch path must leave exactly what one
allocation after another leaves, and the engine must give the runs recorded at c2d2b27."""

SUITES = [
    "tests/test_allocate_batch.py",
    "tests/test_stateful.py::test_lifecycle_keeps_invariants_and_never_corrupts_kv",
    "tests/test_engine_golden.py",
]

MUTANTS = {
    "batch: a radix in-page decode step taken in place while the pool must evict for it": (
        "backends/radix/backend.py",
        "        if total_tokens > len(state.pages) * self.page_size or not self._calm():",
        "        if total_tokens > len(state.pages) * self.page_size:",
    ),
    "batch: a radix decode step past the page boundary taken in place (no page, nothing evicted)": (
        "backends/radix/backend.py",
        "        if total_tokens > len(state.pages) * self.page_size or not self._calm():",
        "        if total_tokens > len(state.pages) * self.page_size + 1:",
    ),
    "batch: a radix page-opening step counted twice": (
        "backends/radix/backend.py",
        "                    opened.reserved += 1\n",
        "                    opened.reserved += 2\n",
    ),
    "batch: a radix run of page-opening steps past the ready pages (an eviction skipped)": (
        "backends/radix/backend.py",
        "        end = min(len(records), start + limit)",
        "        end = len(records)",
    ),
    "batch: a hashchain step that fills a block taken in place (the block never cached)": (
        "backends/hashchain/backend.py",
        "        if not coordinator.extends_in_place(req.request_id, total_tokens, "
        "min(total_tokens, req.num_tokens)):",
        "        if not coordinator.extends_in_place(req.request_id, total_tokens, "
        "min(total_tokens, req.num_tokens) - 1):",
    ),
    "batch: an eviction charged to the wrong request of the batch": (
        "prefixcache/interface.py",
        "            evicted.append((index, self.stats.evicted_tokens - before))",
        "            evicted.append((0, self.stats.evicted_tokens - before))",
    ),
    "radix: a checkpoint's walk along the locked path skips the root's child": (
        "backends/radix/radix_cache.py",
        "        path.reverse()\n",
        "        path.reverse()\n        path = path[1:]\n",
    ),
    "engine: a decode run that takes in a prefilling request": (
        "prefixcache/engine.py",
        "        while k < end and running[k].request_id not in in_prefill:",
        "        while k < end:",
    ),
}
