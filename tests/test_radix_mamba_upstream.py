"""Our Mamba radix tree replays what SGLang 0.5.23's own code did.

Fixtures: tests/fixtures/upstream/sglang_mamba/sglang_mamba_*.json, recorded by
experiments/upstream/sglang_mamba_driver.py from ``UnifiedRadixCache`` with the FULL + MAMBA
components (python tree core, no_buffer mode, page 1) over the real ``HybridReqToTokenPool``
(``MambaSlotAllocator``) and ``TokenToKVPoolAllocator`` on CPU.

Per op: insert prefix lengths and ``mamba_exist``, match lengths (cut to the deepest state and
the full-KV length), the matched KV slots and state slot, evicted (tokens, states), both pools'
available and evictable sizes, and every (path, state slot) the tree holds must agree exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prefixcache.backends.radix import RadixPrefixCache
from prefixcache.backends.radix.components.mamba import MambaComponent, mamba_tree
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import InsertParams, LockReceipt, RadixCache
from prefixcache.backends.radix.tree import TreeNode
from prefixcache.experiments.upstream.kv_event_cases import event_json

from prefixcache import CacheConfig, Request
from prefixcache.pool import PagePool

# A folder of their own, apart from upstream/*.json (test_upstream_fixtures' dense set).
_ALL = sorted((Path(__file__).parent / "fixtures" / "upstream" / "sglang_mamba").glob("sglang_mamba_*.json"))
FIXTURES = [p for p in _ALL if not p.stem.startswith("sglang_mamba_req")]  # tree ops
REQUEST_FIXTURES = [p for p in _ALL if p.stem.startswith("sglang_mamba_req")]  # request lifecycles


def _states(tree: RadixCache) -> list[list[Any]]:
    out: list[list[Any]] = []
    stack: list[tuple[TreeNode, list[int]]] = [(tree.root_node, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + child.key.tolist()
            if child.mamba is not None:
                out.append([p, child.mamba])
            stack.append((child, p))
    return sorted(out)


def replay_tree(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:
    """The driver's ops through the FULL + MAMBA tree over two PagePools (the same alloc/free calls);
    ``events``: with a KV event recorder, each record holds the events drained after its op."""
    kv = PagePool(sc["kv_tokens"] + 1)
    states = PagePool(sc["mamba_slots"] + 1)
    recorder = RadixEventRecorder(1) if events else None
    mamba = MambaComponent(states)
    tree = mamba_tree(kv.free_each, mamba, events=recorder)
    locks: dict[str, LockReceipt] = {}
    out: list[dict[str, Any]] = []
    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        key = RadixKey(op.get("tokens", []))
        if kind == "insert":
            ok = kv.num_free >= len(key) and states.num_free >= 1
            rec["ok"] = ok
            if ok:
                idx, slot = kv.alloc(len(key)), states.alloc(1)
                assert idx is not None and slot is not None
                res = tree.insert_ending_at(key, idx, params=InsertParams(mamba=int(slot[0])))
                if res.exist:
                    states.free(slot)
                rec["prefix_len"] = res.prefix_len
                rec["mamba_exist"] = res.exist
        elif kind in ("match", "lock"):
            m = tree.match_prefix(key)
            rec["length"] = m.length
            rec["full_length"] = m.full_hit
            rec["indices"] = m.indices.tolist()
            rec["state"] = m.last_node.mamba
            assert np.array_equal(tree.path_indices(m.last_node), m.indices)
            if kind == "lock":
                locks[op["name"]] = tree.lock(m.last_node)
        elif kind == "unlock":
            tree.unlock(locks.pop(op["name"]))
        elif kind == "evict":
            rec["freed"] = list(tree.evict_for_alloc(op["full"], op["mamba"]))
        else:
            raise ValueError(f"unknown op {kind!r}")
        rec["pools"] = [kv.num_free, states.num_free, tree.evictable_size(), mamba.evictable]
        rec["states"] = _states(tree)
        if recorder is not None:
            rec["events"] = [event_json(e) for e in recorder.take_events()]
        tree.check()
        out.append(rec)
    return out


def _diffs(ours: list[dict[str, Any]], fixture: dict[str, Any]) -> list[str]:
    ops = fixture["scenario"]["ops"]
    return [
        f"op {i} {op}: {k} ours={a.get(k)} upstream={v}"
        for i, (a, b, op) in enumerate(zip(ours, fixture["records"], ops, strict=True))
        for k, v in b.items()
        if a.get(k) != v
    ]


def test_fixtures_are_there() -> None:
    names = {p.stem for p in _ALL}
    assert {
        "sglang_mamba_shared_diverge",
        "sglang_mamba_internal_eviction",
        "sglang_mamba_cut_to_checkpoint",
        "sglang_mamba_seeded1",
        "sglang_mamba_seeded2",
        "sglang_mamba_req_chunked",
        "sglang_mamba_req_seeded1",
        "sglang_mamba_req_seeded2",
    } <= names
    assert sum(p.stat().st_size for p in _ALL) < 150_000


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_mamba_tree_replays_sglang_0_5_23(path: Path) -> None:
    fixture = json.loads(path.read_text())
    diffs = _diffs(replay_tree(fixture["scenario"]), fixture)
    assert not diffs, "\n".join(diffs[:10])


def replay_requests(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """The driver's request ops through RadixPrefixCache (the PrefixCache interface), its
    pools sized like the driver's: layout [mamba 1, full], max_mamba_cache_size = the state
    slots, so the full pool gets 2 x capacity - (slots + 1) = the driver's KV tokens."""
    capacity, odd = divmod(sc["kv_tokens"] + sc["mamba_slots"] + 1, 2)
    assert not odd, "kv_tokens + mamba_slots must be odd"
    cfg = CacheConfig(capacity, 1, layout=[("mamba", 1), ("full",)])
    cache = RadixPrefixCache(cfg, max_mamba_cache_size=sc["mamba_slots"])
    assert cache.component.sizes == (sc["mamba_slots"], sc["kv_tokens"])
    reqs: dict[str, Request] = {}
    out: list[dict[str, Any]] = []

    def run(req: Request, n: int) -> None:
        assert cache.allocate(req, n), f"{req.request_id}: no room for {n} tokens"
        req.num_computed_tokens += n
        cache.commit(req)

    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        if kind == "admit":
            req = reqs[op["name"]] = Request(op["name"], op["tokens"])
            m = cache.lookup(req)
            n = min(op["chunk"], req.num_tokens - m.tokens)
            assert cache.allocate(req, n, m)
            rec["hit"] = req.num_computed_tokens
            rec["cow_source"] = cache.request_kv(req).cow_source
            rec["state"] = cache.page_tables(req)[1][0]
            req.num_computed_tokens += n
            cache.commit(req)
        elif kind == "chunk":
            run(reqs[op["name"]], op["n"])
        elif kind == "decode" or (
            kind == "step" and reqs[op["name"]].num_computed_tokens >= reqs[op["name"]].num_prompt_tokens
        ):
            req = reqs[op["name"]]
            for t in op["tokens"] if kind == "decode" else [op["token"]]:
                req.append_output_token_ids(t)
                run(req, 1)
        elif kind == "step":
            req = reqs[op["name"]]
            run(req, min(op["n"], req.num_prompt_tokens - req.num_computed_tokens))
        elif kind == "finish":
            req = reqs.pop(op["name"])
            rec["donated"] = cache.page_tables(req)[1][0]
            cache.release(req)
        else:
            raise ValueError(f"unknown op {kind!r}")
        if kind != "finish":
            req = reqs[op["name"]]
            rec["kv"] = cache.page_tables(req)[0][: req.num_computed_tokens]
            rec["protected"] = cache._live[req.request_id].state.protected
        tree = cache.tree
        mamba = cache.component
        pools = [cache.pool.num_free, mamba.states.num_free, tree.evictable_size(), mamba.evictable]
        rec["pools"] = pools
        rec["states"] = _states(tree)
        cache.check_invariants()
        out.append(rec)
    return out


@pytest.mark.parametrize("path", REQUEST_FIXTURES, ids=lambda p: p.stem)
def test_mamba_requests_replay_sglang_0_5_23(path: Path) -> None:
    """Admission (copy-on-write of the hit's state), a state at every prefill chunk end and at
    finish (donated), KV rows, pools and held states agree with SGLang's own flow."""
    fixture = json.loads(path.read_text())
    diffs = _diffs(replay_requests(fixture["scenario"]), fixture)
    assert not diffs, "\n".join(diffs[:10])
