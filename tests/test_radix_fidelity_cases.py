"""Cases where the radix backend once differed from SGLang 0.5.23's own UnifiedRadixCache, each
named by what SGLang does (issue 33). The numbers were read by running the pinned code through
experiments/upstream/ (the drivers named in each test)."""

from __future__ import annotations

import json
from pathlib import Path

from prefixcache.experiments.upstream.sglang_hybrid_driver import replay_requests_ours

from prefixcache import CacheConfig, Request, make_cache


def test_mamba_request_before_first_commit_is_legal() -> None:
    # SGLang's MambaComponent.acquire_component_lock (and FullComponent's) skip the root: a
    # request admitted with hit 0 holds no lock at all until its first checkpoint moves it to
    # a node; one finishing at prefill is released from there.
    config = CacheConfig(200, 1, layout=[("mamba", 16), ("full",)])
    cache = make_cache("radix", config, max_mamba_cache_size=4)
    req = Request("a", list(range(1, 11)))
    match = cache.lookup(req)
    assert match.tokens == 0
    assert cache.allocate(req, 10, match)
    cache.check_invariants()
    root = cache.tree.root
    assert (root.full_lock, root.mamba_lock) == (0, 0), "the root is never locked"
    assert cache.page_tables(req)[1][0] > 0, "the request holds its own state slot"
    req.num_computed_tokens = 10
    cache.check_invariants()  # computed, not yet committed
    cache.release(req)  # finished at prefill: inserted with its state donated
    cache.check_invariants()
    assert [length for length, _ in cache.state_slots()] == [10]


SWA_FIXTURES = Path(__file__).parent / "fixtures" / "upstream" / "sglang_hybrid"


def test_swa_frees_of_one_group_return_together() -> None:
    # Recorded by sglang_hybrid_driver.tombstone_finish_case through SGLang's scheduler entry
    # points with its free groups: B's checkpoint frees its page 6 full-only (its SWA page moved
    # onto A's tombstoned first page) and its release frees page 7, in the one group of
    # process_batch_result; the group returns them as one block [6, 7], so A's next new page
    # is 6 (freed call by call, the later call's page 7 would come first).
    fixture = json.loads((SWA_FIXTURES / "sglang_hybrid_req_tombstone_finish_p16.json").read_text())
    sc, upstream = fixture["scenario"], fixture["records"]
    ops = sc["ops"]
    b_release = next(i for i, op in enumerate(ops) if op == {"op": "release", "rid": "B"})
    assert upstream[b_release - 1]["pages"] == [1, 7], "B's checkpoint moved it onto A's page 1"
    a_allocs = [i for i, op in enumerate(ops) if i > b_release and op["op"] == "alloc"]
    third = upstream[a_allocs[2]]
    assert upstream[a_allocs[1]]["pages"] == [1, 2, 3, 4, 5]
    assert third["pages"] == [1, 2, 3, 4, 5, 6] and third["swa"] == [5, 2, 3, 4, 1, 6]
    ours = replay_requests_ours(sc)
    assert [r.get("pages") for r in ours] == [r.get("pages") for r in upstream]
    assert [r["usage"] for r in ours] == [r["usage"] for r in upstream]
