"""Issue 33: four places random streams found the hashchain backend apart from vLLM 0.33.0, each
replayed against the pinned code's own numbers (tests/fixtures/upstream/fidelity/, recorded by
experiments/upstream/vllm_offload_driver.py --fidelity through vLLM's KVCacheManager and
OffloadingConnectorScheduler over CPUOffloadingManager, driven by offload_cases.replay)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefixcache.experiments.upstream.offload_cases import OursOffload, fidelity_cases, replay

FIXTURES = Path(__file__).parent / "fixtures" / "upstream" / "fidelity"
CASES = {c["name"]: c for c in fidelity_cases()}


def _fixture(name: str) -> dict[str, Any]:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    assert fixture["recorded_with"].startswith("vllm 0.33.0")
    assert fixture["case"] == json.loads(json.dumps(CASES[name])), "the case changed since it was recorded"
    return fixture


def _admissions(record: dict[str, Any]) -> dict[str, list[Any]]:
    return {a[1]: a for a in record["admissions"]}


def test_every_fidelity_case_has_a_recorded_fixture() -> None:
    offload = {p.stem for p in FIXTURES.glob("*.json") if not p.stem.startswith("vllm_events_")}
    assert offload == set(CASES)


def test_async_host_load_allocates_only_loaded_blocks() -> None:
    """vLLM 0.33.0 ``v1/core/sched/scheduler.py`` ``Scheduler.schedule``: a request whose
    external tokens load asynchronously is allocated with ``num_new_tokens = 0``
    (``allocate_slots(num_external_computed_tokens=...)``: the loaded blocks only); the rest is
    allocated once ``_update_waiting_for_remote_kv`` sees the load done.

    10 GPU blocks of 16 tokens, ack delay 2: Y (64) is stored to the host, the GPU is cleared,
    X (64) runs, L = Y + 64 loads 64 tokens and takes 4 blocks, so X's 4 cached blocks survive:
    M = X + 3 is admitted at once (step 7) with a 64-token GPU hit."""
    name = "async_load_allocates_loaded_blocks"
    fixture = _fixture(name)
    adm = _admissions(fixture)
    assert adm["L"] == [6, "L", 0, 64, 0]
    assert adm["M"] == [7, "M", 64, 0, 0]
    assert fixture["metrics"] == {"external_prefix_cache_queries": 259, "external_prefix_cache_hits": 64}
    ours = replay(CASES[name], OursOffload(CASES[name]))
    assert ours["admissions"] == fixture["admissions"]
    assert ours["steps"] == fixture["steps"]
    assert ours["metrics"] == fixture["metrics"]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_final_stores_before_finish_callbacks(policy: str) -> None:
    """vLLM 0.33.0 ``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``
    ``OffloadingConnectorScheduler._build_connector_meta``: every store of the step
    (``_build_store_jobs`` over the scheduled, then the finished requests) is made before
    ``manager.on_request_finished`` is called for any finished request.

    14 host chunks of 16, offload_prompt_only=False, ack delay 1: A (127) stores 7 chunks, B (73)
    4; C = A[:111] + 33 and D = 166 new tokens run and finish in step 5, D's store finding no room
    while B's is in flight, so it is made at D's finish in step 6 and evicts 10 chunks by the
    ranks before C's recency commit. After a GPU clear E = A[:111] + 17 gets 16 host tokens under
    LRU (A's chunk 0 survived) and none under ARC (C's touch of A's chunks is not yet in T2)."""
    name = f"final_stores_before_finish_{policy}"
    fixture = _fixture(name)
    evicted = {"lru": ["A:6", "B:3", "B:2", "B:1", "B:0", "A:5", "A:4", "A:3", "A:2", "A:1"],
               "arc": ["A:6", "A:5", "A:4", "A:3", "A:2", "A:1", "A:0", "B:3", "B:2", "B:1"]}  # fmt: skip
    step6 = next(s for s in fixture["steps"] if s["step"] == 6)
    assert step6["stored"] == [f"D:{i}" for i in range(10)]
    assert step6["evicted"] == evicted[policy]
    assert _admissions(fixture)["E"] == [10, "E", 0, {"lru": 16, "arc": 0}[policy], 0]
    ours = replay(CASES[name], OursOffload(CASES[name]))
    assert ours["admissions"] == fixture["admissions"]
    assert ours["steps"] == fixture["steps"]
    assert ours["metrics"] == fixture["metrics"]


def test_loaded_blocks_are_their_own_stored_batch(vllm_hash_seed: None) -> None:
    """vLLM 0.33.0 ``v1/core/sched/scheduler.py`` ``Scheduler._update_waiting_for_remote_kv``:
    the blocks a finished load filled are cached (``cache_blocks(request,
    num_computed_tokens)``: one BlockStored) before the request is scheduled, whose
    ``allocate_slots`` caches the next full block (a second BlockStored, parent the last
    loaded block's hash).

    A = 48 tokens stores 3 chunks of 16; the GPU is cleared; B = A + 16 loads 48 tokens (step 5)
    and in step 6 emits two BlockStored events: the 3 loaded blocks, then the computed one."""
    name = "loaded_blocks_event_batch"
    fixture = _fixture(name)
    step6 = dict((s, e) for s, e in fixture["events"])[6]
    assert [e["type"] for e in step6] == ["BlockStored", "BlockStored"]
    assert [len(e["block_hashes"]) for e in step6] == [3, 1]
    assert step6[1]["parent_block_hash"] == step6[0]["block_hashes"][-1]
    assert step6[1]["token_ids"] == list(range(800, 816))
    ours = replay(CASES[name], OursOffload(CASES[name]))
    assert ours["admissions"] == fixture["admissions"]
    assert ours["events"] == fixture["events"]
    # A caller that reserves its first chunk at admission as well (the interface allows it)
    # still sees vLLM's two batches: the reserved blocks are cached once the load is done.
    eager = replay(CASES[name], _ReservingTheChunk(CASES[name]))
    assert eager["events"] == fixture["events"]


class _ReservingTheChunk(OursOffload):
    """Admits a host hit with its whole first chunk, ``allocate(req, n, m)``, not vLLM's 0."""

    def admit(self, rid: str, local: int, external: int, n: int) -> bool:
        m = self._matches.pop(rid)
        return self.cache.allocate(self.reqs[rid], n + external - m.host_tokens, m)


def _replay_events(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorder's ops (vllm_kv_events_driver.replay_events) through the PrefixCache
    contract, on the explicit groups of the scenario; per op the events as JSON."""
    from prefixcache.experiments.upstream.kv_event_cases import event_json

    from prefixcache import CacheConfig, Request, make_cache

    B = scenario["block_size"]
    cache = make_cache(
        "hashchain",
        CacheConfig(scenario["num_blocks"] * B, B),
        attention_groups=[tuple(g) for g in scenario["groups"]],
        prefix_match_unit=scenario["prefix_match_unit"],
        prefix_cache_retention_interval=scenario["retention"],
        free_skipped_on_failure=True,
        kv_events=True,
    )
    reqs: dict[str, Request] = {}
    records: list[dict[str, Any]] = []
    for op in scenario["ops"]:
        kind, rid = op["op"], op.get("rid")
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[rid] = Request(rid, op["prompt"])
        elif kind == "alloc":
            req = reqs[rid]
            m = cache.lookup(req)
            ok = cache.allocate(req, req.num_tokens - m.tokens, m)
            rec.update(hit=req.num_computed_tokens if ok else None, ok=ok)
        elif kind == "run" and cache.is_live(reqs[rid]):
            reqs[rid].num_computed_tokens = cache.reserved_tokens(reqs[rid])
            cache.commit(reqs[rid])
        elif kind == "release" and cache.is_live(reqs[rid]):
            cache.release(reqs[rid])
        rec["events"] = [event_json(e) for e in cache.kv_events.take_events()]
        records.append(rec)
    return records


def test_partial_tail_event_at_match_unit(vllm_hash_seed: None) -> None:
    """vLLM 0.33.0 ``v1/core/single_type_kv_cache_manager.py``
    ``FullAttentionManager._cache_partial_tail_block`` and ``v1/core/block_pool.py``
    ``BlockPool.cache_partial_block``: with --prefix-match-unit below the block size, a full
    group registers the prompt's hit cap (prompt - 1, down to a unit) when it ends inside a
    block as a second key of that block, with its own BlockStored (block_size = the unit), and a
    BlockRemoved when the block is evicted.

    Layout [sliding window 8, full], block 4, unit 2, prompt 1..8: the third BlockStored is on
    the full group, block_size 2, tokens [5, 6], parent block 0's hash; the next prompt evicts
    every block, removing it too (5 BlockRemoved: 2 window, 3 full)."""
    path = FIXTURES / "vllm_events_partial_tail_unit2.json"
    fixture = json.loads(path.read_text())
    assert fixture["upstream"] == "vllm 0.33.0"
    upstream = fixture["records"]
    stored = upstream[1]["events"]
    assert [(e["group_idx"], e["block_size"]) for e in stored] == [(0, 4), (1, 4), (1, 2)]
    assert stored[2]["token_ids"] == [5, 6]
    assert stored[2]["parent_block_hash"] == stored[1]["block_hashes"][0]
    removed = [e for e in upstream[5]["events"] if e["type"] == "BlockRemoved"]
    assert [(e["group_idx"], e["block_hashes"][0]) for e in removed][3] == (1, stored[2]["block_hashes"][0])
    ours = _replay_events(fixture["scenario"])
    assert [r.get("hit") for r in ours] == [r.get("hit") for r in upstream]
    drop = ("medium",)
    assert [[{k: v for k, v in e.items() if k not in drop} for e in r["events"]] for r in ours] == [
        [{k: v for k, v in e.items() if k not in drop} for e in r["events"]] for r in upstream
    ]


def test_async_load_admission_hook_takes_only_the_loaded_blocks() -> None:
    """The backend side of case 1, through the hook ``allocate(req, 0, m)`` will reach
    (``_admit`` with no new tokens, a host part): blocks for the GPU hit and the external
    tokens only (vLLM's ``allocate_slots(num_new_tokens=0, num_external_computed_tokens=64)``),
    so X's 4 cached blocks stay cached and free."""
    from prefixcache import CacheConfig, Request, make_cache
    from prefixcache.tiers import HostTierConfig

    tier = HostTierConfig(capacity_tokens=100 * 16, block_size=16)
    cache = make_cache("hashchain", CacheConfig(10 * 16, 16), host_tier=tier)
    y, x = list(range(100, 164)), list(range(300, 364))
    for rid, prompt in (("Y", y), ("X", x)):
        req = Request(rid, prompt)
        assert cache.allocate(req, 64)
        req.num_computed_tokens = 64
        cache.commit(req)
        cache.release(req)
        for _ in range(2):
            cache.host_tier.advance_transfers()  # Y's store built, then acknowledged
        if rid == "Y":
            pool = cache.block_pool
            cache.evict_blocks({b.block_id for b in pool.blocks[1:] if b.block_hash is not None})
    cached_before = cache.usage().evictable
    assert cached_before == 4  # X's blocks
    big = Request("L", y + list(range(500, 564)))
    m = cache.lookup(big)
    assert (m.tokens, m.host_tokens) == (0, 64)
    state = cache._admit(big, 0, m)
    assert state is not None and len(state[0]) == 4
    assert cache.usage().evictable == cached_before


def test_partial_tail_evicted_in_use_is_keyed_again_as_the_blocks_hash(vllm_hash_seed: None) -> None:
    """vLLM 0.33.0 ``BlockPool.cache_partial_block`` called by every ``cache_blocks``: a block
    whose keys ``evict_blocks`` dropped while in use gets the partial key back at the next
    allocation, now as its only hash (BlockStored, block_size = the unit), so its free puts it
    at the free queue's tail, as a cached block. Numbers from the pinned code, driven as the
    recorder drives it: [sliding window 8, full], block 4, unit 2, 12 blocks, prompt 1..7, one
    decode (8), evict_blocks of every block the request holds, one decode (9), free."""
    from prefixcache.experiments.upstream.kv_event_cases import event_json

    from prefixcache import CacheConfig, Request, make_cache

    cache = make_cache(
        "hashchain", CacheConfig(12 * 4, 4), attention_groups=[("sliding_window", 8), ("full",)],
        prefix_match_unit=2, prefix_cache_retention_interval=None, free_skipped_on_failure=True,
        kv_events=True,
    )  # fmt: skip
    req = Request("a", list(range(1, 8)))

    def step(tokens: int) -> list[tuple[str, int, list[int], list[int]]]:
        if tokens > 7:
            req.append_output_token_ids([tokens])
            assert cache.allocate(req, 1)
        else:
            m = cache.lookup(req)
            assert cache.allocate(req, 7, m)
        req.num_computed_tokens = tokens
        cache.commit(req)
        cache.check_invariants()
        return [(e["type"], e["group_idx"], e.get("token_ids"), e["block_hashes"])
                for e in map(event_json, cache.kv_events.take_events())]  # fmt: skip

    assert [e[:3] for e in step(7)] == [("BlockStored", 0, [1, 2, 3, 4]), ("BlockStored", 1, [1, 2, 3, 4])]
    decoded = step(8)
    assert [e[:3] for e in decoded] == [
        ("BlockStored", 0, [5, 6, 7, 8]), ("BlockStored", 1, [5, 6, 7, 8]), ("BlockStored", 1, [5, 6]),
    ]  # fmt: skip
    partial = decoded[2][3]
    assert partial == [12976629201856393469]
    held = {b for table in cache.page_tables(req) for b in table}
    assert held == {1, 2, 3, 4}
    cache.evict_blocks(held)
    removed = [(e["group_idx"], e["block_hashes"]) for e in map(event_json, cache.kv_events.take_events())]
    assert removed == [
        (0, [18066133607483025848]), (0, [1269044598831534363]),
        (1, [18066133607483025848]), (1, [1269044598831534363]), (1, partial),
    ]  # fmt: skip
    assert step(9) == [("BlockStored", 1, [5, 6], partial)]
    assert [list(t) for t in cache.page_tables(req)] == [[1, 2, 5], [3, 4, 6]]
    cache.release(req)
    free = [b.block_id for b in cache.block_pool.free_block_queue.get_all_free_blocks()]
    assert free == [6, 3, 5, 2, 1, 7, 8, 9, 10, 11, 4]
