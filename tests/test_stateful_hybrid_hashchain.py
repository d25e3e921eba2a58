"""Lifecycle hunting for the hashchain backend over hybrid layouts, through ``kv_groups()`` and
``page_tables()`` (what the model reads), with one shadow KV per group.

A group's layers keep their own KV, so each group has its own ShadowKV (tests/test_stateful.py):
for every slot of that group's page ids, which token prefix's KV was written there. After every
step, and at every hit (fresh or from a match taken many rules earlier):

* ``check_invariants()`` holds;
* every position a layer of the group still reads holds the request's own KV: full attention
  all computed positions, a sliding window of W the last W - 1 (the next token reads them);
  a page wholly before that may read 0 (freed), a page in the window never does, and since a
  page still in the window can be reused by nobody else, its KV is never overwritten;
* a Mamba group: the block of the latest state (cdiv(computed, page) - 1) holds the state of
  exactly the request's computed prefix (a hit: of the hit prefix).

Layouts: gemma3-like shape (5 SW + 1 full) and gpt-oss-like shape (SW + full) with small
windows, mixed windows, and Mamba + full + SW (block raised to 8); retention None (dense),
0 (vLLM's engine default) and 8. With Mamba, chunks end on block boundaries (or the prompt's
end), as vLLM's scheduler ends them in "align" mode: otherwise a state lands in a block that
is later hashed as the state at its boundary.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.interface import KVGroup
from tests.stateful_admission import AdmissionRules
from tests.test_stateful import ShadowKV

VOCAB = 3
B = 4
LAYOUTS = {
    "gemma3_small": [("sliding_window", 9)] * 5 + [("full",)],
    "gpt_oss_small": [("sliding_window", 6), ("full",)],
    "mixed_windows": [("sliding_window", 5), ("full",), ("sliding_window", 13), ("full",)],
    "mamba_small": [("mamba", 8), ("full",), ("sliding_window", 12), ("mamba", 8)],
}
RETENTIONS = (None, 0, 8)
STEPS: dict[str, int] = {}
HITS: dict[str, int] = {}  # admissions that hit (the hit checks are not vacuous)
NULLED: dict[str, int] = {}  # checks of a live table holding a page 0 (windows moved past pages)
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
# thorough: 12 machines x 300 examples x 50 steps = 180,000 steps; default: ~15 s in all.
# Derandomized outside "thorough": the counters below (hits, windows moved) are then stable.
MACHINE_SETTINGS = settings(
    max_examples=300 if THOROUGH else 30, stateful_step_count=50 if THOROUGH else 30, derandomize=not THOROUGH
)


def read_positions(group: KVGroup, num_computed: int) -> range:
    """Positions a layer of this group reads for the next token."""
    if group.kind == "sliding_window":
        assert group.window is not None
        return range(max(0, num_computed - (group.window - 1)), num_computed)
    return range(num_computed)


class HybridLifecycle(AdmissionRules):
    layout: list = []
    retention: int | None = 0
    capacity_tokens = 28  # per layer: small, so requests evict each other

    waiting = Bundle("waiting")
    matched = Bundle("matched")

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.mamba = any(layer[0] == "mamba" for layer in self.layout)
        capacity = 2 * self.capacity_tokens if self.mamba else self.capacity_tokens  # 8-token pages
        config = CacheConfig(capacity, B, layout=self.layout)
        self.cache = make_cache("hashchain", config, prefix_cache_retention_interval=self.retention)
        self.groups = self.cache.kv_groups()
        assert sorted(i for g in self.groups for i in g.layers) == list(range(len(self.layout)))
        self.shadows = [ShadowKV(self.cache.page_size) for _ in self.groups]
        self.live_reqs: dict[str, Request] = {}
        self.corpus: list[tuple[int, ...]] = []
        self.counter = 0
        self.usable = self.groups[0].num_pages - 1
        self.page = self.cache.page_size  # B, or raised to hold a Mamba state

    # ------------------------------------------------------------ shadow KV per group
    def _write(self, req: Request, start: int, stop: int) -> None:
        p = self.page
        for group, shadow, table in zip(self.groups, self.shadows, self.cache.page_tables(req), strict=True):
            if group.kind == "mamba":  # the state after token stop - 1, in its block
                block = table[-(-stop // p) - 1]
                assert block != 0, f"{req.request_id}: writes its state into page 0"
                shadow.slots[block] = shadow.content(req, stop - 1)
                continue
            for pos in range(start, stop):
                assert table[pos // p] != 0, f"{req.request_id}: writes position {pos} into page 0"
                shadow.slots[shadow.slot(table, pos)] = shadow.content(req, pos)

    def _check(self, req: Request, num_computed: int, what: str) -> None:
        tables = self.cache.page_tables(req)
        assert len(tables) == len(self.groups)
        p = self.page
        for g, (group, shadow, table) in enumerate(zip(self.groups, self.shadows, tables, strict=True)):
            if group.kind == "mamba":
                if num_computed:
                    block = table[-(-num_computed // p) - 1]
                    assert block != 0, (
                        f"{what}: {req.request_id} group {g} (mamba) reads its state from page 0"
                    )
                    got = shadow.slots.get(block)
                    assert got == shadow.content(req, num_computed - 1), (
                        f"{what}: {req.request_id} group {g} (mamba) reads the state of {got}"
                    )
                continue
            for pos in read_positions(group, num_computed):
                page = table[pos // p]
                assert page != 0, f"{what}: {req.request_id} group {g} ({group.kind}) reads page 0 at {pos}"
                got = shadow.slots.get(shadow.slot(table, pos))
                assert got == shadow.content(req, pos), (
                    f"{what}: {req.request_id} group {g} ({group.kind}) position {pos} reads KV of {got}"
                )

    def _compute(self, req: Request, n: int) -> None:
        self._write(req, req.num_computed_tokens, req.num_computed_tokens + n)
        req.num_computed_tokens += n
        self.cache.commit(req)

    def _chunk(self, req: Request, start: int, want: int) -> int:
        """Tokens to compute from ``start``: ``want``, capped at the request's end; with Mamba
        also ended on a block boundary (vLLM's align-mode scheduler)."""
        end = min(start + want, req.num_tokens)
        if self.mamba and end < req.num_tokens and end % self.page:
            end = max(end // self.page * self.page, min(req.num_tokens, (start // self.page + 1) * self.page))
        return end - start

    def _fits(self, total: int) -> bool:
        return self.cache._min_pages_to_fit(total) <= self.usable

    def _snapshot(self) -> tuple:
        c = self.cache
        return (c.usage(), {r.request_id: str(c.page_tables(r)) for r in c.live_requests})

    # ------------------------------------------------------------ rules
    @rule(
        target=waiting,
        share=st.integers(0, 24),
        suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    )
    def new_request(self, share: int, suffix: list[int]) -> Request:
        base = self.rng.choice(self.corpus) if self.corpus else ()
        tokens = base[:share] + tuple(suffix)
        self.corpus.append(tokens)
        self.counter += 1
        return Request(f"r{self.counter}", tokens)

    def _admit(self, req: Request, match: object, chunk: int, what: str):  # type: ignore[no-untyped-def]
        current = self.cache.revalidate(match)  # type: ignore[arg-type]
        assert current.tokens == self.cache.lookup(req).tokens, (
            "revalidated match differs from a fresh lookup"
        )
        n = self._chunk(req, current.tokens, chunk)
        if not self._fits(current.tokens + n) or not self._fits(req.num_tokens):
            return multiple()  # can never fit
        before = self._snapshot()
        if not self.cache.allocate(req, n, current):  # type: ignore[arg-type]
            assert self._snapshot() == before, "a failed allocate changed the cache"
            return multiple(req)
        assert req.num_computed_tokens == current.tokens
        if current.tokens:
            HITS[self.name] = HITS.get(self.name, 0) + 1
        self._check(req, current.tokens, what)
        self._compute(req, n)
        self.live_reqs[req.request_id] = req
        return multiple()

    @precondition(lambda self: self.live_reqs)
    @rule(data=st.data(), chunk=st.integers(1, 12))
    def step(self, data: st.DataObject, chunk: int) -> None:
        req = self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs)))]
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= 40:
                return
            req.append_output_token_ids(self.rng.randrange(VOCAB))
            chunk = 1
        n = self._chunk(req, req.num_computed_tokens, chunk)
        if not self._fits(req.num_computed_tokens + n):
            return
        before = self._snapshot()
        if self.cache.allocate(req, n):
            self._compute(req, n)
        else:
            assert self._snapshot() == before, "a failed extend changed the cache"

    @precondition(lambda self: self.live_reqs)
    @rule(target=waiting, data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool):  # type: ignore[no-untyped-def]
        req = self.live_reqs.pop(data.draw(st.sampled_from(sorted(self.live_reqs))))
        self.cache.release(req)
        self.corpus.append(tuple(req.all_token_ids))
        if not preempt:
            return multiple()
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        return multiple(req)

    @rule(num_tokens=st.integers(0, 32))
    def evict(self, num_tokens: int) -> None:
        in_use = self.cache.usage().in_use
        assert self.cache.evict(num_tokens) >= 0
        assert self.cache.usage().in_use == in_use, "evict touched pinned pages"

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        STEPS[self.name] = STEPS.get(self.name, 0) + 1
        self.cache.check_invariants()
        for req in self.live_reqs.values():
            self._check(req, req.num_computed_tokens, "live request")
            if any(0 in table for table in self.cache.page_tables(req)):
                NULLED[self.name] = NULLED.get(self.name, 0) + 1

    name = "hybrid"


CASES = [(layout, retention) for layout in LAYOUTS for retention in RETENTIONS]


@pytest.mark.parametrize(("layout", "retention"), CASES)
def test_hybrid_lifecycle_hands_back_own_kv_in_every_group(layout: str, retention: int | None) -> None:
    name = f"{layout}_{retention}"
    attrs = {"layout": LAYOUTS[layout], "retention": retention, "name": name}
    machine = type(f"HybridLifecycle_{name}", (HybridLifecycle,), attrs)
    for counter in (STEPS, HITS, NULLED):
        counter.pop(name, None)
    MACHINE_SETTINGS(machine).TestCase().runTest()
    assert STEPS.get(name, 0) > 0
    assert HITS.get(name, 0) > 0, "no admission hit: the hit checks proved nothing"
    assert NULLED.get(name, 0) > 0, "no window ever moved past a page: the window checks proved nothing"
    print(f"stateful hybrid: {name} steps={STEPS[name]} hits={HITS[name]} nulled={NULLED[name]}")
