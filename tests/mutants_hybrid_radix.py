"""Mutants of the radix backend's hybrid SWA side (same shape as tests/mutants.py): each breaks
one behaviour; the suites in SUITES must fail under it (checked by hand, in a copy of the repo)."""

from __future__ import annotations

SUITES = [
    "tests/test_radix_swa_upstream.py",
    "tests/test_radix_swa.py",
    "tests/test_stateful_hybrid_radix.py",
    "tests/test_radix_eagle.py",
]

# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "radix swa: tombstone treated as live (match does not reset at a tombstone)": (
        "backends/radix/components/swa.py",
        "            if node.swa is None:\n                since = 0\n",
        "            if False:\n                since = 0\n",
    ),
    "radix swa: an SWA lock does not move the node out of the evictable size": (
        "backends/radix/components/swa.py",
        "            if cur.swa_lock == 0 and cur.swa is not None:\n"
        "                self.evictable -= len(cur.swa)",
        "            if False:\n                self.evictable -= len(cur.swa)",
    ),
    "radix swa: the SWA lock stops one token short of the window": (
        "backends/radix/components/swa.py",
        "        while cur is not self.tree.root_node and covered < self.window:",
        "        while cur is not self.tree.root_node and covered < self.window - 1:",
    ),
    "radix swa: a running request frees SWA KV still inside its window": (
        "backends/radix/components/swa.py",
        "        threshold = pre_len - -(-max(self.window, p) // p) * p",
        "        threshold = pre_len - self.window + 2",
    ),
    "radix swa: insert ignores the inserter's SWA frontier (no tombstone for freed SWA)": (
        "backends/radix/components/swa.py",
        "        live_start = max(start, evicted)\n",
        "        live_start = start\n",
    ),
    "radix swa: SWA eviction takes the MRU end": (
        "backends/radix/components/swa.py",
        "        return self.prev_unlocked(self.tail)",
        "        x = self.head.lru_next\n        return None if x is self.tail else x",
    ),
    # EAGLE bigram keys (SGLang 0.5.23 RadixKey(is_bigram=True)); caught by the EAGLE fixtures
    # (sglang_eagle/, sglang_hybrid_*eagle*) and tests/test_radix_eagle.py
    "radix eagle: a bigram match counts raw tokens (off by one)": (
        "backends/radix/key.py",
        "            lo = max(0, lo - 1)\n",
        "            lo = max(0, lo)\n",
    ),
    "radix eagle: a bigram slice drops the shared boundary token": (
        "backends/radix/key.py",
        "        raw = self.token_ids[start : stop + 1] if stop > start else self.token_ids[:0]",
        "        raw = self.token_ids[start:stop] if stop > start else self.token_ids[:0]",
    ),
    "radix eagle: children filed by their first raw tokens, not their first bigrams": (
        "backends/radix/key.py",
        "            plain: ChildKey = tuple(ids[: page_size + 1].tolist())",
        "            plain: ChildKey = tuple(ids[:page_size].tolist())",
    ),
    "radix eagle: the dense tree is built with plain keys": (
        "backends/radix/backend.py",
        "            is_eagle=self.is_eagle,\n",
        "            is_eagle=False,\n",
    ),
    "radix eagle: the prompt split counts raw prompt tokens, not bigrams": (
        "backends/radix/backend.py",
        "        prompt = len(raw[: req.num_prompt_tokens].maybe_to_bigram_view(self.is_eagle)[0]) // p * p",
        "        prompt = len(raw[: req.num_prompt_tokens]) // p * p",
    ),
    "radix eagle: the SWA branch point is inserted one raw token short": (
        "backends/radix/components/swa.py",
        "        cache_len = branching + eagle if branch else computed  # prepare_for_caching_req",
        "        cache_len = branching if branch else computed  # prepare_for_caching_req",
    ),
    "radix eagle: the SWA checkpoint's window frontier is measured on raw tokens": (
        "backends/radix/components/swa.py",
        "            self.free_out_of_window_slots(live, len(key) - 1)",
        "            self.free_out_of_window_slots(live, cache_len - 1)",
    ),
    "radix eagle: after the SWA branch, the forward key is measured on raw tokens": (
        "backends/radix/components/swa.py",
        "                self.free_out_of_window_slots(live, computed - eagle - 1)",
        "                self.free_out_of_window_slots(live, computed - 1)",
    ),
    "radix eagle: the SWA tree is built with plain keys": (
        "backends/radix/backend.py",
        "            is_eagle=self.is_eagle,\n",
        "            is_eagle=self.is_eagle and component is None,\n",
    ),
    "radix eagle: the Mamba cache silently accepts is_eagle": (
        "backends/radix/components/mamba.py",
        "        if is_eagle:\n            raise ValueError(",
        "        if False:\n            raise ValueError(",
    ),
    # SGLang stamps a match's path up to its hit's end only; nodes walked past it keep theirs.
    "radix swa: a match stamps the nodes walked past the window rule's hit": (
        "backends/radix/radix_cache.py",
        "        self._stamp_path(best if self.component is not None else node, now)\n",
        "        self._stamp_path(node, now)\n",
    ),
}
