"""Mutants of the batched engine step (issue 28): the batch path must leave exactly what one
allocation after another leaves, and the engine must give the runs recorded at c2d2b27."""

SUITES = [
    "tests/test_allocate_batch.py",
    "tests/test_stateful.py::test_lifecycle_keeps_invariants_and_never_corrupts_kv",
    "tests/test_engine_golden.py",
    "tests/test_engine.py::test_decode_stretches_change_no_record_and_no_cache_state",
    "tests/test_engine.py::test_deferred_decode_steps_change_nothing_with_a_host_tier",
    "tests/test_engine.py::test_deferred_decoders_past_the_budget_wait_as_one_by_one",
    "tests/test_engine.py::test_no_decode_step_is_deferred_while_the_cache_says_none_is_in_place",
    "tests/test_engine.py::test_num_tokens_now_is_the_length_stepping_one_by_one_gives",
    "tests/test_radix_pool.py",
    "tests/test_hashchain_block_pool.py",
]

MUTANTS = {
    "batch: a run of lazy blocks made anew though some were made before (a held block replaced)": (
        "backends/hashchain/free_queue.py",
        "        if out.count(None) == len(out):\n",
        "        if out.count(None):\n",
    ),
    "batch: a radix eviction's frees placed in call order at page size > 1 (each call's block goes first)": (
        "prefixcache/pool.py",
        "            self._put(np.concatenate(runs[::-1]))\n",
        "            self._put(arr)\n",
    ),
    "batch: a need_sort merge that appends the staged pages to the list unsorted": (
        "prefixcache/pool.py",
        '            merged.sort(kind="stable")\n',
        "",
    ),
    "batch: a free of two pages passes without the repeated-id check (only one page skips it)": (
        "prefixcache/pool.py",
        "        if arr.size == 1:\n            self._free_mark[arr] = 0\n",
        "        if arr.size <= 2:\n            self._free_mark[arr] = 0\n",
    ),
    "batch: a free refused for a repeated id leaves its pages flagged free": (
        "prefixcache/pool.py",
        "            self._free_mark[arr] = HELD  # as it was: every one was held\n",
        "            pass\n",
    ),
    "engine: a deferred decoder's length read as it was when deferred (a router sees it stale)": (
        "prefixcache/engine.py",
        "        return req.num_tokens if deferred is None else "
        "req.num_tokens + self.step_count - deferred[0]\n",
        "        return req.num_tokens\n",
    ),
    "batch: a radix in-page decode step taken in place while the pool must evict for it": (
        "backends/radix/backend.py",
        "        if not self.plain_decode or total_tokens > len(state.pages) * self.page_size or not self._calm():",  # noqa: E501
        "        if not self.plain_decode or total_tokens > len(state.pages) * self.page_size:",
    ),
    "batch: a radix decode step past the page boundary taken in place (no page, nothing evicted)": (
        "backends/radix/backend.py",
        "        if not self.plain_decode or total_tokens > len(state.pages) * self.page_size or not self._calm():",  # noqa: E501
        "        if not self.plain_decode or total_tokens > len(state.pages) * self.page_size + 1:",
    ),
    "batch: a radix page-opening step counted twice": (
        "backends/radix/backend.py",
        "                opened.reserved += 1\n",
        "                opened.reserved += 2\n",
    ),
    "batch: a radix run of page-opening steps that takes in a step inside its last page": (
        "backends/radix/backend.py",
        "or computed != len(state.pages) * p:",
        "or computed > len(state.pages) * p:",
    ),
    "engine: a deferred decoder taken up without its last step's token": (
        "prefixcache/engine.py",
        "        self._emit(req, steps)\n",
        "        self._emit(req, steps - 1)\n",
    ),
    "batch: a radix run of page-opening steps past the ready pages (an eviction skipped)": (
        "backends/radix/backend.py",
        "        end = min(len(records), start + limit)",
        "        end = len(records)",
    ),
    "batch: a hashchain step that fills a block taken in place (the block never cached)": (
        "backends/hashchain/backend.py",
        "        return coordinator.extends_in_place(req.request_id, total_tokens, "
        "min(total_tokens, req.num_tokens))",
        "        return coordinator.extends_in_place(req.request_id, total_tokens, "
        "min(total_tokens, req.num_tokens) - 1)",
    ),
    "batch: a decode batch's fit check skipped for a total past the whole pool": (
        "prefixcache/interface.py",
        "                if bound is None or total > bound or total > req.num_tokens:\n",
        "                if bound is None or total > req.num_tokens:\n",
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
        "            if rid in in_prefill or rid in deferred:",
        "            if rid in deferred:",
    ),
    "engine: a decode run that takes in a deferred decoder (its step counted twice)": (
        "prefixcache/engine.py",
        "            if rid in in_prefill or rid in deferred:",
        "            if rid in in_prefill:",
    ),
    "engine: deferred decoders served although the step's budget does not reach them all": (
        "prefixcache/engine.py",
        "                if end - i <= budget and self._serve_deferred_run(i, end):",
        "                if self._serve_deferred_run(i, end):",
    ),
    "engine: deferred decoders served while the cache is not in place (its host tier busy)": (
        "prefixcache/engine.py",
        "        return self.cache.decode_in_place_now()\n",
        "        return True\n",
    ),
    "engine: a run of deferred decoders served without taking the pages their steps open": (
        "prefixcache/engine.py",
        "        if not self._timed_batch(opening, self.cache.take_decode_pages, calm_after):\n",
        "        if False:\n",
    ),
    "batch: a page-1 run of deferred decoders taken though fewer pages are ready (an eviction skipped)": (
        "backends/radix/backend.py",
        "        if len(records) + calm_after > self.pool.num_ready or not self._calm():",
        "        if not self._calm():",
    ),
    "batch: a page-1 run of deferred decoders left marked not decoding (its next commit checkpoints)": (
        "backends/radix/backend.py",
        "        self._open_pages(records, reserve=False)  # (none merges: they fit in the ready pages)\n",
        "        self._open_pages(records, reserve=False)\n        for live in records:\n"
        "            live.state.decoding = False\n",
    ),
    "engine: a deferred run's openers take the last ready page though an in-place step follows": (
        "prefixcache/engine.py",
        "        calm_after = opening[-1] is not self.running[end - 1]\n",
        "        calm_after = False\n",
    ),
    "batch: a radix take of opening steps that leaves no page for the in-place step after": (
        "backends/radix/backend.py",
        "        if len(records) + calm_after > self.pool.num_ready or not self._calm():",
        "        if len(records) > self.pool.num_ready or not self._calm():",
    ),
    "engine: a deferred decoder that opened a page due again a step late (an opening skipped)": (
        "prefixcache/engine.py",
        "                wake = min(now + page, self._finishing_step(req, first))",
        "                wake = min(now + page + 1, self._finishing_step(req, first))",
    ),
    "engine: a deferred decoder due at its last step kept deferred as if it opened a page": (
        "prefixcache/engine.py",
        "        return self._defer_takes_pages and self.step_count < self._finishing_step(req, first)\n",
        "        return self._defer_takes_pages and self.step_count <= self._finishing_step(req, first)\n",
    ),
    "batch: a page-1 run of the no-cache baseline taken though fewer pages are ready": (
        "backends/none.py",
        "        if len(records) > self.pool.num_ready:",
        "        if len(records) > self.pool.num_free:",
    ),
    "engine: deferred decoders past a step's spent budget counted as served": (
        "prefixcache/engine.py",
        "        if deferred and i < len(running):  # the budget ran out before these: no step for them",
        "        if False:",
    ),
    "engine: a decoder deferred one step past its room (a page opening skipped)": (
        "prefixcache/engine.py",
        "        return last if self._every_step_opens else min(self.cache.decode_room(req), last)\n",
        "        return last if self._every_step_opens else min(self.cache.decode_room(req) + 1, last)\n",
    ),
    "engine: a decoder deferred through the step that finishes it": (
        "prefixcache/engine.py",
        "        return first + req.max_new_tokens - req.num_output_tokens - 1\n",
        "        return first + req.max_new_tokens - req.num_output_tokens\n",
    ),
    "engine: a preempted deferred decoder released without its deferred steps": (
        "prefixcache/engine.py",
        "                    self._take_up(victim)  # (after req: it has not decoded this step)",
        "                    self._deferred.pop(victim.request_id)",
    ),
    # Moved here from tests/mutants.py: the default suites caught it only through an assertion
    # of the page-opening run, which now stops at the ready pages; the engine goldens catch the
    # decode stretches and in-place steps it lets through with no page free.
    "radix: a decode stretch while the pool must evict for it": (
        "backends/radix/backend.py",
        "        return self.pool.num_free > 0 and not self.pool.would_merge(0, 1)\n",
        "        return not self.pool.would_merge(0, 1)\n",
    ),
    "radix: an in-page decode step counted in place while no page is free": (
        "backends/radix/backend.py",
        "        return self._calm()\n",
        "        return not self.pool.would_merge(0, 1)\n",
    ),
}
