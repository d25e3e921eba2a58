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
    root = cache.tree.root_node
    # the root's one permanent lock (the tree's: never evicted, never counted) and no more
    assert (root.lock_ref, root.mamba_lock) == (1, 0), "a request's lock never reaches the root"
    assert cache.page_tables(req)[1][0] > 0, "the request holds its own state slot"
    req.num_computed_tokens = 10
    cache.check_invariants()  # computed, not yet committed
    cache.release(req)  # finished at prefill: inserted with its state donated
    cache.check_invariants()
    assert [length for length, _ in cache.component.state_slots()] == [10]


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


def test_a_split_prefix_keeps_its_suffix_creation_time() -> None:
    # Recorded through sglang_driver.replay_sglang(unified=True, eviction_policy="fifo"):
    # 0.5.23's UnifiedRadixCache._split_node gives the new prefix node the child's
    # creation_time (its older RadixCache a fresh one). C's match splits A's 27 tokens at 26;
    # under fifo the evictable leaves are then A's last token and B, both older than the
    # split. Evicting 2 tokens takes A's last token, then its 26-token prefix (created with A,
    # before B): 27 freed, usage [84 free, 12 evictable, 0 in use]. RadixCache frees 13 (the
    # prefix, fresh at the split, outlives B).
    from prefixcache.experiments.upstream.ours import replay_ours
    from prefixcache.experiments.upstream.scenarios import Scenario

    a = [2424, 280, 749, 1532, 4023, 221, 4697, 4189, 333, 1946, 4858, 4527, 4799, 339]
    a += [3519, 953, 2692, 825, 2761, 1240, 1182, 1262, 2448, 2851, 2274, 118, 4499]
    b = [3088, 200, 1970, 4617, 2083, 1623, 3265, 452, 3536, 2524, 2073, 575]
    s = Scenario("split_fifo", 97, 1, systems=("sglang",))
    s.new("A", a).alloc("A").run("A").release("A")
    s.new("B", b).alloc("B").run("B").release("B")
    s.new("C", a).alloc("C").run("C").append("C", [3655]).release("C")
    s.ops.append({"op": "evict", "n": 2})
    records, _ = replay_ours("radix", s.to_json(), need_sort=False, eviction_policy="fifo")
    assert [r["hit"] for r in records if "hit" in r] == [0, 0, 26]
    assert records[-1]["freed"] == 27
    assert records[-1]["usage"] == [84, 12, 0]


def test_a_split_prefix_keeps_its_suffix_creation_time_under_hicache() -> None:
    # The same split as above with HiCache on (write_through), recorded through
    # sglang_hicache_driver.replay_upstream with eviction_policy="fifo": evicting 7 device
    # tokens demotes C's last token, then the 10-token prefix (as old as A), not B: 11 freed,
    # both host-only now ('h'), B still on device and host ('dh').
    from prefixcache.experiments.upstream.scenarios import Scenario
    from prefixcache.experiments.upstream.sglang_hicache_driver import replay_ours as hicache_ours

    a = [1458, 1038, 599, 3596, 834, 63, 4418, 2382, 818, 2969, 3327]
    s = Scenario("split_fifo_hicache", 65, 1, systems=("sglang",))
    s.new("A", a).alloc("A").run("A").release("A")
    s.new("B", [28, 2324, 4354, 3942, 1496, 397, 500]).alloc("B").run("B").release("B")
    s.new("C", a).alloc("C").run("C").release("C")
    s.ops += [{"op": "step"}, {"op": "evict", "n": 7}]
    sc = {**s.to_json(), "tier": {"write_policy": "write_through", "ratio": 2.0},
          "options": {"eviction_policy": "fifo"}}
    records = hicache_ours(sc)
    assert records[-5]["hit"] == 10  # C's alloc
    assert records[-1] == {
        "freed": 11, "usage": [57, 7, 0], "host_free": 111,
        "nodes": [[7, 7, "dh"], [10, 10, "h"], [11, 1, "h"]],
    }
