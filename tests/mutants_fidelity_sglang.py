"""Mutants of the radix backend's fidelity to SGLang 0.5.23's own UnifiedRadixCache (issue 33),
in the shape of tests/mutants.py: name -> (file, original text, mutated text), each original
text occurring exactly once, and the suites that must catch every one of them
(``HYPOTHESIS_PROFILE=ci``)."""

from __future__ import annotations

SUITES = [
    "tests/test_radix_fidelity_cases.py",
    "tests/test_radix_swa_upstream.py",
    "tests/test_stateful_hybrid_radix.py",
    "tests/test_stateful_mamba_radix.py",
]

MUTANTS: dict[str, tuple[str, str, str]] = {
    # Case 5: a batch's checkpoints and the releases after it free call by call (each call's
    # pages prepended on their own at page > 1) instead of as one free group.
    "sglang fidelity: SWA frees of one group returned call by call": (
        "backends/radix/backend.py",
        "        self.pool.group_begin()\n        for live in grouped:\n",
        "        for live in grouped:\n",
    ),
    # Case 6: check_invariants wants a Mamba lock on the root, which SGLang never locks.
    "sglang fidelity: Mamba check wants the root locked": (
        "backends/radix/components/mamba.py",
        "            locked = node is self.tree.root_node or node.mamba_lock > 0\n",
        "            locked = node.mamba_lock > 0\n",
    ),
    # A split's prefix node created fresh (RadixCache), not as old as its suffix
    # (UnifiedRadixCache._split_node): fifo and filo then evict in another order. The dense
    # tree and HiCache share this split; test_radix_fidelity_cases.py has a case of each.
    "sglang fidelity: a split prefix takes a fresh creation time (dense and HiCache)": (
        "backends/radix/radix_cache.py",
        "        new.creation_time = child.creation_time\n",
        "",
    ),
}
