"""Record hybrid fixtures from vLLM 0.33.0's own KVCacheManager (full + sliding-window KV-cache
groups over one block pool), its grouping rule and its block-size resolution.

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.vllm_hybrid_driver [--record DIR]

Each request-level scenario (hybrid_scenarios_vllm.py) is replayed op by op the way vLLM's
scheduler drives the manager: get_computed_blocks (setting ``request.shared_prefix_boundary``
as the scheduler does) + allocate_slots at admission, allocate_slots per later step, free at
the end. Per op it records the hit, the block ids of every group, the new block ids, and the
free queue (head = next evicted). Scenario 1 drives ``SlidingWindowManager.find_longest_cache_hit``
on a pool whose hashes are set directly (as vLLM's own test does); scenario 8 calls
``_get_kv_cache_groups_uniform_page_size``; scenario 9 ``resolve_kv_cache_block_sizes``.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any

import torch
from prefixcache.experiments.upstream import shim  # noqa: F401  (must precede vllm)
from prefixcache.experiments.upstream.hybrid_scenarios_vllm import (
    SCENARIO_1_PATTERNS,
    SCENARIO_8_LAYOUTS,
    SCENARIO_9_CASES,
    all_scenarios,
    eagle_scenarios,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    KVCacheBlock,
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
    partial_hash_hits_enabled,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.single_type_kv_cache_manager import (
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

UPSTREAM = "vllm 0.33.0"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "hybrid"
init_none_hash(sha256)


def layer_spec(layer: list[Any], block_size: int) -> Any:
    common = dict(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
    if layer[0] == "full":
        return FullAttentionSpec(**common)
    if layer[0] == "sliding_window":
        return SlidingWindowSpec(sliding_window=layer[1], **common)
    if layer[0] == "mamba":  # one state of S floats; "align", the mode prefix caching runs
        return MambaSpec(
            shapes=((layer[1],),), dtypes=(torch.float32,), block_size=block_size, mamba_cache_mode="align"
        )
    raise ValueError(f"no vLLM spec for layer {layer!r} here")


def spec_json(spec: Any) -> list[Any]:
    if isinstance(spec, MambaSpec):
        return ["mamba", spec.shapes[0][0]]
    return ["sliding_window", spec.sliding_window] if isinstance(spec, SlidingWindowSpec) else ["full"]


def hybrid_block_size(layout: list[list[Any]], block_size: int) -> int:
    """vLLM's Platform._align_hybrid_block_size in layer-token units (not run: it needs a model
    config): the smallest multiple of the block size whose page holds the largest state."""
    states = [layer[1] for layer in layout if layer[0] == "mamba"]
    return max(block_size, block_size * -(-max(states) // block_size)) if states else block_size


def plan_groups(layout: list[list[Any]], block_size: int) -> list[KVCacheGroupSpec]:
    """vLLM's own grouping of these layers (layer i is named "layer{i}")."""
    specs = {f"layer{i}": layer_spec(layer, block_size) for i, layer in enumerate(layout)}
    return _get_kv_cache_groups_uniform_page_size(specs)


def groups_json(groups: list[KVCacheGroupSpec]) -> list[dict[str, Any]]:
    return [
        {"spec": spec_json(g.kv_cache_spec), "layers": [int(n[5:]) for n in g.layer_names]} for g in groups
    ]


