"""The scheduler side of vLLM 0.33's ``OffloadingConnector`` (``offloading/scheduler.py``), for
one full-attention group, driven by the hashchain backend through the PrefixCache contract.

How our calls map onto vLLM's engine step (``step k`` = between two ``advance`` calls):

    lookup            get_num_new_matched_tokens: after the GPU hit, the consecutive ready
                      chunks from chunk floor(gpu_hit / chunk); None (the request is deferred)
                      if one of them is still being stored or loaded, or this request id
                      still has transfers in flight
    on_admit          update_state_after_alloc: the load job (chunks pinned; the loaded
                      blocks are cached once the load is acknowledged: delay_cache_blocks)
    on_commit         the tokens the step scheduled (num_scheduled_tokens)
    on_release        request_finished
    advance (k+1)     build_connector_meta of step k: store jobs for the chunks the step
                      filled (scheduled requests in order, then the requests released in
                      step k-1); then each of those is signalled finished (its recency
                      committed), after all the step's stores; then update_connector_output
                      of step k: loads admitted in step k and stores built at the start of
                      step k are acknowledged ("acks at once"; ``ack_delay`` steps later
                      otherwise). An acknowledged store is readable from the next lookup on.

A job's copy runs when it is submitted (the worker, ``worker``: None here, the stateful test's
shadow KV): a store at the advance that builds it, a load at admission.
Differences from vLLM, on purpose: every release is a finish (our interface does not say
whether it is a preemption), so a released request stores what it computed (vLLM: a finished
request's prompt, an aborted one's computed tokens) and commits its recency; re-admitted, it is
a new request, deferred while transfers of its earlier life are in flight (vLLM defers a
preempted request for the same reason). Dense only: no partial-tail, sliding-window, Mamba or
EAGLE paths. The worker never fails a transfer. Stores copy at submission, so vLLM's flushes
(a store waited for before its source blocks are reused) are implied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixcache.backends.hashchain.hashing import BlockHasher, group_id_suffix
from prefixcache.backends.hashchain.offload.chunk import LookupResult, OffloadKey, ReqContext
from prefixcache.backends.hashchain.offload.cpu_manager import CPUOffloadingManager
from prefixcache.backends.hashchain.offload.spec import OffloadSpec

from prefixcache.interface import CacheStats, PageUsage
from prefixcache.request import Request

GROUP_ID = 0  # the one full-attention group: keys carry its id, as vLLM's do


@dataclass(slots=True, eq=False)
class TransferJob:
    """One store (GPU -> CPU) or load (CPU -> GPU) of a request's chunks ``keys``. ``copies``:
    (GPU block id, CPU chunk id, the block's index within the chunk), one per block moved (a
    load may start inside its first chunk, past the GPU hit)."""

    job_id: int
    req_id: str
    is_store: bool
    keys: list[OffloadKey]
    copies: list[tuple[int, int, int]]
    due: int  # acknowledged at the advance that reaches this step count


@dataclass(slots=True, eq=False)
class RequestOffloadState:
    req: Request
    ctx: ReqContext
    offload_keys: list[OffloadKey] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    next_stored_chunk_idx: int = 0
    transfer_jobs: set[int] = field(default_factory=set)
    load_end: int = 0  # tokens cached (GPU + external) once its load is done
    finished: bool = False  # released (request_finished)
    computed_at_release: int = 0
    finished_signaled: bool = False  # on_request_finished sent to the manager


class OffloadingConnectorScheduler:
    def __init__(
        self,
        spec: OffloadSpec,
        hasher: BlockHasher,
        get_stats: Callable[[], CacheStats],
        ack_delay: int = 0,
    ) -> None:
        if isinstance(ack_delay, bool) or not isinstance(ack_delay, int) or ack_delay < 0:
            raise ValueError(f"host_ack_delay must be an int >= 0, got {ack_delay!r}")
        self.spec = spec
        self.hasher = hasher
        self._stats = get_stats
        self.ack_delay = ack_delay
        self.manager = CPUOffloadingManager(spec.num_chunks, spec.eviction_policy, spec.store_threshold)
        self._req_status: dict[str, RequestOffloadState] = {}
        self._jobs: dict[int, TransferJob] = {}
        self._job_counter = 0
        self._chunks_being_loaded: set[OffloadKey] = set()
        self._scheduled: dict[str, int] = {}  # req id -> tokens after this step's batch
        self._released_now: list[str] = []  # released in the current step
        self._released_prev: list[str] = []  # released in the step before: processed next
        self._step = 0
        self.version = 0  # bumped whenever a lookup could answer differently
        self.worker: Callable[[TransferJob], Any] | None = None
        # Called when a live request's load is acknowledged: its blocks may be cached now.
        self.on_load_done: Callable[[Request, int], Any] | None = None
        self.metrics = {"external_prefix_cache_queries": 0, "external_prefix_cache_hits": 0}

    # ---------------------------------------------------------------- keys
    def _keys(self, req: Request) -> list[OffloadKey]:
        """The key of every chunk whose tokens are all known: its last hash unit's hash."""
        hashes = self.hasher.request_hashes(req).hashes
        hpc, suffix = self.spec.hashes_per_chunk, group_id_suffix(GROUP_ID)
        return [hashes[i] + suffix for i in range(hpc - 1, len(hashes), hpc)]

    def _update_keys(self, status: RequestOffloadState) -> None:
        """Append the keys of chunks completed since the last call (a request's hashes only
        grow, so the earlier keys stand: rebuilding them every step cost O(prompt) a step)."""
        hashes = self.hasher.request_hashes(status.req).hashes
        hpc, tpc = self.spec.hashes_per_chunk, self.spec.tokens_per_chunk
        suffix = group_id_suffix(GROUP_ID)
        keys = status.offload_keys
        for j in range(len(keys), len(hashes) // hpc):
            key = hashes[(j + 1) * hpc - 1] + suffix
            keys.append(key)
            status.ctx.key_positions[key] = (j + 1) * tpc

    # ---------------------------------------------------------------- lookup (pure)
    def lookup(self, req: Request, num_local_tokens: int) -> int | None:
        """Tokens loadable after the GPU hit (whole chunks, 0 below one chunk); None: defer."""
        if req.request_id in self._req_status:
            return None  # an earlier life of this request still has transfers in flight
        tpc = self.spec.tokens_per_chunk
        keys = self._keys(req)
        # Full attention: up to every token (vLLM recomputes the last one after the load).
        max_hit = min(req.num_tokens, len(keys) * tpc)
        if max_hit - num_local_tokens < tpc:
            return 0
        start = num_local_tokens // tpc
        hits, pending = 0, False
        for key in keys[start : -(-max_hit // tpc)]:
            result = self.manager.lookup(key)
            if result is LookupResult.MISS:
                break
            hits += 1
            pending |= result is LookupResult.HIT_PENDING
        if pending:
            return None
        num_hit = min(max_hit, tpc * (start + hits)) - num_local_tokens
        if num_hit < tpc:
            return 0
        end = -(-(num_local_tokens + num_hit) // tpc)
        if any(k in self._chunks_being_loaded for k in keys[start:end]):
            return None  # another request is loading them: wait for that load
        return num_hit

    # ---------------------------------------------------------------- request events
    def on_admit(
        self, req: Request, num_local_tokens: int, num_external_tokens: int, block_ids: list[int]
    ) -> None:
        """The request was allocated with this GPU hit and this external hit."""
        status = RequestOffloadState(req, ReqContext(req.request_id))
        self._req_status[req.request_id] = status
        self.version += 1
        self._update_keys(status)
        status.block_ids = list(block_ids)
        queries = req.num_tokens - num_local_tokens
        if queries and not req.num_preemptions:
            self.metrics["external_prefix_cache_queries"] += queries
            self.metrics["external_prefix_cache_hits"] += num_external_tokens
        if not num_external_tokens:
            return
        tpb, bpc, tpc = self.spec.tokens_per_block, self.spec.blocks_per_chunk, self.spec.tokens_per_chunk
        num_cached = status.load_end = num_local_tokens + num_external_tokens
        # [0, first_block)             GPU hit
        # [first_block, num_blocks)    loaded from the chunks [first_chunk, end_chunk)
        first_block, num_blocks = num_local_tokens // tpb, -(-num_cached // tpb)
        first_chunk, end_chunk = first_block // bpc, -(-num_cached // tpc)
        keys = status.offload_keys[first_chunk:end_chunk]
        chunk_ids = self.manager.prepare_load(keys, status.ctx)
        copies = [
            (block_ids[i], chunk_ids[i // bpc - first_chunk], i % bpc) for i in range(first_block, num_blocks)
        ]
        job = self._new_job(status, False, keys, copies)
        self._chunks_being_loaded.update(keys)
        status.next_stored_chunk_idx = end_chunk  # chunk-level policy: hit chunks are not re-offered
        if self.worker is not None:
            self.worker(job)

    def load_in_flight(self, request_id: str) -> bool:
        """Whether a load of this request's chunks is submitted and not yet reported done."""
        status = self._req_status.get(request_id)
        if status is None:
            return False
        jobs = (self._jobs.get(j) for j in status.transfer_jobs)  # (one may be completing now)
        return any(job is not None and not job.is_store for job in jobs)

    def on_commit(self, req: Request, blocks: Sequence[Any]) -> None:
        """``blocks``: the request's KV blocks (full attention), which only grow while it is
        live: the ids are appended, not copied anew each step."""
        status = self._req_status[req.request_id]
        ids = status.block_ids
        if len(ids) > len(blocks) or (ids and ids[-1] != blocks[len(ids) - 1].block_id):
            ids[:] = [b.block_id for b in blocks]  # not a continuation (cannot happen while live)
        else:
            ids.extend(b.block_id for b in blocks[len(ids):])
        self._scheduled[req.request_id] = req.num_computed_tokens

    def on_release(self, req: Request) -> None:
        status = self._req_status[req.request_id]
        self._update_keys(status)  # the final block hashes, for the finish-time store
        status.finished = True
        status.computed_at_release = req.num_computed_tokens
        self._released_now.append(req.request_id)

    def _new_job(
        self,
        status: RequestOffloadState,
        is_store: bool,
        keys: list[OffloadKey],
        copies: list[tuple[int, int, int]],
    ) -> TransferJob:
        due = self._step + 1 + self.ack_delay
        job = TransferJob(self._job_counter, status.req.request_id, is_store, keys, copies, due)
        self._job_counter += 1
        self._jobs[job.job_id] = job
        status.transfer_jobs.add(job.job_id)
        return job

    # ---------------------------------------------------------------- the step boundary
    def advance(self) -> None:
        self._step += 1
        scheduled, self._scheduled = self._scheduled, {}
        finished, self._released_prev, self._released_now = self._released_prev, self._released_now, []
        for rid, num_tokens in scheduled.items():
            status = self._req_status.get(rid)
            if status is not None:
                self._build_store_job(status, num_tokens, finished=False)
        for rid in finished:
            status = self._req_status[rid]
            # vLLM: a finished request's prompt (max(prompt, num_tokens - 1)), an aborted one's
            # computed tokens; a release mid-prefill (our preemption) is the latter.
            req = status.req
            end = min(max(req.num_prompt_tokens, req.num_tokens - 1), status.computed_at_release)
            self._build_store_job(status, end, finished=True)
        # Only once every store of the step is made (vLLM build_connector_meta): a recency
        # commit (ARC's T2 promotion) must not reorder the next finished request's evictions.
        for rid in finished:
            status = self._req_status[rid]
            status.finished_signaled = True
            self.manager.on_request_finished(status.ctx)
            self._drop_if_done(status)
        for job in [j for j in self._jobs.values() if j.due <= self._step]:
            self._complete(job)

    def _build_store_job(
        self, status: RequestOffloadState, num_tokens_after_batch: int, finished: bool
    ) -> None:
        """_build_store_jobs for one request: offer its newly full chunks to prepare_store."""
        req, spec = status.req, self.spec
        if not finished:
            self._update_keys(status)
        num_offloadable = min(num_tokens_after_batch, req.num_tokens)
        if spec.offload_prompt_only:
            num_offloadable = min(num_offloadable, req.num_prompt_tokens)
        num_chunks = min(
            num_offloadable // spec.tokens_per_chunk,
            len(status.block_ids) // spec.blocks_per_chunk,
            len(status.offload_keys),
        )
        start = status.next_stored_chunk_idx
        if num_chunks <= start:
            return
        out = self.manager.prepare_store(status.offload_keys[start:num_chunks], status.ctx)
        if out is None:
            return  # no room: dropped, offered again when the request is next scheduled
        status.next_stored_chunk_idx = num_chunks
        stats = self._stats()
        if out.evicted_keys:
            self.version += 1
            stats.host_evicted_tokens += len(out.evicted_keys) * spec.tokens_per_chunk
        if not out.keys_to_store:
            return
        self.version += 1
        stats.stored_tokens += len(out.keys_to_store) * spec.tokens_per_chunk
        bpc = spec.blocks_per_chunk
        index = {k: j for j, k in enumerate(status.offload_keys[start:num_chunks], start)}
        copies = [
            (status.block_ids[index[key] * bpc + b], chunk_id, b)
            for key, chunk_id in zip(out.keys_to_store, out.chunk_ids, strict=True)
            for b in range(bpc)
        ]
        job = self._new_job(status, True, out.keys_to_store, copies)
        if self.worker is not None:
            self.worker(job)

    def _complete(self, job: TransferJob) -> None:
        del self._jobs[job.job_id]
        status = self._req_status[job.req_id]
        if job.is_store:
            self.manager.complete_store(job.keys)
        else:
            self.manager.complete_load(job.keys)
            self._chunks_being_loaded.difference_update(job.keys)
            if not status.finished and self.on_load_done is not None:
                self.on_load_done(status.req, status.load_end)  # _update_waiting_for_remote_kv
        self.version += 1
        status.transfer_jobs.remove(job.job_id)
        self._drop_if_done(status)

    def _drop_if_done(self, status: RequestOffloadState) -> None:
        if status.finished_signaled and not status.transfer_jobs:
            del self._req_status[status.req.request_id]
            self.version += 1

    # ---------------------------------------------------------------- queries
    def busy(self) -> bool:
        """Whether a step could move anything here (the engine must not skip steps)."""
        if self._jobs or self._released_now or self._released_prev or not self.spec.offload_prompt_only:
            return True
        tpc = self.spec.tokens_per_chunk
        return any(
            s.next_stored_chunk_idx < s.req.num_prompt_tokens // tpc for s in self._req_status.values()
        )

    def host_usage(self) -> PageUsage:
        m = self.manager
        free = m.num_free_chunks()
        return PageUsage(free=free, evictable=m.num_evictable, in_use=m.num_chunks - free - m.num_evictable)

    def reset(self) -> None:
        """reset_prefix_cache with the connector: every chunk, job and request state dropped."""
        self.manager.reset_cache()
        self._req_status.clear()
        self._jobs.clear()
        self._chunks_being_loaded.clear()
        self._scheduled.clear()
        self._released_now.clear()
        self._released_prev.clear()
        self.version += 1

    def check_invariants(self, live: set[str]) -> None:
        self.manager.check_invariants()
        for rid in live:
            status = self._req_status.get(rid)
            assert status is not None and not status.finished, f"live {rid!r} has no offload state"
        for job in self._jobs.values():
            assert job.job_id in self._req_status[job.req_id].transfer_jobs, f"job {job.job_id} lost"
            for key in job.keys:
                chunk = self.manager.policy.get(key)
                assert chunk is not None, f"job {job.job_id}'s chunk was evicted in flight"
                assert (chunk.ref_cnt == -1) if job.is_store else (chunk.ref_cnt >= 1), (
                    f"job {job.job_id}: chunk ref_cnt {chunk.ref_cnt}"
                )
        loading = {k for j in self._jobs.values() if not j.is_store for k in j.keys}
        assert loading == self._chunks_being_loaded, "chunks being loaded and load jobs disagree"
