"""The radix backend over hybrid full + sliding-window layouts, hunted through the common
interface with a shadow KV model per pool (full and SWA).

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

from collections import Counter, defaultdict

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from prefixcache import CacheConfig, Request, make_cache
from tests.stateful_lifecycle import Lifecycle, group_shadows
from tests.stateful_rules import SALTED, machine_tests, new_request_rule, step_rule

# per machine: steps, live page tables seen with freed (0) SWA pages, live requests seen
# holding more full pages than the SWA pool has
SEEN: defaultdict[str, Counter[str]] = defaultdict(Counter)


class HybridLifecycle(Lifecycle):
    page_size = 1
    window = 4
    capacity_tokens = 40
    layout: tuple = (("sliding_window", 4), ("full",))
    SEEN = SEEN

    def start(self) -> None:
        cfg = CacheConfig(self.capacity_tokens, self.page_size, layout=list(self.layout))
        self.cache = make_cache("radix", cfg, swa_eviction_interval=1)
        full, swa = self.cache.kv_groups()
        assert (full.pool, swa.pool, swa.window) == ("full", "swa", self.window)
        self.full_pages, self.swa_pages = full.num_pages - 1, swa.num_pages - 1
        self.shadows = group_shadows([full, swa], self.page_size)

    def tables(self, req: Request) -> list[list[int]]:
        return self.cache.page_tables(req)  # type: ignore[no-any-return]

    def more_state(self) -> tuple:
        return (self.cache.component_usage(),)

    def fits(self, tokens: int, req: Request | None = None) -> bool:
        """What allocate accepts: all tokens in the full pool, this call's new pages in the SWA
        pool (a long request outgrows the SWA pool as its old SWA pages are freed)."""
        need = -(-tokens // self.page_size)
        held = len(self.cache.page_table(req)) if req is not None else 0
        return need <= self.full_pages and need - held <= self.swa_pages

    new_request = new_request_rule(share=16, suffix=10, namespaces=SALTED)
    step = step_rule(chunk=12, decode=10)
    reset = rule()(Lifecycle.reset)

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
        if not self.fits(req.num_tokens) or not self.cache.allocate(req, n, match):
            return
        own = self.cache.page_table(req)[match.tokens // self.page_size :]
        self._check(req, req.num_computed_tokens, "short request")
        self._compute(req, req.num_tokens - req.num_computed_tokens)
        self._release(req)
        pool = self.cache.pool.full
        freed = [p for p in own if pool.is_free(p)]
        if self.page_size > 1 and len(freed) > 1:
            order = pool.free_list().tolist()
            at = [order.index(p) for p in freed]
            assert at == sorted(at), "a group's frees went back call by call"

    @rule(num_tokens=st.integers(0, 32), swa=st.booleans())
    def evict(self, num_tokens: int, swa: bool) -> None:
        if swa:
            assert self.cache.evict_component(num_tokens) >= 0
        else:
            self._evict(num_tokens)

    def check_more(self) -> None:
        for req in self.live_reqs.values():
            if 0 in self.cache.page_tables(req)[1]:
                self.count("slid")
            if len(self.cache.page_table(req)) > self.swa_pages:
                self.count("outgrew")


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


# thorough: 4 machines x 400 runs of up to 100 steps, about 1.3 x 10^5 steps (issue 15 asks for
# 10^5; runs end early, 260 gave 83,016), some 8 minutes on 2 cores
TestHybridPage1, TestHybridPage4, TestGemmaLikePage4, TestTwoWindowsPage1 = machine_tests(
    HybridLifecycle, HybridPage4, GemmaLikePage4, TwoWindowsPage1, runs=40, steps=40, thorough_runs=400
)


def test_the_machines_slid_their_windows() -> None:
    """Not vacuous: every machine that ran saw live requests whose old SWA pages were freed."""
    if not SEEN:
        pytest.skip("run with the machines above")
    for name in SEEN:
        assert SEEN[name]["slid"] > 0, f"{name} never freed an out-of-window SWA page of a live request"
    # Each machine counts in its own test process (pytest-xdist may split them): the one sized
    # for it must have seen requests outgrow the SWA pool.
    if "GemmaLikePage4" in SEEN:
        assert SEEN["GemmaLikePage4"]["outgrew"] > 0, "no request ever outgrew the SWA pool"
    print(f"hybrid stateful: {dict(SEEN)}")
