"""Replay Mamba-hybrid tree scenarios through SGLang 0.5.23's own ``UnifiedRadixCache``
(components FULL + MAMBA, python tree core, no_buffer mode: page 1, no extra buffer) over its
real ``HybridReqToTokenPool`` (``MambaSlotAllocator``) and ``TokenToKVPoolAllocator`` on CPU,
and record what it does. Everything is upstream code with small tensors (2 heads of 16, CPU);
the only stand-ins are the dummy ServerArgs (``_mamba_cache_chunk_size`` preset to FLA's 64, as
SGLang's own unit-test kit does) and the shim's torchvision stub.

A scenario is two pool sizes (KV tokens, Mamba slots) and ops:

  {"op": "insert", "tokens"}            alloc len(tokens) KV slots and 1 state slot (skipped,
                                        ok=False, if either pool is short), insert; a state
                                        the tree already had is freed (cleanup_after_caching_req)
  {"op": "match", "tokens"}             match_prefix
  {"op": "lock", "tokens", "name"} / {"op": "unlock", "name"}
  {"op": "evict", "full", "mamba"}      evict(EvictParams(num_tokens, mamba_num))

Each op records its result, the pools [KV available, state slots available, full evictable,
Mamba evictable] and the states held: sorted [path tokens, slot] of every node with a state.
Run ``.venv-upstream/bin/python -m prefixcache.experiments.upstream.sglang_mamba_driver`` to
(re)write tests/fixtures/upstream/sglang_mamba/sglang_mamba_*.json.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

Op = dict[str, Any]
# A folder of their own: test_upstream_fixtures reads every upstream/*.json as a dense fixture.
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "sglang_mamba"
UPSTREAM = (
    "SGLang 0.5.23 UnifiedRadixCache(FULL+MAMBA, python tree core, no_buffer) + "
    "HybridReqToTokenPool + TokenToKVPoolAllocator"
)


# ---------------------------------------------------------------------------- scenarios
def shared_then_diverge() -> dict[str, Any]:
    """A shared prefix, then divergence: the junction is a tombstone, so a third request
    sharing only the prefix hits 0 until a state is stored there."""
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8]
    ops: list[Op] = [
        {"op": "insert", "tokens": a},
        {"op": "match", "tokens": a + [9]},
        {"op": "insert", "tokens": b},
        {"op": "match", "tokens": [1, 2, 3, 10]},
        {"op": "insert", "tokens": [1, 2, 3]},
        {"op": "match", "tokens": [1, 2, 3, 10]},
        {"op": "insert", "tokens": a},
        {"op": "match", "tokens": b + [9]},
    ]
    return {"name": "shared_diverge", "kv_tokens": 32, "mamba_slots": 6, "ops": ops}


def internal_state_eviction() -> dict[str, Any]:
    """Evict an internal node's state (tombstone), then match through it; then a leaf."""
    ops: list[Op] = [
        {"op": "insert", "tokens": [1, 2, 3]},
        {"op": "insert", "tokens": [1, 2, 3, 4, 5]},
        {"op": "insert", "tokens": [1, 2, 3, 6, 7]},
        {"op": "match", "tokens": [1, 2, 3, 4, 5, 9]},
        {"op": "evict", "full": 0, "mamba": 1},
        {"op": "match", "tokens": [1, 2, 3, 9]},
        {"op": "match", "tokens": [1, 2, 3, 4, 5, 9]},
        {"op": "evict", "full": 0, "mamba": 1},
        {"op": "match", "tokens": [1, 2, 3, 6, 7, 9]},
        {"op": "evict", "full": 2, "mamba": 0},
        {"op": "match", "tokens": [1, 2, 3, 4, 5, 9]},
    ]
    return {"name": "internal_eviction", "kv_tokens": 32, "mamba_slots": 6, "ops": ops}


