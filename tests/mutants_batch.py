"""Mutants of the batched engine step (issue 28): the batch path must leave exactly what one
allocation after another leaves, and the engine must give the runs recorded at c2d2b27."""

SUITES = [
    "tests/test_allocate_batch.py",
    "tests/test_stateful.py::test_lifecycle_keeps_invariants_and_never_corrupts_kv",
    "tests/test_engine_golden.py",
]

MUTANTS = {
    "batch: a radix decode step that opens a page taken as one inside the last page": (
        "backends/radix/backend.py",
        "                if total <= held:  # inside the last page: no page, nothing to evict",
        "                if total <= held + 1:  # inside the last page: no page, nothing to evict",
    ),
    "batch: a radix page-opening step counted twice": (
        "backends/radix/backend.py",
        "                        opened.reserved += 1\n",
        "                        opened.reserved += 2\n",
    ),
    "batch: a radix run of page-opening steps past the ready pages (an eviction skipped)": (
        "backends/radix/backend.py",
        "        p, end = self.page_size, min(len(records), start + limit)",
        "        p, end = self.page_size, len(records)",
    ),
    "batch: a hashchain step that fills a block taken in place (the block never cached)": (
        "backends/hashchain/backend.py",
        "            if in_place(req.request_id, total, min(total, req.num_tokens)):",
        "            if in_place(req.request_id, total, min(total, req.num_tokens) - 1):",
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
