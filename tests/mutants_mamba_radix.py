"""Mutants of the radix backend's Mamba path (SGLang 0.5.23 no_buffer, Marconi options), in the
shape of tests/mutants.py: name -> (file, original text, mutated text), each original text
occurring exactly once, and the suites that must catch every one of them
(``HYPOTHESIS_PROFILE=ci``)."""

from __future__ import annotations

SUITES = [
    "tests/test_radix_mamba.py",
    "tests/test_radix_mamba_upstream.py",
    "tests/test_stateful_mamba_radix.py",
]

_TREE = "backends/radix/components/mamba.py"
_POOL = "backends/radix/mamba_pool.py"

MUTANTS: dict[str, tuple[str, str, str]] = {
    "mamba: a reset restarts the index version (a match from before it is trusted again)": (
        "backends/radix/radix_cache.py",
        "    def reset(self) -> None:\n        self.version += 1\n",
        "    def reset(self) -> None:\n        self.version = 1\n",
    ),
    "mamba: a reset builds the backend a new tree (its version starts over)": (
        "backends/radix/backend.py",
        "        self.pool = self._new_pools()\n        self.tree.reset()\n",
        "        self.pool = self._new_pools()\n"
        "        self.tree = self._new_tree(\"lru\", itertools.count().__next__, False)\n",
    ),
    # A hit ends at the deepest matched node, state or not: the recurrent state is off the
    # checkpoint (the match is not cut back to the deepest node holding a state).
    "mamba radix: state hit off the checkpoint": (
        _TREE,
        "        return lambda node: node.mamba is not None\n",
        "        return lambda node: True\n",
    ),
    # The Mamba lock no longer pins the locked node's state against Mamba eviction.
    "mamba radix: Mamba lock ignored by state eviction": (
        _TREE,
        "if node.id not in self.lru or node.mamba_lock:",
        "if node.id not in self.lru or node.mamba_lock > 1:",
    ),
    # The Mamba lock covers the path like the full lock: ancestors' states can no longer go.
    "mamba radix: Mamba lock over the whole path": (
        _TREE,
        "if node.id not in self.lru or node.mamba_lock:",
        "if node.id not in self.lru or node.lock_ref:",
    ),
    # A split leaves the upper part holding the lower part's state (not a tombstone).
    "mamba radix: split does not tombstone the upper part": (
        "backends/radix/radix_cache.py",
        "        new.lock_ref = child.lock_ref\n",
        "        new.lock_ref = child.lock_ref\n        new.mamba = child.mamba\n",
    ),
    # Full eviction takes the most recently used leaf.
    "mamba radix: full eviction MRU first": (
        "backends/radix/radix_cache.py",
        "                key, _, leaf = self._leaves[0]\n",
        "                key, _, leaf = self._leaves[-1]\n",
    ),
    # Mamba eviction walks its LRU from the new end.
    "mamba radix: state eviction MRU first": (
        _TREE,
        "        holders = list(self.lru.values())\n",
        "        holders = list(reversed(self.lru.values()))\n",
    ),
    # A match refreshes nothing in the Mamba LRU (SGLang: the used state goes to MRU).
    "mamba radix: match does not refresh the used state": (
        _TREE,
        "        if node.mamba is not None:\n            self.lru.move_to_end(node.id)\n",
        "        if False:\n            self.lru.move_to_end(node.id)\n",
    ),
    # No state copied at a prefill chunk end (SGLang's cache_unfinished_req stores one).
    "mamba radix: no state at chunk ends": (
        _TREE,
        "        if slot and not self._insert(req, live, computed, slot, insert):\n",
        "        if slot and not self._insert(req, live, computed, None, insert):\n",
    ),
    # The finish does not donate the request's state to the tree.
    "mamba radix: finish does not donate its state": (
        _TREE,
        "            if self._insert(req, live, computed, live.state, insert):",
        "            if self._insert(req, live, computed, None, insert):",
    ),
    # The state pool gets the ratio of the whole budget, not r / (1 + r).
    "mamba radix: pool sizes ignore the 1 + r split": (
        _POOL,
        "states = int((budget * ratio / (1 + ratio) - per_slot) // per_slot)",
        "states = int((budget * ratio - per_slot) // per_slot)",
    ),
    # Marconi checkpoints one token before the junction.
    "mamba radix: Marconi junction off by one": (
        _TREE,
        "            live.junction = full_hit  # a branch point",
        "            live.junction = full_hit - 1  # a branch point",
    ),
}
