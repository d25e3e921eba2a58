"""Mutants of the radix backend's hybrid SWA side (same shape as tests/mutants.py): each breaks
one behaviour; the suites in SUITES must fail under it (checked by hand, in a copy of the repo)."""

from __future__ import annotations

SUITES = [
    "tests/test_radix_swa_upstream.py",
    "tests/test_radix_swa.py",
    "tests/test_stateful_hybrid_radix.py",
]

# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "radix swa: tombstone treated as live (match does not reset at a tombstone)": (
        "backends/radix/swa_tree.py",
        "            if child.swa is None:\n                since = 0\n",
        "            if False:\n                since = 0\n",
    ),
    "radix swa: an SWA lock does not move the node out of the evictable size": (
        "backends/radix/swa_tree.py",
        "            if cur.swa_lock == 0 and cur.swa is not None:\n"
        "                self.swa_evictable -= len(cur.swa)",
        "            if False:\n                self.swa_evictable -= len(cur.swa)",
    ),
    "radix swa: the SWA lock stops one token short of the window": (
        "backends/radix/swa_tree.py",
        "        while cur is not self.root and covered < self.window:",
        "        while cur is not self.root and covered < self.window - 1:",
    ),
    "radix swa: a running request frees SWA KV still inside its window": (
        "backends/radix/swa_backend.py",
        "        threshold = pre_len - -(-max(self.window, p) // p) * p",
        "        threshold = pre_len - self.window + 2",
    ),
    "radix swa: insert ignores the inserter's SWA frontier (no tombstone for freed SWA)": (
        "backends/radix/swa_tree.py",
        "        live_start = max(start, evicted)\n",
        "        live_start = start\n",
    ),
    "radix swa: SWA eviction takes the MRU end": (
        "backends/radix/swa_node.py",
        "        return self.prev_unlocked(self.tail)",
        "        x = self.head.lru_next\n        return None if x is self.tail else x",
    ),
}
