"""Replay the host-tier cases (offload_cases.py) through vLLM 0.33's real OffloadingConnector
scheduler side (``OffloadingConnectorScheduler`` over ``CPUOffloadingSpec``'s
``CPUOffloadingManager``) and its real ``KVCacheManager``, driven as vLLM's v1 Scheduler drives
them (``Scheduler.schedule`` / ``_update_waiting_for_remote_kv`` / ``update_from_output``,
simulated by offload_cases.replay). The worker side is stubbed: a load job completes in the
step it is issued, a store job in the step after (the worker submits stores at the next
step's start) plus ``ack_delay`` steps. Needs .venv-upstream (setup_venv.sh).

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.vllm_offload_driver
writes tests/fixtures/upstream/offload/<case>.json; with ``--fidelity``, issue 33's cases
(offload_cases.fidelity_cases) to tests/fixtures/upstream/fidelity/<case>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from prefixcache.experiments.upstream import shim  # noqa: F401  (must precede vllm)
from prefixcache.experiments.upstream.offload_cases import GPU_BLOCK, cases, fidelity_cases, replay
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import CachedRequestData
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

init_none_hash(sha256)
OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "offload"
FIDELITY = OUT.parent / "fidelity"
HASH_SEED = "0"  # PYTHONHASHSEED for cases with KV events: NONE_HASH, so every hash, reproducible
BYTES_PER_BLOCK = CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT  # any size: the pool is counted in chunks


def _connector(case: dict[str, Any], kv_cache_config: KVCacheConfig) -> OffloadingConnectorScheduler:
    bpc = case["chunk"] // GPU_BLOCK
    extra = {
        "cpu_bytes_to_use": case["host_chunks"] * bpc * BYTES_PER_BLOCK,
        "block_size": case["chunk"],
        "eviction_policy": case.get("policy", "lru"),
        "store_threshold": case.get("store_threshold", 0),
        "offload_prompt_only": case.get("prompt_only", True),
    }
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(GPU_BLOCK, ("layer0",), 0, None),),
        worker_kv_bytes_per_block=BYTES_PER_BLOCK,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id="e0",
        model=OffloadingModelConfig("m", "float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=GPU_BLOCK, blocks_per_chunk=bpc),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
    )
    spec = CPUOffloadingSpec(config)
    assert spec.num_chunks == case["host_chunks"], spec.num_chunks
    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=True, prefix_cache_retention_interval=0),
        speculative_config=None,
        parallel_config=SimpleNamespace(world_size=1, decode_context_parallel_size=1),
    )
    return OffloadingConnectorScheduler(spec, vllm_config, kv_cache_config)  # type: ignore[arg-type]


class VllmOffload:
    def __init__(self, case: dict[str, Any]) -> None:
        self.case = case
        group = KVCacheGroupSpec(
            ["layer0"],
            FullAttentionSpec(block_size=GPU_BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32),
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=case["gpu_blocks"], kv_cache_tensors=[], kv_cache_groups=[group]
        )
        self.kv = KVCacheManager(
            kv_cache_config, max_model_len=1 << 20, scheduler_block_size=GPU_BLOCK, hash_block_size=GPU_BLOCK,
            enable_caching=True,
        )  # fmt: skip
        if case.get("kv_events"):  # as if enable_kv_cache_events were passed to __init__
            self.kv.block_pool.enable_kv_cache_events = self.kv.enable_kv_cache_events = True
        self.conn = _connector(case, kv_cache_config)
        hasher = get_request_block_hasher(GPU_BLOCK, sha256)
        self.reqs: dict[str, Request] = {}
        for r in case["requests"]:
            req = Request(
                r["rid"], list(r["prompt"]), SamplingParams(max_tokens=1 << 16), None, block_hasher=hasher
            )
            self.reqs[r["rid"]] = req
            self.conn.on_new_request(req)
        self._hits: dict[str, Any] = {}
        self.metrics_ = {"external_prefix_cache_queries": 0, "external_prefix_cache_hits": 0}
        self.due: dict[int, tuple[int, str | None]] = {}  # job -> (step reported, load's request)
        self.step = 0
        self.fresh: set[str] = set()  # admitted, not yet scheduled: a new request's full table
        self.added: dict[str, list[int]] = {}  # this step's new blocks of running requests
        self.finished_prev: list[str] = []
        self.recving: set[str] = set()  # load done: promoted at the next schedule
        # Admitted with an async load, in admission order: vLLM's kv_holding_waiting queue (FCFS),
        # the order its scheduler promotes finished loads in.
        self.kv_holding: list[str] = []
        self.stored: list[tuple[str, int, bytes]] = []
        self.evicted: list[bytes] = []
        manager = self.conn.manager
        prepare_store = manager.prepare_store

        def spy(keys: Any, ctx: Any) -> Any:
            out = prepare_store(keys, ctx)
            if out is not None:
                self.evicted += out.evicted_keys
                tpc = case["chunk"]
                self.stored += [
                    (ctx.req_id, ctx.get_offload_key_position(k) // tpc - 1, k) for k in out.keys_to_store
                ]
            return out

        manager.prepare_store = spy  # type: ignore[method-assign]

    # ------------------------------------------------------------ the loop's calls
    def begin_step(self) -> None:
        # Scheduler._update_waiting_for_remote_kv, in kv_holding_waiting's order (not the set's:
        # string-hash order would change with each process's hash seed).
        promoted = [rid for rid in self.kv_holding if rid in self.recving]
        for rid in promoted:
            req = self.reqs[rid]
            self.kv.cache_blocks(req, req.num_computed_tokens)
            if req.num_computed_tokens == req.num_tokens:
                req.num_computed_tokens = req.num_tokens - 1  # a full hit recomputes one token
            req.status = RequestStatus.RUNNING
            self.kv_holding.remove(rid)
        self.recving = set()

    def lookup(self, rid: str) -> tuple[int, int | None]:
        req = self.reqs[rid]
        blocks, local = self.kv.get_computed_blocks(req)[:2]
        ext, _async = self.conn.get_num_new_matched_tokens(req, local)
        self._hits[rid] = (blocks, local, ext)
        return local, ext

    def admit(self, rid: str, local: int, external: int, n: int) -> bool:
        req = self.reqs[rid]
        blocks, local, ext = self._hits.pop(rid)
        new = self.kv.allocate_slots(
            req,
            0 if ext else n,
            local,
            blocks,
            num_external_computed_tokens=ext,
            delay_cache_blocks=bool(ext),
        )
        if new is None:
            return False
        self.conn.update_state_after_alloc(req, self.kv.get_blocks(rid), ext)
        queries = req.num_tokens - local
        if queries:
            self.metrics_["external_prefix_cache_queries"] += queries
            self.metrics_["external_prefix_cache_hits"] += ext
        req.num_computed_tokens = local + ext
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS if ext else RequestStatus.RUNNING
        if ext:
            self.kv_holding.append(rid)
        self.fresh.add(rid)  # its next schedule sends the whole block table
        return True

    def extend(self, rid: str, n: int) -> bool:
        req = self.reqs[rid]
        before = len(self.kv.get_block_ids(rid)[0])
        if self.kv.allocate_slots(req, n) is None:
            return False
        self.added[rid] = list(self.kv.get_block_ids(rid)[0])[before:]
        return True

    def schedule_end(self, scheduled: dict[str, int], new: list[str]) -> None:
        """The step's SchedulerOutput (num_computed_tokens not yet advanced) -> the connector."""
        first = [rid for rid in scheduled if rid in self.fresh]
        cached = [rid for rid in scheduled if rid not in self.fresh]
        so = SimpleNamespace(
            scheduled_new_reqs=[
                SimpleNamespace(req_id=rid, block_ids=(list(self.kv.get_block_ids(rid)[0]),)) for rid in first
            ],
            scheduled_cached_reqs=CachedRequestData(
                req_ids=cached,
                resumed_req_ids=set(),
                new_token_ids=[[] for _ in cached],
                all_token_ids={},
                new_block_ids=[(self.added.get(rid, []),) for rid in cached],
                num_computed_tokens=[0 for _ in cached],
                num_output_tokens=[0 for _ in cached],
            ),
            num_scheduled_tokens=dict(scheduled),
            # vLLM's is a set, iterated in string-hash order; in finish order here (a dict), so
            # that fixtures do not depend on PYTHONHASHSEED (we process releases in order).
            finished_req_ids=dict.fromkeys(self.finished_prev),
            preempted_req_ids=set(),
            kv_cache_block_copies=(),
            kv_connector_block_state=None,
        )
        self.fresh -= set(first)
        self.added = {}
        self.finished_prev = []
        meta = self.conn.build_connector_meta(so)  # type: ignore[arg-type]
        delay = self.case.get("ack_delay", 0)
        for job_id in meta.store_jobs:  # submitted at the next step's start
            self.due[job_id] = (self.step + 1 + delay, None)
        for job_id, job in meta.load_jobs.items():  # submitted in this step's forward
            self.due[job_id] = (self.step + delay, job.req_id)

    def computed(self, rid: str, n: int, token: int | None) -> None:
        req = self.reqs[rid]
        req.num_computed_tokens += n
        if token is not None:
            req.append_output_token_ids([token])

    def finish(self, rid: str) -> None:
        req = self.reqs[rid]
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.conn.request_finished(req)
        self.kv.free(req)
        self.finished_prev.append(rid)  # the next SchedulerOutput's finished_req_ids

    def end_step(self) -> None:
        """The worker's report for this step -> update_connector_output."""
        completed: dict[int, int] = {}
        load_done: set[str] = set()
        for job_id, (due, load_of) in list(self.due.items()):
            if due <= self.step:
                completed[job_id] = 1
                del self.due[job_id]
                if load_of is not None:
                    load_done.add(load_of)
        self.conn.update_connector_output(
            KVConnectorOutput(
                finished_recving=load_done or None,
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=completed),
            )
        )
        self.recving |= load_done
        self.step += 1

    def clear_gpu(self) -> None:
        # The connector's evict_blocks takes a set; ascending ids here, as our side hands them.
        pool = self.kv.block_pool
        free = pool.free_block_queue.get_all_free_blocks()
        ids = sorted(b.block_id for b in free if b.block_hash is not None)
        self.kv.evict_blocks(ids)  # type: ignore[arg-type]

    def take_keys(self) -> tuple[list[tuple[str, int, bytes]], list[bytes]]:
        out = (self.stored, self.evicted)
        self.stored, self.evicted = [], []
        return out

    def loaded(self, rid: str) -> bool:
        return self.reqs[rid].status is RequestStatus.RUNNING

    def num_computed(self, rid: str) -> int:
        return self.reqs[rid].num_computed_tokens

    def num_tokens(self, rid: str) -> int:
        return self.reqs[rid].num_tokens

    def metrics(self) -> dict[str, int]:
        return dict(self.metrics_)

    def take_events(self) -> list[dict[str, Any]]:
        from prefixcache.experiments.upstream.kv_event_cases import event_json

        return [event_json(e) for e in self.kv.take_events()]