def free_queue(m: KVCacheManager) -> list[int]:
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def build(scenario: dict[str, Any]) -> tuple[KVCacheManager, dict[str, Any]]:
    B = scenario["block_size"]
    header: dict[str, Any] = {}
    if "layout" in scenario:
        B = hybrid_block_size(scenario["layout"], B)
        header["block_size"] = B
        groups = plan_groups(scenario["layout"], B)
        group_size = max(len(g.layer_names) for g in groups)  # padding included
        budget = scenario["capacity_tokens"] * len(scenario["layout"])
        # vLLM: memory // (page bytes x layers per group); in layer-token units.
        num_blocks = budget // (B * group_size)
        header.update(groups=groups_json(groups), group_size=group_size, num_blocks=num_blocks)
    else:
        specs = [layer_spec(g, B) for g in scenario["groups"]]
        groups = [KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)]
        num_blocks = scenario["num_blocks"]
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=scenario["retention"],
    )
    unit = scenario.get("prefix_match_unit") or B  # vLLM's hash_block_size
    # EAGLE as the scheduler passes it: use_eagle (the block drop) and one prefill lookahead
    # token (EAGLE-family drafters read the next token; none re-prefilled). No draft layers
    # here, so no group is flagged is_eagle_group and every group gets the drop.
    use_eagle = bool(scenario.get("use_eagle"))
    m = KVCacheManager(
        cfg,
        max_model_len=1 << 16,
        scheduler_block_size=B,
        hash_block_size=unit,
        enable_caching=True,
        use_eagle=use_eagle,
        num_prefill_lookahead=1 if use_eagle else 0,
    )
    return m, header


def chunk(op: dict[str, Any], remaining: int) -> int:
    """An alloc's token count: its n capped at what the request has left (n=None: all of it)."""
    return remaining if op.get("n") is None else min(op["n"], remaining)


def replay(scenario: dict[str, Any]) -> dict[str, Any]:
    m, header = build(scenario)
    block_size = header.get("block_size", scenario["block_size"])
    hasher = get_request_block_hasher(scenario.get("prefix_match_unit") or block_size, sha256)
    reqs: dict[str, Request] = {}
    live: dict[str, int] = {}  # rid -> tokens allocated
    records: list[dict[str, Any]] = []
    for op in scenario["ops"]:
        kind, rid = op["op"], op.get("rid")
        rec: dict[str, Any] = {}
        m.new_step_starts()  # one op, one scheduler step (Mamba defers hits cached this step)
        if kind == "new":
            reqs[rid] = Request(
                rid, list(op["prompt"]), SamplingParams(max_tokens=1 << 12), None, block_hasher=hasher
            )
        elif kind == "lookup":
            blocks, hit, junction = m.get_computed_blocks(reqs[rid])
            rec.update(hit=hit, junction=junction, blocks=[[b.block_id for b in g] for g in blocks.blocks])
        elif kind == "alloc":
            req = reqs[rid]
            if rid not in live:
                blocks, hit, junction = m.get_computed_blocks(req)
                req.shared_prefix_boundary = junction  # what the scheduler does with it
                n = chunk(op, req.num_tokens - hit)
                new = m.allocate_slots(req, n, hit, blocks)
                rec.update(hit=hit if new is not None else None, junction=junction)
                if new is not None:
                    req.num_computed_tokens = hit
                    live[rid] = hit + n
            else:
                n = chunk(op, req.num_tokens - req.num_computed_tokens)
                if n == 0:  # an earlier chunk took the whole prompt
                    records.append({"skipped": True, "free_queue": free_queue(m)})
                    continue
                new = m.allocate_slots(req, n)
                if new is not None:
                    live[rid] = max(live[rid], req.num_computed_tokens + n)
            rec["ok"] = new is not None
            if new is not None:
                rec["new"] = [list(ids) for ids in new.get_block_ids(allow_none=False)]
                rec["ids"] = [list(ids) for ids in m.get_block_ids(rid)]
        elif kind == "run":
            if rid in live:  # else its admission failed: nothing to compute
                reqs[rid].num_computed_tokens = live[rid]
                rec["ids"] = [list(ids) for ids in m.get_block_ids(rid)]
        elif kind == "append":
            reqs[rid].append_output_token_ids(list(op["tokens"]))
        elif kind == "release":
            if rid in live:
                m.free(reqs[rid])
                del live[rid]
        elif kind == "evict_blocks":
            m.evict_blocks(set(op["ids"]))
        elif kind == "evict_keys":  # every block under these keys, as vLLM's tests pop them
            hashes = reqs[rid].block_hashes
            ids: set[int] = set()
            for group, index in op["keys"]:
                entry = m.block_pool.cached_block_hash_to_block._cache.get(
                    make_block_hash_with_group_id(hashes[index], group)
                )
                ids |= {entry.block_id} if isinstance(entry, KVCacheBlock) else set(entry or ())
            rec["evicted"] = sorted(ids)
            m.evict_blocks(ids)
        elif kind == "evict_hit":  # the block at [group][index] of rid's current hit
            blocks, _, _ = m.get_computed_blocks(reqs[rid])
            rec["evicted"] = blocks.blocks[op["group"]][op["index"]].block_id
            m.evict_blocks({rec["evicted"]})
        else:
            raise ValueError(f"no op {kind!r}")
        rec["free_queue"] = free_queue(m)
        records.append(rec)
    return {**header, "records": records}


