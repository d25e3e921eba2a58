"""The radix tree against a brute-force model: a dict from every cached whole-page prefix to the
slots of its last page. Sizes, matches, insert results, locks and eviction bounds must agree."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from prefixcache.backends.radix import RadixCache, RadixKey, TreeNode

from prefixcache import Request
from tests.helpers import checked

# Short keys over a tiny alphabet make shared prefixes, splits and divergences common.
KEYS = st.lists(st.integers(0, 2), min_size=0, max_size=12)


class TreeAgainstModel(RuleBasedStateMachine):
    page_size = 1
    locks = Bundle("locks")

    def __init__(self) -> None:
        super().__init__()
        self.freed: list[int] = []
        clock = itertools.count().__next__
        free = self.freed.extend
        self.tree = RadixCache(
            self.page_size, free_slots=lambda runs: [free(s.tolist()) for s in runs], clock=clock
        )
        self.model: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.held: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.next_slot = 1

    def aligned(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[: len(tokens) // self.page_size * self.page_size])

    def cached_len(self, key: tuple[int, ...]) -> int:
        n = 0
        while n < len(key) and key[: n + self.page_size] in self.model:
            n += self.page_size
        return n

    @rule(tokens=KEYS, priority=st.integers(0, 3))
    def insert(self, tokens: list[int], priority: int) -> None:
        key = self.aligned(tokens)
        slots = list(range(self.next_slot, self.next_slot + len(tokens)))
        self.next_slot += len(tokens)
        expected = self.cached_len(key)
        assert self.tree.insert(RadixKey(tokens), np.array(slots, dtype=np.int64), priority) == expected
        p = self.page_size
        for j in range(expected + p, len(key) + 1, p):
            self.model[key[:j]] = tuple(slots[j - p : j])

    @rule(tokens=KEYS)
    def match(self, tokens: list[int]) -> None:
        key = self.aligned(tokens)
        m = self.tree.match_prefix(RadixKey(tokens))
        assert m.length == self.cached_len(key)
        p = self.page_size
        assert m.indices.tolist() == [s for j in range(p, m.length + 1, p) for s in self.model[key[:j]]]

    @rule(target=locks, tokens=KEYS)
    def lock(self, tokens: list[int]) -> tuple[TreeNode, tuple[int, ...]]:
        m = self.tree.match_prefix(RadixKey(tokens))
        self.tree.inc_lock_ref(m.last_node)
        path = self.aligned(tokens)[: m.length]
        self.held.append((m.last_node, path))
        return m.last_node, path

    @rule(entry=locks)
    def unlock(self, entry: tuple[TreeNode, tuple[int, ...]]) -> None:
        if entry in self.held:
            self.held.remove(entry)
            self.tree.dec_lock_ref(entry[0])
        else:  # already unlocked: must raise, not drift
            node = entry[0]
            if node.lock_ref == 0 and node is not self.tree.root_node:
                try:
                    self.tree.dec_lock_ref(node)
                except RuntimeError:
                    return
                raise AssertionError("unbalanced dec_lock_ref did not raise")

    @rule(num_tokens=st.integers(0, 20))
    def evict(self, num_tokens: int) -> None:
        evictable = self.tree.evictable_size()
        self.freed.clear()
        got = self.tree.evict(num_tokens)
        assert got == len(self.freed)
        assert got >= min(num_tokens, evictable) and got <= evictable
        p, remaining = self.page_size, {}
        for node in self.tree.iter_nodes():
            path, start = self.path_of(node), len(self.path_of(node)) - len(node.key)
            for j in range(p, len(node.key) + 1, p):
                remaining[path[: start + j]] = tuple(node.value[j - p : j].tolist())
        assert all(self.model.get(k) == v for k, v in remaining.items()), "eviction changed a value"
        assert (len(self.model) - len(remaining)) * p == got
        gone = {s for k, v in self.model.items() if k not in remaining for s in v}
        assert gone == set(self.freed)
        self.model = remaining

    def path_of(self, node: TreeNode) -> tuple[int, ...]:
        parts = []
        while node is not self.tree.root_node:
            parts.append(node.key.tolist())
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    @invariant()
    def agrees_with_model(self) -> None:
        self.tree.check()
        p = self.page_size
        assert self.tree.total_size() == p * len(self.model)
        protected = {path[:j] for _, path in self.held for j in range(p, len(path) + 1, p)}
        assert self.tree.protected_size() == p * len(protected)
        assert self.tree.evictable_size() == p * (len(self.model) - len(protected))
        assert protected <= set(self.model), "a locked prefix was evicted"


class PagedTreeAgainstModel(TreeAgainstModel):
    page_size = 2


TestTreeAgainstModel = TreeAgainstModel.TestCase
TestPagedTreeAgainstModel = PagedTreeAgainstModel.TestCase


class RequestsMachine(RuleBasedStateMachine):
    """Random admit / chunked commit / decode / release through the adapter, invariants checked
    after every call (``checked``): pages never leak, duplicates never freed while pointed at."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = checked("radix", 48, 2)
        self.live: list[Request] = []
        self.count = 0

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14), chunk=st.integers(1, 8))
    def admit(self, prompt: list[int], chunk: int) -> None:
        self.count += 1
        r = Request(f"r{self.count}", prompt)
        hit = self.cache.lookup(r).tokens
        if self.cache.allocate(r, min(chunk, r.num_tokens - hit)):
            self.live.append(r)

    @rule(i=st.integers(0, 7), n=st.integers(1, 6))
    def compute(self, i: int, n: int) -> None:
        if not self.live:
            return
        r = self.live[i % len(self.live)]
        reserved = self.cache.reserved_tokens(r)
        if r.num_computed_tokens < reserved:
            r.num_computed_tokens = min(reserved, r.num_computed_tokens + n)
            self.cache.commit(r)
        elif r.num_computed_tokens == r.num_tokens:
            r.append_output_token_ids(n % 3)
            self.cache.allocate(r, 1)
        else:
            self.cache.allocate(r, min(n, r.num_tokens - r.num_computed_tokens))

    @rule(i=st.integers(0, 7))
    def release(self, i: int) -> None:
        if self.live:
            self.cache.release(self.live.pop(i % len(self.live)))

    @rule(n=st.integers(0, 10))
    def evict(self, n: int) -> None:
        self.cache.evict(n)


TestRequestsMachine = RequestsMachine.TestCase