def record_fidelity() -> None:
    """Issue 33's cases (offload_cases.fidelity_cases) -> tests/fixtures/upstream/fidelity/."""
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    init_none_hash(sha256)
    FIDELITY.mkdir(parents=True, exist_ok=True)
    for case in fidelity_cases():
        record = replay(case, VllmOffload(case))
        fixture = {"recorded_with": "vllm 0.33.0 (OffloadingConnectorScheduler + CPUOffloadingManager)",
                   "pythonhashseed": HASH_SEED, "case": case, **record}  # fmt: skip
        (FIDELITY / f"{case['name']}.json").write_text(json.dumps(fixture, indent=1) + "\n")
        print(case["name"], record["admissions"], record["steps"], file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    if "--fidelity" in (sys.argv[1:] if argv is None else argv):
        record_fidelity()
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for case in cases():
        record = replay(case, VllmOffload(case))
        fixture = {"recorded_with": "vllm 0.33.0 (OffloadingConnectorScheduler + CPUOffloadingManager)",
                   "case": case["name"], **record}  # fmt: skip
        (OUT / f"{case['name']}.json").write_text(json.dumps(fixture, indent=1) + "\n")
        print(case["name"], record["admissions"], record["metrics"], file=sys.stderr)


if __name__ == "__main__":
    main()