def scenario_1() -> list[dict[str, Any]]:
    """SlidingWindowManager.find_longest_cache_hit over cached patterns (window 4, bs 2)."""
    B = 2
    spec = SlidingWindowSpec(block_size=B, num_kv_heads=1, head_size=8, dtype=torch.float32, sliding_window=4)
    out = []
    for pattern in SCENARIO_1_PATTERNS:
        pool = BlockPool(num_gpu_blocks=64, enable_caching=True, hash_block_size=B)
        hashes = [BlockHash(str(i).encode()) for i in range(len(pattern))]
        for i, flag in enumerate(pattern):
            if flag == "T":
                block = pool.blocks[i + 10]
                pool._insert_block_hash(make_block_hash_with_group_id(hashes[i], 0), block, (i + 1) * B)
        (blocks,), hit = SlidingWindowManager.find_longest_cache_hit(
            hashes, len(pattern) * B, [0], pool, spec, drop_eagle_block=False, alignment_tokens=B
        )
        out.append(
            {
                "pattern": pattern,
                "hit": hit,
                "num_nulls": sum(b.is_null for b in blocks),
                "ids": [b.block_id for b in blocks],
            }
        )
    return out


def _window_manager(pool: BlockPool, window: int, block_size: int) -> SlidingWindowManager:
    spec = SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32, sliding_window=window
    )
    return SlidingWindowManager(
        spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=block_size
    )


def scenario_2() -> list[dict[str, Any]]:
    """remove_skipped_blocks (window 4, bs 2) on a table of blocks 1000-1010, called with a
    growing computed length: the table's nulls and the free queue's head after each call
    (freed blocks without a hash are prepended)."""
    pool = BlockPool(num_gpu_blocks=1011, enable_caching=True, hash_block_size=2)
    held = pool.get_new_blocks(1010)  # ids 1..1010, ref_cnt 1
    manager = _window_manager(pool, 4, 2)
    manager.req_to_blocks["r"] = [b for b in held if b.block_id >= 1000]
    pool.free_blocks([b for b in held if b.block_id < 1000])
    out = []
    for n in (4, 5, 6, 7, 11):
        manager.remove_skipped_blocks("r", n)
        out.append(
            {
                "num_computed_tokens": n,
                "table": [b.block_id for b in manager.req_to_blocks["r"]],
                "free_head": free_queue_of(pool)[:5],
            }
        )
    return out


