"""The radix backend over hybrid full + sliding-window layouts, hunted through the common
interface with a shadow KV model keyed by (pool, slot).

Requests interleave lookup / allocate (failures included) / prefill chunks / decode past the
window / release / preemption / full and SWA eviction / reset. The KV of position ``pos`` of a
request is written into its full slot and its SWA slot (``kv_groups()`` / ``page_tables()``).
After every step:

* ``check_invariants()`` holds (both pools: free + evictable + in use == usable);
* every live request reads its own KV in every position a layer still reads: the full group
  all computed positions, the sliding-window group the last ``window - 1`` (a real SWA page,
  never 0 there). An SWA slot out of the window may be freed; one in the window is never reused;
* every hit, also of a match taken many rules before the allocate that consumes it, hands back
  exactly the request's own prefix in both groups.

Default profile: a few hundred steps per machine. ``HYPOTHESIS_PROFILE=thorough``: 2000 examples
x 100 steps for each of the four machines (>= 10^5 steps in total).
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

from prefixcache import CacheConfig, PrefixCache, Request, make_cache
from tests.stateful_admission import AdmissionRules

VOCAB = 3
STEPS: dict[str, int] = {}  # invariant checks run, per machine
SLID: dict[str, int] = {}  # live page tables seen with freed (0) SWA pages, per machine
OUTGREW: dict[str, int] = {}  # live requests seen holding more full pages than the SWA pool has


def _settings() -> settings:
    if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
        # 4 machines x 400 runs of up to 100 steps: about 1.3 x 10^5 steps (issue 15 asks for
        # 10^5; runs end early, 260 gave 83,016), some 8 minutes on 2 cores.
        return settings(max_examples=400, stateful_step_count=100)
    # Derandomized: the not-vacuous counters below are then the same in every run.
    return settings(max_examples=40, stateful_step_count=40, derandomize=True)


class ShadowKV:
    """What KV (request namespace + tokens up to the position) each (pool, slot) holds."""

    def __init__(self, page_size: int, window: int) -> None:
        self.page_size = page_size
        self.window = window
        self.slots: dict[tuple[str, int], tuple] = {}

    @staticmethod
    def content(req: Request, pos: int) -> tuple:
        return (req.cache_salt, tuple(req.all_token_ids[: pos + 1]))

    def slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.page_size] * self.page_size + pos % self.page_size

    def write(self, cache: PrefixCache, req: Request, start: int, stop: int) -> None:
        full, swa = cache.page_tables(req)
        for pos in range(start, stop):
            self.slots[("full", self.slot(full, pos))] = self.content(req, pos)
            assert swa[pos // self.page_size] != 0, (
                f"{req.request_id}: writing position {pos} with no SWA page"
            )
            self.slots[("swa", self.slot(swa, pos))] = self.content(req, pos)

    def check(self, cache: PrefixCache, req: Request, stop: int, what: str) -> None:
        full, swa = cache.page_tables(req)
        assert 0 not in full, f"{req.request_id}: full page 0 handed out"
        for pos in range(stop):
            got = self.slots.get(("full", self.slot(full, pos)))
            assert got == self.content(req, pos), f"{what}: {req.request_id} full position {pos} reads {got}"
        for pos in range(max(0, stop - (self.window - 1)), stop):
            page = swa[pos // self.page_size]
            assert page != 0, f"{what}: {req.request_id} SWA position {pos} (in the window) has no page"
            got = self.slots.get(("swa", self.slot(swa, pos)))
            assert got == self.content(req, pos), f"{what}: {req.request_id} SWA position {pos} reads {got}"


class HybridLifecycle(AdmissionRules):
    page_size = 1
    window = 4
    capacity_tokens = 40
    layout: tuple = (("sliding_window", 4), ("full",))
    waiting = Bundle("waiting")
    matched = Bundle("matched")

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        cfg = CacheConfig(self.capacity_tokens, self.page_size, layout=list(self.layout))
        self.cache = make_cache("radix", cfg, swa_eviction_interval=1)
        full, swa = self.cache.kv_groups()
        assert (full.pool, swa.pool, swa.window) == ("full", "swa", self.window)
        self.full_pages, self.swa_pages = full.num_pages - 1, swa.num_pages - 1
        self.shadow = ShadowKV(self.page_size, self.window)
        self.live_reqs: dict[str, Request] = {}
        self.corpus: list[tuple[int, ...]] = []
        self.counter = 0

    def _snapshot(self) -> tuple:
        c = self.cache
        return (
            c.usage(),
            c.swa_usage(),  # type: ignore[attr-defined]
            {
                r.request_id: (tuple(map(tuple, c.page_tables(r))), r.num_computed_tokens)
                for r in c.live_requests
            },
        )

    def _fits(self, tokens: int, req: Request | None = None) -> bool:
        """What allocate accepts: all tokens in the full pool, this call's new pages in the SWA
        pool (a long request outgrows the SWA pool as its old SWA pages are freed)."""
        need = -(-tokens // self.page_size)
        held = len(self.cache.page_table(req)) if req is not None else 0
        return need <= self.full_pages and need - held <= self.swa_pages

    def _compute(self, req: Request, n: int) -> None:
        """The model computes the next n tokens: the first reads the window before it, which
        must hold the request's own KV now (after the allocate), not just after the step."""
        self.shadow.check(self.cache, req, req.num_computed_tokens, "about to compute")
        self.shadow.write(self.cache, req, req.num_computed_tokens, req.num_computed_tokens + n)
        req.num_computed_tokens += n
        self.cache.commit(req)

    @rule(
        target=waiting,
        share=st.integers(0, 16),
        suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
        salt=st.sampled_from([None, "s"]),
    )
    def new_request(self, share: int, suffix: list[int], salt: str | None) -> Request:
        base = self.rng.choice(self.corpus) if self.corpus else ()
        tokens = base[:share] + tuple(suffix)
        self.corpus.append(tokens)
        self.counter += 1
        return Request(f"r{self.counter}", tokens, cache_salt=salt)

    def _admit(self, req: Request, match, chunk: int, what: str):  # type: ignore[no-untyped-def]
        current = self.cache.revalidate(match)
        n = min(chunk, req.num_tokens - current.tokens)
        if not self._fits(current.tokens + n):
            return multiple()  # can never fit
        before = self._snapshot()
        if not self.cache.allocate(req, n, current):
            assert self._snapshot() == before, "a failed allocate changed the cache"
            assert not self.cache.is_live(req)
            return multiple(req)
        assert req.num_computed_tokens == current.tokens
        self.shadow.check(self.cache, req, current.tokens, what)
        self._compute(req, n)
        self.live_reqs[req.request_id] = req
        return multiple()

    @precondition(lambda self: self.live_reqs)
    @rule(data=st.data(), chunk=st.integers(1, 12), decode=st.integers(1, 10))
    def step(self, data: st.DataObject, chunk: int, decode: int) -> None:
        """The next prefill chunk, or several decode steps once the prompt is done."""
        req = self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs)))]
        steps = 1 if req.num_computed_tokens < req.num_tokens else decode
        for _ in range(steps):
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids(self.rng.randrange(VOCAB))
                chunk = 1
            n = min(chunk, req.num_tokens - req.num_computed_tokens)
            if not self._fits(req.num_computed_tokens + n, req):
                return
            before = self._snapshot()
            if not self.cache.allocate(req, n):
                assert self._snapshot() == before, "a failed extend changed the cache"
                return
            self._compute(req, n)

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

    @precondition(lambda self: any(r.num_output_tokens for r in self.live_reqs.values()))
    @rule(data=st.data())
    def short_finish_beside_decoder(self, data: st.DataObject) -> None:
        """Issue 33 case 5: a request of a decoding one's first page and a token more finishes
        at prefill (its commit, then its release: one free group, SGLang's
        process_batch_result); the pages it freed go back as one block, in the order freed
        (its own pages keep their token order in the free list at page size > 1)."""
        decoding = sorted(r for r, q in self.live_reqs.items() if q.num_output_tokens)
        a = self.live_reqs[data.draw(st.sampled_from(decoding))]
        self.counter += 1
        req = Request(f"r{self.counter}", a.all_token_ids[: self.page_size + 1], cache_salt=a.cache_salt)
        match = self.cache.lookup(req)
        n = req.num_tokens - match.tokens
        if not self._fits(req.num_tokens) or not self.cache.allocate(req, n, match):
            return
        own = self.cache.page_table(req)[match.tokens // self.page_size :]
        self.shadow.check(self.cache, req, req.num_computed_tokens, "short request")
        self._compute(req, req.num_tokens - req.num_computed_tokens)
        self.cache.release(req)
        self.corpus.append(tuple(req.all_token_ids))
        pool = self.cache.pool.full  # type: ignore[attr-defined]
        freed = [p for p in own if pool.is_free(p)]
        if self.page_size > 1 and len(freed) > 1:
            order = pool.free_list().tolist()
            at = [order.index(p) for p in freed]
            assert at == sorted(at), "a group's frees went back call by call"

    @rule(num_tokens=st.integers(0, 32), swa=st.booleans())
    def evict(self, num_tokens: int, swa: bool) -> None:
        in_use = self.cache.usage().in_use
        if swa:
            assert self.cache.evict_swa(num_tokens) >= 0  # type: ignore[attr-defined]
        else:
            assert self.cache.evict(num_tokens) >= 0
            assert self.cache.usage().in_use == in_use, "evict touched pinned pages"

    @rule()
    def reset(self) -> None:
        before = self._snapshot()
        if self.cache.reset():
            assert not self.live_reqs and self.cache.usage().evictable == 0
        else:
            assert self.live_reqs and self._snapshot() == before

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        STEPS[type(self).__name__] = STEPS.get(type(self).__name__, 0) + 1
        self.cache.check_invariants()
        for req in self.live_reqs.values():
            self.shadow.check(self.cache, req, req.num_computed_tokens, "live request")
            if 0 in self.cache.page_tables(req)[1]:
                SLID[type(self).__name__] = SLID.get(type(self).__name__, 0) + 1
            if len(self.cache.page_table(req)) > self.swa_pages:
                OUTGREW[type(self).__name__] = OUTGREW.get(type(self).__name__, 0) + 1


class HybridPage4(HybridLifecycle):
    page_size = 4
    window = 6
    capacity_tokens = 64
    layout = (("sliding_window", 6), ("full",))


class GemmaLikePage4(HybridLifecycle):
    """Five sliding-window layers per full layer (the gemma3-like pattern), a tight SWA pool."""

    page_size = 4
    window = 5
    capacity_tokens = 24
    layout = (("sliding_window", 5),) * 5 + (("full",),)


class TwoWindowsPage1(HybridLifecycle):
    """Two windows: one SWA pool keeping the larger (3 and 5 -> 5)."""

    window = 5
    capacity_tokens = 40
    layout = (("sliding_window", 3), ("sliding_window", 5), ("full",), ("full",))


TestHybridPage1 = HybridLifecycle.TestCase
TestHybridPage4 = HybridPage4.TestCase
TestGemmaLikePage4 = GemmaLikePage4.TestCase
TestTwoWindowsPage1 = TwoWindowsPage1.TestCase
for _case in (TestHybridPage1, TestHybridPage4, TestGemmaLikePage4, TestTwoWindowsPage1):
    _case.settings = _settings()
del _case


def test_the_machines_slid_their_windows() -> None:
    """Not vacuous: every machine that ran saw live requests whose old SWA pages were freed."""
    if not STEPS:
        pytest.skip("run with the machines above")
    for name in STEPS:
        assert SLID.get(name, 0) > 0, f"{name} never freed an out-of-window SWA page of a live request"
    # Each machine counts in its own test process (pytest-xdist may split them): the one sized
    # for it must have seen requests outgrow the SWA pool.
    if "GemmaLikePage4" in STEPS:
        assert OUTGREW.get("GemmaLikePage4", 0) > 0, "no request ever outgrew the SWA pool"
    print(f"hybrid stateful steps: {STEPS} (total {sum(STEPS.values())}); outgrew the SWA pool: {OUTGREW}")
