"""The hashchain backend against the naive vLLM oracle: the same operations must give the same
hits, the same allocation outcomes and the same physical block ids, step by step. Block ids
expose the free-queue order, so reverse-order free, unhashed-first reuse and lazy eviction are
all checked here (a forward-order free, for one, changes the ids handed out next)."""

from __future__ import annotations

import random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefixcache import CacheConfig, Request, available_backends, make_cache
from tests.oracle_vllm import NaiveVllm
from tests.strategies import NAMESPACES

pytestmark = pytest.mark.skipif("hashchain" not in available_backends(), reason="hashchain not registered")
B = 4
PAGES = 10
VOCAB = 3


class HashchainMatchesOracle(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cache = make_cache("hashchain", CacheConfig(PAGES * B, B))
        self.oracle = NaiveVllm(PAGES, B)
        self.live: dict[str, tuple[Request, Request]] = {}  # id -> (ours, oracle's copy)
        self.corpus: list[tuple[int, ...]] = []
        self.n = 0

    def _pair(self, tokens: tuple[int, ...], ns: tuple) -> tuple[Request, Request]:
        self.n += 1
        return tuple(  # type: ignore[return-value]
            Request(f"r{self.n}", tokens, cache_salt=ns[0], lora_name=ns[1]) for _ in range(2)
        )

    def _allocate_both(self, ours: Request, theirs: Request, start: int, n: int) -> bool:
        """Room for n tokens after ``start`` in both (never past the pool); on success the
        model computes them and ours commits. Both must agree on success."""
        if -(-(start + n) // B) > PAGES - 1:
            return False
        ok = self.cache.allocate(ours, n)
        assert ok == self.oracle.allocate(theirs, n)
        if ok:
            for r in (ours, theirs):
                r.num_computed_tokens += n
            self.cache.commit(ours)
        return ok

    @rule(share=st.integers(0, 20), suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
          ns=st.sampled_from(NAMESPACES), chunk=st.integers(1, 40))
    def admit(self, share: int, suffix: list[int], ns: tuple, chunk: int) -> None:
        base = self.rng.choice(self.corpus) if self.corpus else ()
        tokens = base[:share] + tuple(suffix)
        self.corpus.append(tokens)
        ours, theirs = self._pair(tokens, ns)
        hit = self.cache.lookup(ours).tokens
        assert hit == self.oracle.lookup(theirs)
        if self._allocate_both(ours, theirs, hit, min(chunk, ours.num_tokens - hit)):
            self.live[ours.request_id] = (ours, theirs)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 12))
    def step(self, data: st.DataObject, chunk: int) -> None:
        ours, theirs = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if ours.num_computed_tokens == ours.num_tokens:
            tok = self.rng.randrange(VOCAB)
            ours.append_output_token_ids(tok)
            theirs.append_output_token_ids(tok)
        computed = ours.num_computed_tokens
        self._allocate_both(ours, theirs, computed, min(chunk, ours.num_tokens - computed))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ours, theirs = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.cache.release(ours)
        self.oracle.release(theirs)
        self.corpus.append(tuple(ours.all_token_ids))

    @invariant()
    def same_blocks(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        for ours, theirs in self.live.values():
            assert self.cache.page_table(ours) == self.oracle.tables[theirs.request_id]
            assert ours.num_computed_tokens == theirs.num_computed_tokens


TestHashchainMatchesOracle = HashchainMatchesOracle.TestCase


def test_oracle_itself_follows_the_article_walkthrough() -> None:
    """The oracle must agree with the article's block_size=4 example before it can judge."""
    oracle = NaiveVllm(16, 4)
    a = Request("A", list(range(16)))
    assert oracle.allocate(a, 16) and oracle.tables["A"] == [1, 2, 3, 4]
    oracle.release(a)
    assert oracle.free[-4:] == [4, 3, 2, 1]  # reversed: the chain's tail is evicted first
    b = Request("B", list(range(12)) + [20, 21, 22, 23])
    assert oracle.lookup(b) == 12
    assert oracle.allocate(b, 4) and oracle.tables["B"] == [1, 2, 3, 5]