def free_queue_of(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def scenario_3() -> list[dict[str, Any]]:
    """SlidingWindowManager.get_num_blocks_to_allocate for 40 tokens (window 4, bs 2) of a new
    request whose hit is 10 blocks: free cached blocks (ref_cnt 0) or 5 nulls + 5 of them."""
    out = []
    for num_nulls in (0, 5):
        for computed in (0, 20):
            pool = BlockPool(num_gpu_blocks=64, enable_caching=True, hash_block_size=2)
            manager = _window_manager(pool, 4, 2)
            hit = [pool.null_block] * num_nulls + pool.blocks[10 : 20 - num_nulls]
            n = manager.get_num_blocks_to_allocate("r", 40, hit, computed, computed, 40)
            out.append({"num_nulls": num_nulls, "total_computed_tokens": computed, "blocks": n})
    return out


def scenario_8() -> dict[str, Any]:
    out = {}
    for name, layout in SCENARIO_8_LAYOUTS.items():
        groups = plan_groups(layout, 16)
        out[name] = {
            "layout": layout,
            "groups": groups_json(groups),
            "group_size": max(len(g.layer_names) for g in groups),
        }
    return out


def scenario_9() -> list[dict[str, Any]]:
    out = []
    for sizes, unit in SCENARIO_9_CASES:
        groups = [KVCacheGroupSpec([f"layer{i}"], layer_spec(["full"], b)) for i, b in enumerate(sizes)]
        cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)
        vllm_config = types.SimpleNamespace(
            cache_config=types.SimpleNamespace(
                block_size=sizes[0], prefix_match_unit=unit, enable_prefix_caching=True
            ),
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=1),
            kv_transfer_config=None,
        )
        try:
            result: Any = list(resolve_kv_cache_block_sizes(cfg, vllm_config))
            error = None
        except ValueError as exc:
            result, error = None, str(exc)
        out.append({"block_sizes": sizes, "prefix_match_unit": unit, "result": result, "error": error})
    return out


def scenario_9_partial_hits() -> list[dict[str, Any]]:
    """partial_hash_hits_enabled for group kinds of one block size (16) and a hash unit."""
    managers = {"full": FullAttentionManager, "sliding_window": SlidingWindowManager, "mamba": MambaManager}
    out = []
    for kinds in (["full", "mamba"], ["full", "mamba", "sliding_window"], ["full", "sliding_window"]):
        for unit in (16, 8):
            layers = [[k, 32] if k == "sliding_window" else [k, 8] if k == "mamba" else [k] for k in kinds]
            groups = [KVCacheGroupSpec([f"layer{i}"], layer_spec(x, 16)) for i, x in enumerate(layers)]
            enabled = partial_hash_hits_enabled(groups, unit, 1, [managers[k] for k in kinds])
            out.append({"kinds": kinds, "block_size": 16, "hash_block_size": unit, "enabled": enabled})
    return out


def record_eagle(directory: Path) -> list[Path]:
    """The EAGLE scenarios (use_eagle=True), in their own folder."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario in eagle_scenarios():
        fixture = {"system": "vllm", "upstream": UPSTREAM, "scenario": scenario, **replay(scenario)}
        path = directory / f"vllm_eagle_{scenario['name']}.json"
        path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=DEFAULT_DIR, help="write the JSON fixtures here")
    ap.add_argument("--eagle-only", action="store_true", help="record only the EAGLE fixtures")
    args = ap.parse_args(argv)
    args.record.mkdir(parents=True, exist_ok=True)
    written = record_eagle(args.record / "eagle")
    if args.eagle_only:
        print(f"wrote {len(written)} EAGLE fixtures to {args.record / 'eagle'}")
        return 0
    for scenario in all_scenarios():
        fixture = {"system": "vllm", "upstream": UPSTREAM, "scenario": scenario, **replay(scenario)}
        path = args.record / f"vllm_hybrid_{scenario['name']}.json"
        path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        written.append(path)
    units = {
        "scenario1_swa_find": scenario_1(),
        "scenario2_remove_skipped": scenario_2(),
        "scenario3_blocks_to_allocate": scenario_3(),
        "scenario8_grouping": scenario_8(),
        "scenario9_block_sizes": scenario_9(),
        "scenario9_partial_hits": scenario_9_partial_hits(),
    }
    path = args.record / "vllm_hybrid_units.json"
    path.write_text(json.dumps({"system": "vllm", "upstream": UPSTREAM, **units}, indent=1) + "\n")
    written.append(path)
    print(f"wrote {len(written)} fixtures to {args.record} ({sum(p.stat().st_size for p in written)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
