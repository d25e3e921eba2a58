"""Lifecycle hunting for the hashchain backend over hybrid layouts, through ``kv_groups()`` and
``page_tables()`` (what the model reads), with one shadow KV per group.

A group's layers keep their own KV, so each group has its own ShadowKV (tests/stateful_lifecycle.py):
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

from collections import Counter, defaultdict

import pytest

from prefixcache import CacheConfig, Match, Request, make_cache
from tests.stateful_lifecycle import Lifecycle, group_shadows
from tests.stateful_rules import evict_rule, new_request_rule, profile_settings, step_rule

B = 4
LAYOUTS = {
    "gemma3_small": [("sliding_window", 9)] * 5 + [("full",)],
    "gpt_oss_small": [("sliding_window", 6), ("full",)],
    "mixed_windows": [("sliding_window", 5), ("full",), ("sliding_window", 13), ("full",)],
    "mamba_small": [("mamba", 8), ("full",), ("sliding_window", 12), ("mamba", 8)],
}
RETENTIONS = (None, 0, 8)
# per machine: steps, admissions that hit (the hit checks are not vacuous), checks of a live
# table holding a page 0 (windows moved past pages)
SEEN: defaultdict[str, Counter[str]] = defaultdict(Counter)
# thorough: 12 machines x 300 examples x 50 steps = 180,000 steps; default: ~15 s in all.
MACHINE_SETTINGS = profile_settings(30, 30, thorough_runs=300, thorough_steps=50)


class HybridLifecycle(Lifecycle):
    layout: list = []
    retention: int | None = 0
    capacity_tokens = 28  # per layer: small, so requests evict each other
    max_length = 40
    name = "hybrid"
    SEEN = SEEN

    def start(self) -> None:
        self.mamba = any(layer[0] == "mamba" for layer in self.layout)
        capacity = 2 * self.capacity_tokens if self.mamba else self.capacity_tokens  # 8-token pages
        config = CacheConfig(capacity, B, layout=self.layout)
        self.cache = make_cache("hashchain", config, prefix_cache_retention_interval=self.retention)
        groups = self.cache.kv_groups()
        assert sorted(i for g in groups for i in g.layers) == list(range(len(self.layout)))
        self.page = self.cache.page_size  # B, or raised to hold a Mamba state
        self.shadows = group_shadows(groups, self.page)
        self.usable = groups[0].num_pages - 1

    def tables(self, req: Request) -> list[list[int]]:
        return self.cache.page_tables(req)  # type: ignore[no-any-return]

    def chunk(self, req: Request, start: int, want: int) -> int:
        """``want``, capped at the request's end; with Mamba also ended on a block boundary
        (vLLM's align-mode scheduler)."""
        end = min(start + want, req.num_tokens)
        if self.mamba and end < req.num_tokens and end % self.page:
            end = max(end // self.page * self.page, min(req.num_tokens, (start // self.page + 1) * self.page))
        return end - start

    def fits(self, tokens: int, req: Request | None = None) -> bool:
        return self.cache._min_pages_to_fit(tokens) <= self.usable  # type: ignore[no-any-return]

    def admissible(self, req: Request, tokens: int) -> bool:
        return self.fits(tokens) and self.fits(req.num_tokens)

    def check_match(self, req: Request, match: Match) -> None:
        assert match.tokens == self.cache.lookup(req).tokens, "revalidated match differs from a fresh lookup"

    def check_hit(self, req: Request, match: Match, what: str) -> None:
        if match.tokens:
            self.count("hits")
        super().check_hit(req, match, what)

    def check_more(self) -> None:
        for req in self.live_reqs.values():
            if any(0 in table for table in self.cache.page_tables(req)):
                self.count("nulled")

    new_request = new_request_rule(share=24, suffix=12)
    step = step_rule(chunk=12)
    evict = evict_rule(32)


CASES = [(layout, retention) for layout in LAYOUTS for retention in RETENTIONS]


@pytest.mark.parametrize(("layout", "retention"), CASES)
def test_hybrid_lifecycle_hands_back_own_kv_in_every_group(layout: str, retention: int | None) -> None:
    name = f"{layout}_{retention}"
    attrs = {"layout": LAYOUTS[layout], "retention": retention, "name": name}
    machine = type(f"HybridLifecycle_{name}", (HybridLifecycle,), attrs)
    seen = SEEN[name] = Counter()
    MACHINE_SETTINGS(machine).TestCase().runTest()
    assert seen["steps"] > 0
    assert seen["hits"] > 0, "no admission hit: the hit checks proved nothing"
    assert seen["nulled"] > 0, "no window ever moved past a page: the window checks proved nothing"
    print(f"stateful hybrid: {name} " + " ".join(f"{k}={v}" for k, v in seen.items()))