def cut_to_checkpoint() -> dict[str, Any]:
    """A full-KV hit longer than the deepest state: cut back; a locked node keeps its state."""
    ops: list[Op] = [
        {"op": "insert", "tokens": [5, 6]},
        {"op": "insert", "tokens": [5, 6, 7, 8, 9, 10]},
        {"op": "match", "tokens": [5, 6, 7, 8, 11]},
        {"op": "match", "tokens": [5, 6, 7, 8, 9, 10, 11]},
        {"op": "lock", "tokens": [5, 6, 7, 8, 9, 10, 11], "name": "A"},
        {"op": "evict", "full": 0, "mamba": 2},
        {"op": "match", "tokens": [5, 6, 1]},
        {"op": "evict", "full": 6, "mamba": 0},
        {"op": "unlock", "name": "A"},
        {"op": "evict", "full": 0, "mamba": 1},
        {"op": "match", "tokens": [5, 6, 7, 8, 9, 10, 11]},
    ]
    return {"name": "cut_to_checkpoint", "kv_tokens": 32, "mamba_slots": 4, "ops": ops}


def seeded(seed: int, kv_tokens: int, mamba_slots: int, n_ops: int) -> dict[str, Any]:
    """Random inserts over a few shared stems, matches, locks and both evictions, sized so that
    both pools run short (inserts that do not fit are skipped by both replayers)."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 40) for _ in range(rng.randrange(1, 5))] for _ in range(3)]
    ops: list[Op] = []
    locks: list[str] = []
    for i in range(n_ops):
        r = rng.random()
        tokens = list(rng.choice(stems)) + [rng.randrange(1, 7) for _ in range(rng.randrange(0, 4))]
        if r < 0.35:
            ops.append({"op": "insert", "tokens": tokens})
        elif r < 0.55:
            ops.append({"op": "match", "tokens": tokens})
        elif r < 0.72:
            ops.append({"op": "evict", "full": rng.choice([0, 0, 1, 2, 4]), "mamba": rng.randrange(0, 3)})
        elif r < 0.84:
            name = f"L{i}"
            locks.append(name)
            ops.append({"op": "lock", "tokens": tokens, "name": name})
        elif locks:
            ops.append({"op": "unlock", "name": locks.pop(rng.randrange(len(locks)))})
    for name in locks:
        ops.append({"op": "unlock", "name": name})
    ops.append({"op": "evict", "full": kv_tokens, "mamba": 0})
    return {"name": f"seeded{seed}", "kv_tokens": kv_tokens, "mamba_slots": mamba_slots, "ops": ops}


def all_scenarios() -> list[dict[str, Any]]:
    return [
        shared_then_diverge(),
        internal_state_eviction(),
        cut_to_checkpoint(),
        seeded(1, 48, 5, 150),
        seeded(2, 30, 3, 150),
    ]


# ---------------------------------------------------------------------------- upstream
def _build(  # pragma: no cover - needs SGLang
    kv_tokens: int, mamba_slots: int, events: bool = False
) -> tuple[Any, Any, Any]:
    import torch
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(model_path="dummy", page_size=1)
    args._mamba_cache_chunk_size = CHUNK_SIZE  # no HF config: SGLang's test kit presets it too
    set_global_server_args_for_scheduler(args)
    mamba_layers = [0, 1, 2]
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=32,
            n_groups=1,
            num_heads=2,
            head_dim=16,
            state_size=16,
            conv_kernel=4,
        )
    rows = HybridReqToTokenPool(
        size=4,
        mamba_size=mamba_slots,
        mamba_spec_state_size=4,
        max_context_len=128,
        device="cpu",
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=mamba_layers),
        mamba_layer_ids=mamba_layers,
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=3,
    )
    kv = HybridLinearKVPool(
        size=kv_tokens,
        dtype=torch.bfloat16,
        page_size=1,
        head_num=1,
        head_dim=8,
        full_attention_layer_ids=[3],
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=rows.mamba_pool,
    )
    alloc = TokenToKVPoolAllocator(
        size=kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
    )
    tree = UnifiedRadixCache(
        params=CacheInitParams(
            req_to_token_pool=rows,
            token_to_kv_pool_allocator=alloc,
            page_size=1,
            disable=False,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA),
            enable_mamba_extra_buffer=False,
            tree_core_backend="python",
            enable_kv_cache_events=events,
        )
    )
    return tree, alloc, rows


def _states(tree: Any) -> list[list[Any]]:  # pragma: no cover - needs SGLang
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    out: list[list[Any]] = []
    stack = [(tree.tree_core.root_node, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + [int(t) for t in child.key.token_ids]
            v = child.component_data[ComponentType.MAMBA].value
            if v is not None:
                out.append([p, int(v.reshape(-1)[0])])
            stack.append((child, p))
    return sorted(out)


def replay_upstream(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:  # pragma: no cover
    """``events``: with ``enable_kv_cache_events``, each record also holds the events drained
    after its op (the first, the construction's AllBlocksCleared too)."""
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from prefixcache.experiments.upstream.kv_event_cases import event_json
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    tree, alloc, rows = _build(sc["kv_tokens"], sc["mamba_slots"], events)
    mamba = rows.mamba_allocator
    locks: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        if kind == "insert":
            ok = alloc.available_size() >= len(op["tokens"]) and mamba.available_size() >= 1
            rec["ok"] = ok
            if ok:
                idx, slot = alloc.alloc(len(op["tokens"])), mamba.alloc(1)
                res = tree.insert(
                    InsertParams(
                        key=RadixKey(list(op["tokens"])), value=idx.clone(), mamba_value=slot.clone()
                    )
                )
                if res.mamba_exist:
                    mamba.free(slot)
                rec["prefix_len"] = res.prefix_len
                rec["mamba_exist"] = bool(res.mamba_exist)
        elif kind in ("match", "lock"):
            m = tree.match_prefix(MatchPrefixParams(key=RadixKey(list(op["tokens"]))))
            rec["length"] = m.device_prefix_len
            rec["full_length"] = m.full_kv_hit_length
            rec["indices"] = [int(x) for x in tree.path_device_indices(m.last_device_node)]
            from sglang.srt.mem_cache.unified_cache.components import ComponentType

            v = tree.tree_core.get_component_device_value(m.best_match_node, ComponentType.MAMBA)
            rec["state"] = None if v is None else int(v.reshape(-1)[0])
            if kind == "lock":
                locks[op["name"]] = tree.lock(m.last_device_node)
        elif kind == "unlock":
            tree.unlock(locks.pop(op["name"]))
        elif kind == "evict":
            r = tree.evict(EvictParams(num_tokens=op["full"], mamba_num=op["mamba"]))
            rec["freed"] = [r.num_tokens_evicted, r.mamba_num_evicted]
        else:
            raise ValueError(f"unknown op {kind!r}")
        rec["pools"] = [
            alloc.available_size(),
            mamba.available_size(),
            tree.full_evictable_size(),
            tree.mamba_evictable_size(),
        ]
        rec["states"] = _states(tree)
        if events:
            rec["events"] = [event_json(e) for e in tree.take_events()]
        records.append(rec)
    return records


EVENT_FIXTURES = FIXTURES.parent / "events" / "sglang_mamba_streams"


def record_events() -> None:  # pragma: no cover - needs SGLang
    """The tree scenarios with KV events on, to tests/fixtures/upstream/events/
    sglang_mamba_streams/ (tests/test_radix_hybrid_events.py)."""
    EVENT_FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_scenarios():
        out = {"upstream": UPSTREAM, "scenario": sc, "records": replay_upstream(sc, events=True)}
        path = EVENT_FIXTURES / f"sglang_mamba_events_{sc['name']}.json"
        path.write_text(_dump(out))
        print(f"wrote {path.name}")


# ---------------------------------------------------------------------------- requests
# A request scenario: pool sizes and ops on named requests, driven as SGLang's scheduler drives
# them (batches of one), page 1:
#   {"op": "admit", "name", "tokens", "chunk"}  match_prefix(tokens[:-1], cow_mamba=True: the
#        request's own state slot is taken here, evicting a state if none is free), lock the
#        node, alloc_token_slots(chunk) (evicting leaves for the shortfall), run the chunk,
#        checkpoint (cache_unfinished_req)
#   {"op": "chunk", "name", "n"}          the next prefill chunk, then checkpoint
#   {"op": "decode", "name", "tokens"}    one decode step per output token (no checkpoint)
#   {"op": "finish", "name"}              release_kv_cache(checkpoint=True): checkpoint the
#        computed tokens (donating the request's state slot), unlock, free the unused room
# Records: the hit, the state slot it was copied from, the request's own state slot and KV
# row, the pools and the states the tree holds.
def request_scenarios() -> list[dict[str, Any]]:
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    ops: list[Op] = [
        {"op": "admit", "name": "A", "tokens": a, "chunk": 3},
        {"op": "chunk", "name": "A", "n": 3},
        {"op": "chunk", "name": "A", "n": 2},
        {"op": "decode", "name": "A", "tokens": [20, 21]},
        {"op": "finish", "name": "A"},
        # shares 5 tokens with A: the hit is cut back to A's chunk-end state at 3... or 6
        {"op": "admit", "name": "B", "tokens": [1, 2, 3, 4, 5, 9, 9, 9], "chunk": 8},
        {"op": "finish", "name": "B"},
        # A again, with its output: the whole conversation is a checkpoint
        {"op": "admit", "name": "C", "tokens": a + [20, 21, 30], "chunk": 11},
        {"op": "finish", "name": "C"},
        # a long one that needs state and KV eviction
        {"op": "admit", "name": "D", "tokens": list(range(40, 60)), "chunk": 5},
        {"op": "chunk", "name": "D", "n": 5},
        {"op": "chunk", "name": "D", "n": 5},
        {"op": "chunk", "name": "D", "n": 5},
        {"op": "finish", "name": "D"},
        {"op": "admit", "name": "E", "tokens": [1, 2, 3, 4, 5, 6, 7], "chunk": 7},
        {"op": "finish", "name": "E"},
    ]
    return [
        {"name": "req_chunked", "kv_tokens": 35, "mamba_slots": 4, "ops": ops},
        seeded_requests(1, 60),
        seeded_requests(2, 60),
    ]


def seeded_requests(seed: int, n_ops: int) -> dict[str, Any]:
    """Up to two live requests over shared stems: admissions, steps (the next prefill chunk,
    or one decode step once the prompt is done), finishes. Sized so that states and KV get
    evicted but no allocation fails (SGLang asserts on a missing state slot)."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 30) for _ in range(rng.randrange(2, 7))] for _ in range(3)]
    ops: list[Op] = []
    live: list[str] = []
    for i in range(n_ops):
        r = rng.random()
        if len(live) < 2 and (r < 0.3 or not live):
            name = f"R{i}"
            stem = rng.choice(stems)
            tokens = stem[: rng.randrange(1, len(stem) + 1)] + [
                rng.randrange(1, 5) for _ in range(rng.randrange(1, 6))
            ]
            ops.append({"op": "admit", "name": name, "tokens": tokens, "chunk": rng.randrange(1, 7)})
            live.append(name)
        elif r < 0.8:
            ops.append(
                {
                    "op": "step",
                    "name": rng.choice(live),
                    "n": rng.randrange(1, 5),
                    "token": rng.randrange(1, 5),
                }
            )
        else:
            ops.append({"op": "finish", "name": live.pop(rng.randrange(len(live)))})
    ops.extend({"op": "finish", "name": name} for name in live)
    return {"name": f"req_seeded{seed}", "kv_tokens": 41, "mamba_slots": 6, "ops": ops}


class _Kv:  # pragma: no cover - needs SGLang
    def __init__(self, row: int) -> None:
        self.req_pool_idx = row
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.mamba_pool_idx: Any = None
        self.mamba_last_track_seqlen = None
        self.mamba_prev_track_seqlen = None
        self.mamba_cow_src_index: Any = None
        self.mamba_needs_clear = False
        self.swa_evict_floor = 0

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


class _Req:  # pragma: no cover - needs SGLang
    """The fields of SGLang's Req that match_prefix(cow_mamba) and checkpoint_into_tree read."""

    def __init__(self, rid: str, tokens: list[int], row: int) -> None:
        self.rid = rid
        self.origin_input_ids = list(tokens)
        self.output_ids: list[int] = []
        self.extra_key = self.cache_salt = self.session_id = self.kv_rotation_base = None
        self.session = None
        self.priority = None
        self.lock: Any = None
        self.last_node: Any = None
        self.kv = _Kv(row)
        self.done = False
        self.computed = 0
        self.allocated = 0

    def finished(self) -> bool:
        return self.done

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids


def replay_requests_upstream(sc: dict[str, Any]) -> list[dict[str, Any]]:  # pragma: no cover
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    tree, alloc, rows = _build(sc["kv_tokens"], sc["mamba_slots"])
    mamba = rows.mamba_allocator
    reqs: dict[str, _Req] = {}
    free_rows = list(range(rows.req_to_token.shape[0] - 1, 0, -1))
    records: list[dict[str, Any]] = []

    def take_kv(req: _Req, n: int) -> None:
        short = n - alloc.available_size()
        if short > 0:
            tree.evict(EvictParams(num_tokens=short))
        idx = alloc.alloc(n)
        assert idx is not None, "out of KV"
        rows.req_to_token[req.kv.req_pool_idx, req.allocated : req.allocated + n] = idx
        req.allocated += n

    def checkpoint(req: _Req) -> None:
        tree.checkpoint_into_tree(req, up_to=req.computed)

    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        if kind == "admit":
            req = reqs[op["name"]] = _Req(op["name"], op["tokens"], free_rows.pop())
            key = RadixKey(list(op["tokens"])[:-1])
            m = tree.match_prefix(MatchPrefixParams(key=key, req=req, cow_mamba=True))
            hit = m.device_prefix_len
            rows.req_to_token[req.kv.req_pool_idx, :hit] = tree.path_device_indices(m.last_device_node)
            req.kv.cache_protected_len = req.computed = req.allocated = hit
            req.lock = tree.lock(m.last_device_node)
            if not req.kv.holds_mamba:  # a miss: alloc_req_slots takes the slot (allocation.py)
                if mamba.available_size() < 1:
                    tree.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
                req.kv.mamba_pool_idx = mamba.alloc(1)[0]
            src = req.kv.mamba_cow_src_index
            rec["hit"] = hit
            rec["cow_source"] = 0 if src is None else int(src.reshape(-1)[0])
            rec["state"] = int(req.kv.mamba_pool_idx)
            n = min(op["chunk"], len(op["tokens"]) - hit)  # the rest of the prompt at most
            take_kv(req, n)
            req.computed += n
            checkpoint(req)
        elif kind == "chunk":
            req = reqs[op["name"]]
            take_kv(req, op["n"])
            req.computed += op["n"]
            checkpoint(req)
        elif kind == "decode" or (
            kind == "step" and reqs[op["name"]].computed >= len(reqs[op["name"]].origin_input_ids)
        ):
            req = reqs[op["name"]]
            for t in op["tokens"] if kind == "decode" else [op["token"]]:
                req.output_ids.append(t)
                take_kv(req, 1)
                req.computed += 1
        elif kind == "step":  # the next prefill chunk, the rest of the prompt at most
            req = reqs[op["name"]]
            n = min(op["n"], len(req.origin_input_ids) - req.computed)
            take_kv(req, n)
            req.computed += n
            checkpoint(req)
        elif kind == "finish":
            req = reqs.pop(op["name"])
            req.done = True
            own = int(req.kv.mamba_pool_idx)
            checkpoint(req)
            tree.unlock(req.lock)
            if req.allocated > req.computed:
                alloc.free(rows.req_to_token[req.kv.req_pool_idx, req.computed : req.allocated])
            rec["donated"] = own
            free_rows.append(req.kv.req_pool_idx)
        else:
            raise ValueError(f"unknown op {kind!r}")
        if kind != "finish":
            r = reqs[op["name"]]
            rec["kv"] = [int(x) for x in rows.req_to_token[r.kv.req_pool_idx, : r.computed]]
            rec["protected"] = r.kv.cache_protected_len
        rec["pools"] = [
            alloc.available_size(),
            mamba.available_size(),
            tree.full_evictable_size(),
            tree.mamba_evictable_size(),
        ]
        rec["states"] = _states(tree)
        records.append(rec)
    return records


def _dump(out: dict[str, Any]) -> str:
    """Compact JSON, one op record per line (the fixtures stay small and diffable)."""
    records = ",\n".join(json.dumps(r, separators=(",", ":")) for r in out["records"])
    head = json.dumps({k: v for k, v in out.items() if k != "records"}, separators=(",", ":"))
    return head[:-1] + ',"records":[\n' + records + "\n]}\n"


def main() -> None:  # pragma: no cover - needs SGLang
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_scenarios():
        out = {"upstream": UPSTREAM, "scenario": sc, "records": replay_upstream(sc)}
        path = FIXTURES / f"sglang_mamba_{sc['name']}.json"
        path.write_text(_dump(out))
        print(f"wrote {path.name}: {len(sc['ops'])} ops")
    for sc in request_scenarios():
        out = {"upstream": UPSTREAM, "scenario": sc, "records": replay_requests_upstream(sc)}
        path = FIXTURES / f"sglang_mamba_{sc['name']}.json"
        path.write_text(_dump(out))
        print(f"wrote {path.name}: {len(sc['ops'])} ops")
    record_events()


if __name__ == "__main__":
    main()
