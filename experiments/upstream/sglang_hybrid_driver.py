"""Replay hybrid-SWA tree scenarios through SGLang 0.5.23's own ``UnifiedRadixCache``
(components FULL + SWA, the Python tree core) over its real ``SWATokenToKVPoolAllocator`` on
CPU, and record what it does. The KV pool object under the allocator is a stand-in holding only
the full -> SWA mapping (no KV tensors: nothing here reads KV). Everything else is upstream code.

A tree scenario is a window, a page size, two pool sizes (usable tokens) and ops:

  {"op": "insert", "tokens", "evicted": int}   alloc len(tokens) slots from both pools (as
                                              alloc / alloc_extend would), free the SWA of the
                                              first ``evicted`` (the inserter's frontier), insert
  {"op": "match", "tokens"}                   match_prefix
  {"op": "evict", "full", "swa"}              evict(EvictParams(num_tokens, swa_num_tokens))
  {"op": "lock", "tokens", "name"} / {"op": "unlock", "name"} / {"op": "release_swa", "name"}
                                              lock the match's node / unlock / early SWA release

A scenario with ``"is_eagle": true`` (and a request scenario with ``options.is_eagle``) builds the
tree with ``CacheInitParams.is_eagle`` (EAGLE bigram keys). Each op records its result and the
pools: [full available, SWA available, full evictable, SWA evictable] (tokens). Run
``python -m prefixcache.experiments.upstream.sglang_hybrid_driver`` with the upstream venv to
(re)write tests/fixtures/upstream/sglang_hybrid_*.json.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

Op = dict[str, Any]
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "sglang_hybrid"
UPSTREAM = "SGLang 0.5.23 UnifiedRadixCache(FULL+SWA, python tree core) + SWATokenToKVPoolAllocator"


# ---------------------------------------------------------------------------- scenarios
def scenario_12() -> dict[str, Any]:
    """``test_swa_radix_cache_1`` (window 4, page 1), then the larger SWA eviction variant."""
    ops: list[Op] = [
        {"op": "insert", "tokens": [1, 2, 3]},
        {"op": "insert", "tokens": [1, 2, 3, 4, 5, 6, 7]},
        {"op": "insert", "tokens": [10, 11, 12]},
        {"op": "insert", "tokens": [1, 2, 3, 4, 5, 60, 70]},
        {"op": "evict", "full": 1, "swa": 0},
        {"op": "evict", "full": 0, "swa": 1},
        {"op": "evict", "full": 1, "swa": 2},
        {"op": "match", "tokens": [1, 2, 3, 4, 5]},
        {"op": "match", "tokens": [1, 2, 3, 4, 5, 60, 70]},
        {"op": "evict", "full": 0, "swa": 5},
        {"op": "match", "tokens": [1, 2, 3, 4, 5]},
        {"op": "match", "tokens": [1, 2, 3, 4, 5, 60, 70]},
    ]
    return {
        "name": "scenario12",
        "window": 4,
        "page_size": 1,
        "full_tokens": 32,
        "swa_tokens": 32,
        "ops": ops,
    }


def scenario_12_eagle() -> dict[str, Any]:
    """``test_swa_radix_cache_eagle``: scenario 12's ops on a tree with ``is_eagle=True``
    (bigram keys; each insert hands over one slot per raw token, the tree keeps one per bigram)."""
    return {**scenario_12(), "name": "scenario12_eagle", "is_eagle": True}


def seeded(
    seed: int, page_size: int, window: int, full_tokens: int, swa_tokens: int, n_ops: int
) -> dict[str, Any]:
    """Random inserts over a few shared prefixes, matches, locks and both evictions, sized so
    that both pools run short (inserts that do not fit are skipped by both replayers)."""
    rng = random.Random(seed)
    p = page_size
    stems = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 4) * p)] for _ in range(3)]
    ops: list[Op] = []
    locks: list[str] = []
    for i in range(n_ops):
        r = rng.random()
        tokens = list(rng.choice(stems)) + [rng.randrange(1, 9) for _ in range(rng.randrange(0, 4) * p)]
        if r < 0.35:
            evicted = rng.choice([0, 0, max(0, (len(tokens) - window) // p * p)])
            ops.append({"op": "insert", "tokens": tokens, "evicted": evicted})
        elif r < 0.5:
            ops.append({"op": "match", "tokens": tokens})
        elif r < 0.62:
            ops.append({"op": "evict", "full": rng.randrange(0, 3) * p, "swa": rng.randrange(0, 3) * p})
        elif r < 0.77:
            name = f"L{i}"
            locks.append(name)
            ops.append({"op": "lock", "tokens": tokens, "name": name})
        elif r < 0.9 and locks:
            ops.append({"op": "unlock", "name": locks.pop(rng.randrange(len(locks)))})
        elif locks:
            ops.append({"op": "release_swa", "name": rng.choice(locks)})
    for name in locks:
        ops.append({"op": "unlock", "name": name})
    ops.append({"op": "evict", "full": full_tokens, "swa": 0})
    return {
        "name": f"seeded{seed}_p{p}",
        "window": window,
        "page_size": p,
        "full_tokens": full_tokens,
        "swa_tokens": swa_tokens,
        "ops": ops,
    }


def all_scenarios() -> list[dict[str, Any]]:
    return [
        scenario_12(),
        scenario_12_eagle(),
        seeded(1, 1, 4, 40, 24, 120),
        seeded(2, 1, 3, 48, 20, 120),
        seeded(3, 4, 6, 64, 40, 120),
        seeded(4, 4, 4, 96, 48, 120),
    ]


# ---------------------------------------------------------------------------- upstream
def _mapping_only_pool() -> Any:  # pragma: no cover - needs SGLang
    """What the allocator and the SWA component touch of SWAKVPool: the full -> SWA mapping."""
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool

    class MappingOnlyPool(BaseSWAKVPool):
        def __init__(self) -> None:
            self.full_kv_pool = self.swa_kv_pool = None
            self.full_to_swa_index_mapping = None

        def register_mapping(self, m):  # type: ignore[no-untyped-def]
            self.full_to_swa_index_mapping = m

        def translate_loc_from_full_to_swa(self, idx):  # type: ignore[no-untyped-def]
            return self.full_to_swa_index_mapping[idx]

        def get_state_buf_infos(self):  # type: ignore[no-untyped-def]
            return [], [], []

        def get_key_buffer(self, *a):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        get_value_buffer = get_kv_buffer = set_kv_buffer = get_key_buffer

    return MappingOnlyPool()


def replay_upstream(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:  # pragma: no cover
    """``events``: with ``enable_kv_cache_events``, each record also holds the events drained
    after its op (the first, the construction's AllBlocksCleared too)."""
    import torch
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    class NoRows:
        req_to_token = torch.zeros((1, 1), dtype=torch.int64)

    p, w = sc["page_size"], sc["window"]
    alloc = SWATokenToKVPoolAllocator(
        sc["full_tokens"], sc["swa_tokens"], p, torch.float16, "cpu", _mapping_only_pool(), False
    )
    if p > 1:
        alloc.full_attn_allocator.use_triton_kernels = False
        alloc.swa_attn_allocator.use_triton_kernels = False
    tree = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=NoRows(),
            token_to_kv_pool_allocator=alloc,
            page_size=p,
            sliding_window_size=w,
            is_eagle=sc.get("is_eagle", False),
            tree_components=(ComponentType.FULL, ComponentType.SWA),
            tree_core_backend="python",
            enable_kv_cache_events=events,
        )
    )
    locks: dict[str, Any] = {}
    records: list[dict[str, Any]] = []

    def take(n: int) -> torch.Tensor | None:
        if p == 1:
            return alloc.alloc(n)
        t = torch.tensor
        return alloc.alloc_extend(t([0]), t([0]), t([n]), t([n]), t([-1]), n)

    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        if kind == "insert":
            idx = take(len(op["tokens"]))
            rec["ok"] = idx is not None
            if idx is not None:
                ev = op.get("evicted", 0)
                if ev:
                    alloc.free_swa_segment(idx[:ev].clone(), start_pos=0)
                res = tree.insert(
                    InsertParams(
                        key=RadixKey(list(op["tokens"])),
                        value=idx.clone(),
                        component_evicted_seqlens={ComponentType.SWA: ev},
                    )
                )
                rec["prefix_len"] = res.prefix_len
        elif kind in ("match", "lock"):
            m = tree.match_prefix(MatchPrefixParams(key=RadixKey(list(op["tokens"]))))
            full = tree.path_device_indices(m.last_device_node)
            rec["length"] = m.device_prefix_len
            rec["full"] = [int(x) for x in full]
            rec["swa"] = [int(x) for x in alloc.full_to_swa_index_mapping[full]]
            if kind == "lock":
                locks[op["name"]] = tree.lock(m.last_device_node)
        elif kind == "unlock":
            tree.unlock(locks.pop(op["name"]))
        elif kind == "release_swa":
            tree.release_swa(locks[op["name"]])
        elif kind == "evict":
            r = tree.evict(EvictParams(num_tokens=op["full"], swa_num_tokens=op["swa"]))
            rec["freed"] = [r.num_tokens_evicted, r.swa_num_tokens_evicted]
        else:
            raise ValueError(f"unknown op {kind!r}")
        rec["pools"] = [
            alloc.full_available_size(),
            alloc.swa_available_size(),
            tree.full_evictable_size(),
            tree.swa_evictable_size(),
        ]
        if events:
            from prefixcache.experiments.upstream.kv_event_cases import event_json

            rec["events"] = [event_json(e) for e in tree.take_events()]
        records.append(rec)
    return records


