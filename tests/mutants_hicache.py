"""Mutants of the radix backend's HiCache host tier (same shape as tests/mutants.py): each breaks
one 0.5.23 rule; the suites in SUITES must fail under it (checked by hand, in a copy of the repo)."""

from __future__ import annotations

SUITES = [
    "tests/test_radix_hicache.py",
    "tests/test_radix_hicache_upstream.py",
    "tests/test_stateful_hicache.py",
    "tests/test_radix_hicache_storage.py",
]

# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "hicache: host eviction takes a node still on device": (
        "backends/radix/hicache_tree.py",
        "            and node.evicted\n            and node.backuped\n",
        "            and node.backuped\n",
    ),
    "hicache: load_back threshold off by one (a tail of exactly 10 is recomputed)": (
        "backends/radix/hicache_backend.py",
        "loads = host if host >= max(1, self.load_back_threshold) else 0",
        "loads = host if host > max(1, self.load_back_threshold) else 0",
    ),
    "hicache: selective counts every insert (not once per request)": (
        "backends/radix/radix_cache.py",
        "                if pos > hit_from:\n                    self._count_hit(child)\n",
        "                self._count_hit(child)\n",
    ),
    "hicache: a backed-up node is deleted at device eviction instead of kept host-only": (
        "backends/radix/hicache_tree.py",
        "        elif leaf.backuped:\n            self._demote(leaf)",
        "        elif False:\n            self._demote(leaf)",
    ),
    "hicache: the write-through lock is not held until the ack": (
        "backends/radix/hicache_tree.py",
        "                self.inc_lock_ref(target)\n                ack = self._next_ack",
        "                ack = self._next_ack",
    ),
    "hicache: write_back does not reclaim device-resident host copies first": (
        "backends/radix/hicache_tree.py",
        "        if self.is_write_back:\n            freed = self._reclaim_full_host_duplicates(num_tokens)",
        "        if False:\n            freed = self._reclaim_full_host_duplicates(num_tokens)",
    ),
    "hicache: an insert through a host-only node frees the request's pages it adopted": (
        "backends/radix/hicache_backend.py",
        "        return mine[mine != tree_pages]",
        "        return mine",
    ),
    "hicache: the load skips device eviction and takes only free pages": (
        "backends/radix/hicache_backend.py",
        "        if load_pages + need > self.pool.num_free + tree.evictable_size() // p:",
        "        if load_pages + need > self.pool.num_free:",
    ),
    "hicache: selective threshold 1 (write_through's)": (
        "backends/radix/hicache_tree.py",
        'self.write_through_threshold = 1 if write_policy == "write_through" else 2',
        "self.write_through_threshold = 1",
    ),
    "hicache: write_back counts hits (and so backs up at insert)": (
        "backends/radix/hicache_tree.py",
        "        if node.evicted or self.is_write_back:\n            return False",
        "        if node.evicted:\n            return False",
    ),
    "hicache: a load's lock ends at admission, not at the next step's ack": (
        "backends/radix/hicache_backend.py",
        "            tree.inc_lock_ref(m.best_node)  # the load's (ongoing_load_back), with the host pin\n"
        "            tree.ongoing_loads.append(m.best_node)\n",
        "            m.best_node.host_lock_ref -= 1\n",
    ),
    "hicache: a match stops at the first host-only node": (
        "backends/radix/radix_cache.py",
        "            node, pos = child, pos + n\n            if child.value is not None:",
        "            if child.value is None:\n                break\n"
        "            node, pos = child, pos + n\n            if child.value is not None:",
    ),
    "hicache: host pool sized without the padding page": (
        "backends/radix/hicache_pool.py",
        "    tokens = (size // page_size + 1) * page_size",
        "    tokens = size // page_size * page_size",
    ),
    # L3 storage and prefetch (hicache_storage.py, SGLang 0.5.23 as read)
    "hicache L3: prefetch threshold off by one (a hit of exactly 256 is revoked)": (
        "backends/radix/hicache_storage.py",
        "        if op.hit < self.threshold:",
        "        if op.hit <= self.threshold:",
    ),
    "hicache L3: wait_complete admits before every page arrived": (
        "backends/radix/hicache_storage.py",
        '        if self.policy == "wait_complete":\n            return False',
        '        if self.policy == "wait_complete":\n            return op.completed > 0',
    ),
    "hicache L3: best_effort waits instead of stopping at admission": (
        "backends/radix/hicache_storage.py",
        '        if self.policy == "best_effort":\n            return True',
        '        if self.policy == "best_effort":\n            return False',
    ),
    "hicache L3: prefetch buffers are not counted in the host tier's usage": (
        "backends/radix/hicache_tier.py",
        "            buffers = len(self.storage.buffer_pages())",
        "            buffers = 0",
    ),
    "hicache L3: a prefetch starts from an unbacked anchor": (
        "backends/radix/hicache_storage.py",
        "        if anchor is not self.tree.root_node and not anchor.backuped:",
        "        if False:",
    ),
    "hicache L3: no cap on prefetch tokens in flight": (
        "backends/radix/hicache_storage.py",
        "        if self.occupied >= self.capacity_limit:",
        "        if False:",
    ),
    "hicache L3: storage writes do not pin the host copy until their ack": (
        "backends/radix/hicache_storage.py",
        "        node.host_lock_ref += 1\n        self.backups.append(node)",
        "        self.backups.append(node)",
    ),
    "host index: an entry stamped since it was filed keeps its old place": (
        "backends/radix/hicache_tree.py",
        "            elif node.last_access_time != key:",
        "            elif False:",
    ),
    "host index: the upper half of a split host-only node never filed": (
        "backends/radix/hicache_tree.py",
        "            if new.value is None:\n                self.index_host_only(new)\n",
        "",
    ),
    "host index: a host-only leaf fetched from storage never filed": (
        "backends/radix/hicache_storage.py",
        "        tree.index_host_only(leaf)\n",
        "",
    ),
    "hicache: an insert leaves the walked nodes' tails unread (tlru sees 0 after each)": (
        "backends/radix/radix_cache.py",
        "                self._count_hit(child)\n            child.tail_tokens = end - pos\n",
        "                self._count_hit(child)\n",
    ),
    "hicache: a match leaves the host-only tail it walked unstamped": (
        "backends/radix/radix_cache.py",
        "        self._stamp_path(best if self.component is not None else node, now)\n",
        "        self._stamp_path(best, now)\n",
    ),
}
