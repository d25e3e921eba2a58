"""Replay a scenario through vLLM's own v1 KVCacheManager, driven as its scheduler drives it:
get_computed_blocks + allocate_slots at admission, allocate_slots per later step, free at the end.
Needs vllm (see experiments/upstream/setup_venv.sh)."""

from __future__ import annotations

import time
from typing import Any

import torch  # noqa: E402
from prefixcache.experiments.upstream import shim  # noqa: F401  (must precede vllm)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

init_none_hash(sha256)


def _usage(m: KVCacheManager) -> list[int]:
    pool = m.block_pool
    free = pool.free_block_queue.get_all_free_blocks()
    cached = sum(1 for b in free if b.block_hash is not None)
    usable = pool.num_gpu_blocks - 1
    return [len(free) - cached, cached, usable - len(free)]


def free_queue(m: KVCacheManager) -> list[int]:
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def replay_vllm(scenario: dict[str, Any], record: bool = True) -> tuple[list[dict[str, Any]], float]:
    """(one record per op, seconds inside vLLM's calls; recording is never timed)."""
    # Both walk the whole pool per op: affordable on the scripted scenarios only.
    record_usage = record_free_queue = record and not scenario.get("large", False)
    B = scenario["page_size"]
    num_blocks = scenario["capacity_tokens"] // B
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], FullAttentionSpec(
            block_size=B, num_kv_heads=1, head_size=8, dtype=torch.float32))],
    )
    m = KVCacheManager(cfg, max_model_len=1 << 20, scheduler_block_size=B, hash_block_size=B,
                       enable_caching=True)
    hasher = get_request_block_hasher(B, sha256)
    reqs: dict[str, Request] = {}
    live: dict[str, int] = {}  # rid -> tokens allocated
    records: list[dict[str, Any]] = []
    spent = 0.0
    for op in scenario["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        t0 = time.perf_counter()
        if kind == "new":
            reqs[op["rid"]] = Request(op["rid"], list(op["prompt"]), SamplingParams(max_tokens=1 << 16),
                                      None, cache_salt=op.get("salt"), block_hasher=hasher)
            spent += time.perf_counter() - t0
        elif kind == "alloc":
            req = reqs[op["rid"]]
            if op["rid"] not in live:
                blocks, hit, _ = m.get_computed_blocks(req)
                n = op["n"] if op.get("n") is not None else req.num_tokens - hit
                out = m.allocate_slots(req, n, hit, blocks)
                rec["ok"] = out is not None
                rec["hit"] = hit if out is not None else None
                if out is not None:
                    req.num_computed_tokens = hit
                    live[op["rid"]] = hit + n
            else:
                n = op["n"] if op.get("n") is not None else req.num_tokens - req.num_computed_tokens
                out = m.allocate_slots(req, n)
                rec["ok"] = out is not None
                if out is not None:
                    live[op["rid"]] = max(live[op["rid"]], req.num_computed_tokens + n)
            spent += time.perf_counter() - t0  # what follows only records
            if record:
                rec["pages"] = list(m.get_block_ids(op["rid"])[0]) if rec["ok"] else None
        elif kind == "run":
            req = reqs[op["rid"]]
            req.num_computed_tokens = live[op["rid"]]
            spent += time.perf_counter() - t0
            if record:
                rec["pages"] = list(m.get_block_ids(op["rid"])[0])
        elif kind == "append":
            reqs[op["rid"]].append_output_token_ids(list(op["tokens"]))
            spent += time.perf_counter() - t0
        elif kind == "release":
            m.free(reqs[op["rid"]])
            del live[op["rid"]]
            spent += time.perf_counter() - t0
            if record_free_queue:
                rec["free_queue"] = free_queue(m)
        else:
            raise ValueError(f"vLLM replay has no op {kind!r}")
        if record_usage:
            rec["usage"] = _usage(m)
        records.append(rec)
    return records, spent