EVENT_FIXTURES = FIXTURES.parent / "events" / "sglang_swa_streams"


def record_events() -> None:  # pragma: no cover - needs SGLang
    """The tree scenarios (plain keys: kv_events is refused with EAGLE) with KV events on, to
    tests/fixtures/upstream/events/sglang_swa_streams/ (tests/test_radix_hybrid_events.py)."""
    EVENT_FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_scenarios():
        if sc.get("is_eagle"):
            continue
        out = {"system": "sglang-hybrid", "upstream": UPSTREAM, "scenario": sc,
               "records": replay_upstream(sc, events=True)}
        path = EVENT_FIXTURES / f"sglang_swa_events_{sc['name']}.json"
        path.write_text(json.dumps(out, separators=(",", ":")))
        print(path.name, file=sys.stderr)


def sizing_cases() -> list[dict[str, Any]]:
    """(budget split) cases for scenario 13, run through HybridSWAPoolConfigurator itself."""
    return [
        {"n_full": 10, "n_swa": 52, "per_layer_tokens": 1000, "page_size": 1, "window": 512, "ratio": 0.8},
        {"n_full": 1, "n_swa": 5, "per_layer_tokens": 4096, "page_size": 16, "window": 1024, "ratio": 0.8},
        {"n_full": 1, "n_swa": 1, "per_layer_tokens": 1000, "page_size": 4, "window": 128, "ratio": 0.5},
        {"n_full": 1, "n_swa": 1, "per_layer_tokens": 100, "page_size": 4, "window": 128, "ratio": 0.8},
    ]


def size_upstream(case: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - needs SGLang
    from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator

    conf = object.__new__(HybridSWAPoolConfigurator)  # its __init__ reads a model config
    conf._full_layers_num, conf._swa_layers_num = case["n_full"], case["n_swa"]
    conf._swa_full_tokens_ratio = case["ratio"]
    conf._sliding_window_size, conf._page_size = case["window"], case["page_size"]
    conf._enable_unified_memory = False
    conf._full_per_token = conf._swa_per_token = 1  # one layer-token unit per token and layer
    conf._draft_full_layers_num = conf._draft_swa_layers_num = conf._draft_swa_full_layers_num = 0
    conf._draft_cell_size = 0
    conf._fused_full_entry = conf._fused_swa_entry = None
    conf._recompute_cell_size()
    budget = case["per_layer_tokens"] * (case["n_full"] + case["n_swa"])
    try:
        cfg = conf.calculate_pool_sizes(budget, case["page_size"])
    except ValueError as e:
        return {**case, "error": str(e).split(":")[0]}
    return {**case, "full": cfg.full_max_total_num_tokens, "swa": cfg.swa_max_total_num_tokens}


def allocator_upstream() -> dict[str, Any]:  # pragma: no cover - needs SGLang
    """Scenario 14: alloc lowers both pools, free_swa only the SWA pool, free both."""
    import torch
    from prefixcache.experiments.upstream import shim  # noqa: F401
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    out: dict[str, Any] = {}
    for p in (1, 4):
        a = SWATokenToKVPoolAllocator(16 * p, 12 * p, p, torch.float16, "cpu", _mapping_only_pool(), False)
        if p > 1:
            a.full_attn_allocator.use_triton_kernels = a.swa_attn_allocator.use_triton_kernels = False
        steps = [[a.full_available_size(), a.swa_available_size(), a.available_size()]]
        t = torch.tensor
        first = a.alloc(1) if p == 1 else a.alloc_extend(t([0]), t([0]), t([p]), t([p]), t([-1]), p)
        second = (
            a.alloc(3) if p == 1 else a.alloc_extend(t([0]), t([0]), t([3 * p]), t([3 * p]), t([-1]), 3 * p)
        )
        steps.append([a.full_available_size(), a.swa_available_size(), a.available_size()])
        mapped = [int(x) for x in a.full_to_swa_index_mapping[second]]
        a.free_swa(second)
        steps.append([a.full_available_size(), a.swa_available_size(), a.available_size()])
        a.free(first)
        steps.append([a.full_available_size(), a.swa_available_size(), a.available_size()])
        out[f"p{p}"] = {
            "first": [int(x) for x in first],
            "second": [int(x) for x in second],
            "second_swa": mapped,
            "available": steps,
        }
    return out


def main() -> None:  # pragma: no cover - needs SGLang
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_scenarios():
        records = replay_upstream(sc)
        path = FIXTURES / f"sglang_hybrid_{sc['name']}.json"
        path.write_text(
            json.dumps(
                {"system": "sglang-hybrid", "upstream": UPSTREAM, "scenario": sc, "records": records},
                separators=(",", ":"),
            )
        )
        print(path.name, len(records), "ops", file=sys.stderr)
    extra = {
        "system": "sglang-hybrid",
        "upstream": UPSTREAM + " + HybridSWAPoolConfigurator",
        "sizing": [size_upstream(c) for c in sizing_cases()],
        "allocator": allocator_upstream(),
    }
    (FIXTURES / "sglang_hybrid_pools.json").write_text(json.dumps(extra, indent=1))
    print("sglang_hybrid_pools.json", file=sys.stderr)
    record_requests()
    record_events()


# ---------------------------------------------------------------------------- requests
# Request scenarios use experiments/upstream/scenarios.py's ops (new / alloc / run / append /
# release / evict) over a CacheConfig with a hybrid layout; SGLang's scheduler steps are those
# of sglang_driver.py plus maybe_evict_swa before each decode allocation, with the scheduler's
# free groups (token_to_kv_pool_allocator.free_group_begin / free_group_end):
#   run of a last prefill chunk or a decode step   process_batch_result_prefill / _decode: a
#       group opens around the batch's checkpoints (checkpoint_kv_cache) and the releases
#       (release_kv_cache) of the requests that finish in it: the releases that follow it
#   run of a middle prefill chunk   stash_chunked_request: checkpointed outside any group
#   decode alloc   maybe_evict_swa in a group of its own, then alloc_decode outside it
#   admission, evict, a release with no group open (SGLang's retract)   outside any group
# Any op that allocates or evicts ends the open group first.
def tombstone_finish_case() -> dict[str, Any]:
    """Issue 33 case 5: A (60 tokens) decodes until its first page is a tombstone on its own
    locked path; B (A's first 17 tokens, hit 0) finishes at prefill: its checkpoint moves B's
    SWA page onto A's node and frees B's page 6 full-only, its release frees page 7, both in
    one group; A's third decode step afterwards opens a page: 6 (one block [6, 7])."""
    from prefixcache.experiments.upstream.scenarios import Scenario

    s = Scenario("req_tombstone_finish_p16", 528, 16, systems=("sglang",))
    a = list(range(100, 160))
    s.new("A", a).alloc("A").run("A").decode("A", [900 + i for i in range(18)])
    s.new("B", a[:17]).alloc("B").run("B").release("B")
    s.decode("A", [950 + i for i in range(6)]).release("A")
    sc = s.to_json()
    sc["layout"] = [["sliding_window", 32], ["full"]]
    sc["options"] = {"swa_eviction_interval": 1}
    return sc


def request_scenarios() -> list[dict[str, Any]]:
    from prefixcache.experiments.upstream.scenarios import Scenario

    out = []
    cases = ((1, 4, 48, 1), (1, 8, 64, 1), (4, 8, 96, 1), (4, 4, 64, 1), (16, 24, 192, 5), (2, 6, 56, 3))
    # EAGLE (is_eagle=True): the same generator, its own seeds
    eagle = ((1, 4, 48, 1), (1, 8, 64, 1), (4, 8, 96, 1), (2, 6, 56, 3))
    runs = [(seed, case, False) for seed, case in enumerate(cases, start=1)]
    runs += [(seed, case, True) for seed, case in enumerate(eagle, start=len(cases) + 1)]
    for seed, (p, window, cap, n_swa), is_eagle in runs:
        rng = random.Random(seed)
        s = Scenario(f"req{seed}_p{p}" + ("_eagle" if is_eagle else ""), cap, p, systems=("sglang",))
        k = max(1, p // 4)  # longer prompts on big pages, so that whole pages get shared
        stems = [[rng.randrange(1, 500) for _ in range(rng.randrange(3, 14) * k)] for _ in range(3)]
        live: list[str] = []
        for i in range(14):
            rid = f"q{i}"
            prompt = list(rng.choice(stems))[: rng.randrange(2, 14) * k] + [
                rng.randrange(500, 900) for _ in range(rng.randrange(1, 7))
            ]
            s.new(rid, prompt)
            if rng.random() < 0.3 and len(prompt) > 3:
                s.alloc(rid, 1).run(rid).alloc(rid).run(rid)  # chunked prefill
            else:
                s.alloc(rid).run(rid)
            if rng.random() < 0.6:
                s.decode(rid, [rng.randrange(900, 999) for _ in range(rng.randrange(1, 3 * window))])
            live.append(rid)
            while len(live) > 2 or (live and rng.random() < 0.4):
                s.release(live.pop(rng.randrange(len(live))))
            if rng.random() < 0.15:
                s.evict(rng.randrange(1, 8))
        for rid in live:
            s.release(rid)
        sc = s.to_json()
        sc["layout"] = [["sliding_window", window]] * n_swa + [["full"]]
        sc["options"] = {"swa_eviction_interval": 2, **({"is_eagle": True} if is_eagle else {})}
        out.append(sc)
    out.append(tombstone_finish_case())
    return out


def grow_row(  # pragma: no cover - needs SGLang
    alloc: Any, tree: Any, row: Any, r: Any, n: int, decode: bool, ps: int
) -> bool:
    """Room for ``n`` more tokens of request ``r`` (its req_to_token ``row``), as SGLang's
    scheduler allocates them: alloc at page 1, alloc_decode / alloc_extend above, evicting
    first. Shared by the SWA, Mamba and HiCache recorders (needs SGLang)."""
    import torch

    start = r.allocated
    t = torch.tensor
    if ps == 1:
        alloc.evict_to_free_tokens(tree, n)
        out = alloc.alloc(n)
    elif decode:
        alloc.evict_to_free_tokens(tree, ps)
        out = alloc.alloc_decode(t([start + 1]), t([start + 1]), row[start - 1 : start].clone())
    else:
        alloc.evict_to_free_tokens(tree, n + ps)
        last = row[start - 1 : start].clone() if start else t([-1])
        out = alloc.alloc_extend(t([start]), t([start]), t([start + n]), t([start + n]), last, n)
    if out is None:
        return False
    row[start : start + n] = out
    r.allocated = start + n
    return True


def release_row(tree: Any, r: Any, ps: int) -> None:  # pragma: no cover - needs SGLang
    """release_kv_cache(req, tree, checkpoint=True): checkpoint what was computed, free the
    request's row past the protected prefix, unlock, free the unused tail pages."""
    r.done = True
    owned = r.computed
    if owned:
        tree.checkpoint(r, up_to=owned)
    tree.free_kv_row(r.kv, [(r.kv.cache_protected_len, owned)])
    tree.unlock(r.lock)
    r.lock = None
    tail = -(-owned // ps) * ps
    if r.allocated > tail:
        tree.free_kv_row(r.kv, [(tail, r.allocated)])


def replay_requests_upstream(sc: dict[str, Any]) -> list[dict[str, Any]]:  # pragma: no cover - needs SGLang
    import os

    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = str(sc["options"]["swa_eviction_interval"])
    import torch
    from prefixcache.backends.radix.swa_pool import swa_pool_sizes
    from prefixcache.experiments.upstream import shim  # noqa: F401
    from prefixcache.experiments.upstream.sglang_driver import _ReqToTokenPool
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from prefixcache import CacheConfig

    ps, window = sc["page_size"], sc["layout"][0][1]
    sizes = swa_pool_sizes(CacheConfig(sc["capacity_tokens"], ps, layout=[tuple(x) for x in sc["layout"]]))
    alloc = SWATokenToKVPoolAllocator(
        sizes.full_tokens, sizes.swa_tokens, ps, torch.float16, "cpu", _mapping_only_pool(), False
    )
    if ps > 1:
        alloc.full_attn_allocator.use_triton_kernels = alloc.swa_attn_allocator.use_triton_kernels = False
    rtt = _ReqToTokenPool(8, 4096)
    tree = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=rtt,
            token_to_kv_pool_allocator=alloc,
            page_size=ps,
            sliding_window_size=window,
            is_eagle=sc["options"].get("is_eagle", False),
            tree_components=(ComponentType.FULL, ComponentType.SWA),
            tree_core_backend="python",
        )
    )
    interval = sc["options"]["swa_eviction_interval"]

    class Req:
        def __init__(self, rid: str, prompt: list[int], row: int) -> None:
            self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []
            self.extra_key = self.cache_salt = self.priority = self.lock = self.last_node = None
            self.session = self.session_id = self.kv_rotation_base = None
            self.swa_branching_seqlen = None
            self.kv = ReqKvInfo(req_pool_idx=row)
            self.allocated = self.computed = self.prefill_end = 0
            self.decoding, self.done = False, False
            self.decode_batch_idx = 0

        def finished(self) -> bool:
            return self.done

        @property
        def full_untruncated_fill_ids(self) -> list[int]:
            return self.origin_input_ids + self.output_ids

        def get_fill_ids(self) -> list[int]:
            return self.full_untruncated_fill_ids[: self.computed]  # the chunk just run ends here

        @property
        def seqlen(self) -> int:
            return len(self.origin_input_ids) + len(self.output_ids)

    free_rows = list(range(8))[::-1]
    reqs: dict[str, Req] = {}
    live: set[str] = set()
    records: list[dict[str, Any]] = []
    group = [False]  # a free group is open

    def end_group() -> None:
        if group[0]:
            alloc.free_group_end()
            group[0] = False

    def begin_group() -> None:
        end_group()
        alloc.free_group_begin()
        group[0] = True

    def row(r: Req) -> torch.Tensor:
        return rtt.req_to_token[r.kv.req_pool_idx]

    def pages(r: Req) -> tuple[list[int], list[int]]:
        full = row(r)[: r.allocated][::ps]
        return [int(x) // ps for x in full], [int(x) // ps for x in alloc.full_to_swa_index_mapping[full]]

    def grow(r: Req, n: int, decode: bool) -> bool:
        return grow_row(alloc, tree, row(r), r, n, decode, ps)

    def release(r: Req) -> None:  # release_kv_cache(req, tree, checkpoint=True)
        release_row(tree, r, ps)

    for op in sc["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        if kind in ("alloc", "evict"):
            end_group()
        if kind == "new":
            reqs[op["rid"]] = Req(op["rid"], op["prompt"], free_rows.pop())
        elif kind == "alloc":
            r = reqs[op["rid"]]
            if op["rid"] not in live:
                ids = r.full_untruncated_fill_ids
                m = tree.match_prefix(MatchPrefixParams(key=RadixKey(ids, None, limit=len(ids) - 1)))
                hit = m.device_prefix_len
                prefix = tree.path_device_indices(m.last_device_node)
                r.lock = tree.lock(m.last_device_node)
                r.last_node = m.last_device_node
                r.swa_branching_seqlen = m.swa_branching_seqlen
                row(r)[:hit] = prefix
                r.allocated = r.computed = hit
                r.prefill_end = r.seqlen
                r.kv.cache_protected_len = hit
                n = op["n"] if op.get("n") is not None else r.seqlen - hit
                ok = grow(r, n, decode=False)
                if not ok:
                    tree.unlock(r.lock)
                    r.lock = None
                else:
                    live.add(op["rid"])
                rec["ok"], rec["hit"] = ok, (hit if ok else None)
            else:
                n = op["n"] if op.get("n") is not None else r.seqlen - r.computed
                need = r.computed + n - r.allocated
                decode = bool(r.output_ids) and r.computed >= len(r.origin_input_ids)
                r.decoding = decode
                evicted = r.kv.get_evicted_seqlen(ComponentType.SWA)
                # maybe_evict_swa (its own free group), then alloc_for_decode
                if decode and r.decode_batch_idx >= 1 and r.seqlen - 1 - window >= evicted + interval:
                    begin_group()
                    tree.evict_sliding_windows(r, r.seqlen - 1)
                    end_group()
                rec["ok"] = grow(r, need, decode=decode) if need > 0 else True
                # alloc_decode takes the full page before it finds the SWA pool short and does not
                # give it back (the scheduler retracts); our allocate changes nothing. Scenarios are
                # sized so that a running request's allocation never fails.
                assert rec["ok"], f"{sc['name']}: a running request's allocation failed; resize it"
                if decode and rec["ok"]:
                    r.decode_batch_idx += 1
            if rec["ok"]:
                rec["pages"], rec["swa"] = pages(r)
            else:
                rec["pages"] = None
        elif kind == "run":
            r = reqs[op["rid"]]
            r.computed = r.allocated
            end_group()
            if r.decoding or r.computed >= r.prefill_end:
                begin_group()  # process_batch_result_*; a middle chunk is stashed outside
            if not r.decoding:
                tree.checkpoint(r, up_to=r.computed)
            rec["pages"], rec["swa"] = pages(r)
        elif kind == "append":
            reqs[op["rid"]].output_ids.extend(op["tokens"])
        elif kind == "release":
            r = reqs[op["rid"]]
            release(r)
            live.discard(op["rid"])
            free_rows.append(r.kv.req_pool_idx)
        elif kind == "evict":
            rec["freed"] = tree.evict(EvictParams(num_tokens=op["n"])).num_tokens_evicted
        else:
            raise ValueError(f"unknown op {kind!r}")
        held_full, held_swa = held_tokens(alloc, ps)  # free once the open group ends
        full_free = (alloc.full_available_size() + held_full) // ps
        swa_free = (alloc.swa_available_size() + held_swa) // ps
        fe, se = tree.full_evictable_size() // ps, tree.swa_evictable_size() // ps
        rec["usage"] = [full_free, fe, sizes.full_tokens // ps - full_free - fe]
        rec["swa_usage"] = [swa_free, se, sizes.swa_tokens // ps - swa_free - se]
        records.append(rec)
    end_group()
    return records


def held_tokens(alloc: Any, ps: int) -> tuple[int, int]:  # pragma: no cover - needs SGLang
    """Tokens (full, SWA) freed inside the SWA allocator's open free group: its available sizes
    count them only at free_group_end."""
    import torch

    def pages(piles: list[Any] | None, page_ids: bool) -> int:
        if not piles:
            return 0
        ids = torch.cat(piles)
        if page_ids:
            return int(ids.numel())
        ids = ids[ids > 0]
        return int(torch.unique(ids // ps).numel())

    full = alloc.full_attn_allocator
    if ps == 1:  # token allocators: every pile holds token ids
        n_full = pages(full.free_group, True)
        n_swa = pages(alloc.swa_page_ids_group, True) + pages(alloc.swa_free_group, True)
    else:
        n_full = pages(full.free_page_ids_group, True) + pages(full.free_group, False)
        n_swa = pages(alloc.swa_page_ids_group, True) + pages(alloc.swa_free_group, False)
    return n_full * ps, n_swa * ps


def record_requests() -> None:  # pragma: no cover - needs SGLang
    for sc in request_scenarios():
        records = replay_requests_upstream(sc)
        path = FIXTURES / f"sglang_hybrid_{sc['name']}.json"
        path.write_text(
            json.dumps(
                {
                    "system": "sglang-hybrid",
                    "upstream": UPSTREAM + " (request lifecycle)",
                    "scenario": sc,
                    "records": records,
                },
                separators=(",", ":"),
            )
        )
        print(path.name, len(records), "ops", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    main()


def replay_requests_ours(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """The same ops through ``make_cache("radix", CacheConfig(..., layout))`` and the contract."""
    from prefixcache import CacheConfig, Request, make_cache

    cfg = CacheConfig(sc["capacity_tokens"], sc["page_size"], layout=[tuple(x) for x in sc["layout"]])
    cache = make_cache("radix", cfg, **sc.get("options", {}))
    reqs: dict[str, Request] = {}
    out: list[dict[str, Any]] = []
    for op in sc["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[op["rid"]] = Request(op["rid"], op["prompt"])
        elif kind == "alloc":
            req = reqs[op["rid"]]
            first = not cache.is_live(req)
            match = cache.lookup(req) if first else None
            done = match.tokens if match is not None else req.num_computed_tokens
            n = op["n"] if op.get("n") is not None else req.num_tokens - done
            ok = cache.allocate(req, n, match) if n > 0 else True  # SGLang grows by 0
            rec["ok"] = ok
            if first:
                rec["hit"] = req.num_computed_tokens if ok else None
            if ok:
                rec["pages"], rec["swa"] = cache.page_tables(req)
            else:
                rec["pages"] = None
        elif kind == "run":
            req = reqs[op["rid"]]
            req.num_computed_tokens = cache.reserved_tokens(req)
            cache.commit(req)
            rec["pages"], rec["swa"] = cache.page_tables(req)
        elif kind == "append":
            reqs[op["rid"]].append_output_token_ids(op["tokens"])
        elif kind == "release":
            cache.release(reqs[op["rid"]])
        elif kind == "evict":
            rec["freed"] = cache.evict(op["n"])
        rec["usage"] = list(cache.usage())
        rec["swa_usage"] = list(cache.component_usage())  # type: ignore[attr-defined]
        cache.check_invariants()
        out.append(rec)
    return out
