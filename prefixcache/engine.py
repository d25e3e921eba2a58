"""The engine: admission -> chunked prefill under a token budget -> decode -> release.

It drives a cache only through the PrefixCache contract, the way vLLM v1's scheduler drives
its KVCacheManager, so both backends see exactly the same calls:

- Running requests are served first, in order; each gets ``min(tokens left, budget)`` new
  tokens (a prefill chunk, or 1 when decoding). If the cache has no room, the *last* running
  request is preempted (released, ``num_computed_tokens = 0``, ``num_preemptions += 1``) and put
  at the front of the waiting queue, until the room is there or the request preempted itself.
- Waiting requests are admitted in the scheduler's order only if nothing was preempted this
  step (vLLM does the same); admission stops at the first request that does not fit.
- After the step the engine advances ``num_computed_tokens`` and calls ``commit``. A request
  whose known tokens are all computed emits one output token (the planned one, a seeded
  pseudo-random one, or the model's argmax) until ``max_new_tokens``; then it is released.

With ``model=None`` this is a cache-level simulator; with a ``prefixcache.model.Model`` it
computes real KV. The clock is simulated (``CostModel``); when nothing runs it jumps to the
next arrival. Per-request ``RequestRecord``s are what the research layer analyses.
"""

from __future__ import annotations

import heapq
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixcache.interface import PrefixCache
from prefixcache.request import Request
from prefixcache.scheduler import Scheduler, make_scheduler

# A workload may plan a request's output tokens (so that the next turn of a conversation
# repeats them) by storing them in ``req.memo[PLANNED_OUTPUT]``.
PLANNED_OUTPUT = "planned_output_ids"
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class CostModel:
    """Simulated seconds per engine step: ``step_overhead_s + prefill_token_s * prefill tokens
    + decode_token_s * decode tokens``.

    Defaults are rough figures for an 8B model on one H100-class GPU (about 20k prefill
    tokens/s, 5 ms to stream the weights once per step). Attention over the cached context is
    not charged: this model compares how much prefill a cache saves, not kernel speed.
    """

    step_overhead_s: float = 0.005
    prefill_token_s: float = 5e-5
    decode_token_s: float = 2e-5

    def step_time(self, prefill_tokens: int, decode_tokens: int) -> float:
        prefill = self.prefill_token_s * prefill_tokens
        return self.step_overhead_s + prefill + self.decode_token_s * decode_tokens


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are simulated seconds, steps engine step numbers."""

    request_id: str
    arrival_time: float
    prompt_tokens: int
    max_new_tokens: int
    admission_step: int | None = None
    admission_time: float | None = None
    hit_tokens: int = 0  # reused at first admission (resumptions are not hits of the workload)
    computed_prefill_tokens: int = 0  # KV computed in prefill, recomputation after preemption included
    output_tokens: int = 0
    preemptions: int = 0
    evicted_tokens: int = 0  # cached tokens the cache evicted to make room for this request
    first_token_step: int | None = None
    first_token_time: float | None = None
    finish_step: int | None = None
    finish_time: float | None = None
    cache_op_ns: int = 0  # wall time inside cache calls made for this request
    rejected: bool = False  # could never fit in the cache; never admitted


def simulated_tokens(seed: int, request_id: str, n: int, vocab_size: int) -> list[int]:
    """Output tokens 0..n-1 of a request without a planned output: splitmix64 of
    ``(crc32(id) << 32) ^ (seed + (k + 1) * golden)`` mod ``vocab_size``, vectorised (uint64
    arithmetic wraps exactly as the ``& _MASK64`` of the scalar formula)."""
    base = np.uint64(zlib.crc32(request_id.encode()) << 32)
    x = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x *= np.uint64(0x9E3779B97F4A7C15)
        x += np.uint64(seed & _MASK64)
        x ^= base
        x ^= x >> np.uint64(30)  # splitmix64 finaliser
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(vocab_size)).tolist()  # type: ignore[no-any-return]


class Engine:
    """Steps requests through a PrefixCache; see the module docstring for the policy."""

    def __init__(
        self,
        cache: PrefixCache,
        scheduler: Scheduler | str = "fcfs",
        token_budget: int = 2048,
        model: Any | None = None,
        *,
        max_num_seqs: int = 256,
        cost_model: CostModel | None = None,
        seed: int = 0,
        vocab_size: int = 32_000,
        check_invariants: bool = False,
    ) -> None:
        for name, value in (("token_budget", token_budget), ("max_num_seqs", max_num_seqs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.cache = cache
        self.scheduler = make_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
        self.token_budget = token_budget
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.cost_model = cost_model or CostModel()
        self.seed = seed
        self.vocab_size = vocab_size
        self.check_invariants = check_invariants
        self.records: dict[str, RequestRecord] = {}
        self.pending: list[tuple[float, int, Request]] = []  # heap: not yet arrived
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._in_prefill: set[str] = set()
        self._simulated: dict[str, list[int]] = {}  # request id -> its simulated output tokens
        self.clock = 0.0
        self.step_count = 0
        self.num_finished = 0
        self.peak_pages_in_use = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self._added = 0
        self._source: Iterator[Request] | None = None
        self._peeked: Request | None = None

    # ---------------------------------------------------------------- requests in
    def add_request(self, req: Request) -> None:
        if req.request_id in self.records:
            raise ValueError(f"request id {req.request_id!r} was already added")
        rec = RequestRecord(req.request_id, req.arrival_time, req.num_prompt_tokens, req.max_new_tokens)
        self.records[req.request_id] = rec
        # The longest reservation is the prompt plus every output token but the last (whose
        # KV is never computed); a request that can never fit is rejected, as vLLM does.
        if req.num_prompt_tokens + max(req.max_new_tokens - 1, 0) > self.cache.config.usable_tokens:
            rec.rejected = True
            self.num_finished += 1
            return
        heapq.heappush(self.pending, (req.arrival_time, self._added, req))
        self._added += 1

    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running or self._source is not None)

    def run(
        self, requests: Iterable[Request] = (), *, progress: bool = False, total: int | None = None
    ) -> list[RequestRecord]:
        """Step until every request has finished; returns the records.

        ``requests`` is consumed lazily, a request being built only when the clock reaches its
        arrival, so a long trace never sits in memory as token lists. A source that is not
        sorted by arrival still works: a late-listed early request is admitted when read.
        """
        from tqdm.auto import tqdm

        self._source = iter(requests)
        self._peeked = None
        if total is None and hasattr(requests, "__len__"):
            total = len(requests) + len(self.records)  # type: ignore[arg-type]
        with tqdm(total=total, disable=not progress, unit="req", leave=False) as bar:
            idle = 0
            self._pull()
            bar.update(self.num_finished)
            while self.has_unfinished():
                before = self.num_finished
                idle = idle + 1 if self.step() == 0 else 0
                if idle > 2:
                    raise RuntimeError(f"engine made no progress at step {self.step_count}: {self.waiting!r}")
                bar.update(self.num_finished - before)
        return list(self.records.values())

    def _pull(self) -> None:
        """Add source requests until one arrives after the clock (kept as the next arrival)."""
        while self._source is not None:
            if self._peeked is None:
                self._peeked = next(self._source, None)
                if self._peeked is None:
                    self._source = None
                    return
            t = self._peeked.arrival_time
            if self.pending and t > self.clock and t >= self.pending[0][0]:
                return  # the heap already holds the next arrival; read on when the clock gets there
            self.add_request(self._peeked)
            self._peeked = None

    # ---------------------------------------------------------------- one step
    def step(self) -> int:
        """Run one engine step; returns the number of tokens computed in it."""
        self._move_arrivals()
        if not self.running and not self.waiting and self.pending:
            self.clock = max(self.clock, self.pending[0][0])  # idle: jump to the next arrival
            self._move_arrivals()
        budget = self.token_budget
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self._allocate(req, n):
                victim = running.pop()  # the latest admitted goes first, as in vLLM
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
        if not preempted and self.waiting and budget > 0:
            budget = self._admit_waiting(budget, scheduled)
        self.peak_pages_in_use = max(self.peak_pages_in_use, self.cache.usage().in_use)
        if not scheduled:
            return 0
        self._execute(scheduled)
        if self.check_invariants:
            self.cache.check_invariants()
        return self.token_budget - budget

    def _admit_waiting(self, budget: int, scheduled: list[tuple[Request, int]]) -> int:
        plan = self.scheduler.schedule(list(self.waiting), self._lookup)
        admitted: set[str] = set()
        for req in plan.order:
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if admitted and req.request_id in plan.held_back:
                continue  # its prefix is being computed by a request admitted this step
            n = min(req.num_tokens - self._lookup(req), budget)
            if not self._allocate(req, n):
                break
            rec = self.records[req.request_id]
            if rec.admission_step is None:
                rec.admission_step, rec.admission_time = self.step_count, self.clock
                rec.hit_tokens = req.num_computed_tokens
            self.running.append(req)
            self._in_prefill.add(req.request_id)
            scheduled.append((req, n))
            admitted.add(req.request_id)
            budget -= n
        if admitted:
            self._remove_waiting(admitted)
        return budget

    def _remove_waiting(self, admitted: set[str]) -> None:
        """Take the admitted requests out of the waiting queue, keeping the others' order.
        FCFS admits a run from the front: popping it costs O(admitted), not O(waiting)."""
        waiting = self.waiting
        popped = 0
        while popped < len(admitted) and waiting and waiting[0].request_id in admitted:
            waiting.popleft()
            popped += 1
        if popped < len(admitted):
            self.waiting = deque(r for r in waiting if r.request_id not in admitted)

    def _execute(self, scheduled: list[tuple[Request, int]]) -> None:
        next_tokens = self._run_model(scheduled) if self.model is not None else None
        # The loops below run once per scheduled request per step (every decode token): plain
        # locals and the per-request record fetched once, no helper calls but the cache's.
        records, in_prefill, commit = self.records, self._in_prefill, self.cache.commit
        simulated = self._simulated
        now_ns = time.perf_counter_ns
        prefill = decode = 0
        for req, n in scheduled:
            rec = records[req.request_id]
            if req.request_id in in_prefill:
                prefill += n
                rec.computed_prefill_tokens += n
            else:
                decode += n
            req.num_computed_tokens += n
            t0 = now_ns()
            try:
                commit(req)
            finally:
                rec.cache_op_ns += now_ns() - t0
        self.clock += self.cost_model.step_time(prefill, decode)  # times: at the end of the step
        self.prefill_tokens += prefill
        self.decode_tokens += decode
        for idx, (req, _) in enumerate(scheduled):
            num_tokens = req.num_tokens
            if req.num_computed_tokens < num_tokens:
                continue  # mid-prefill: no token yet
            in_prefill.discard(req.request_id)
            rec = records[req.request_id]
            num_output = num_tokens - req.num_prompt_tokens
            if num_output < req.max_new_tokens:
                if next_tokens is not None:
                    token = next_tokens[idx]
                else:
                    tokens = simulated.get(req.request_id)
                    if tokens is None or num_output >= len(tokens):
                        tokens = self._simulated_tokens(req)
                    token = tokens[num_output]
                req.append_output_token_ids(token)
                num_output += 1
                rec.output_tokens = num_output
                if rec.first_token_step is None:
                    rec.first_token_step, rec.first_token_time = self.step_count, self.clock
            if num_output >= req.max_new_tokens:
                self._finish(req)
        self.step_count += 1  # step numbers count from 0, as admission_step does

    # ---------------------------------------------------------------- helpers
    def _move_arrivals(self) -> None:
        self._pull()
        while self.pending and self.pending[0][0] <= self.clock:
            self.waiting.append(heapq.heappop(self.pending)[2])

    def _timed(self, req: Request, op: Any, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return op(req, *args)
        finally:
            self.records[req.request_id].cache_op_ns += time.perf_counter_ns() - t0

    def _lookup(self, req: Request) -> int:
        return int(self._timed(req, self.cache.lookup))

    def _allocate(self, req: Request, n: int) -> bool:
        rec = self.records[req.request_id]
        evicted = self.cache.stats.evicted_tokens
        t0 = time.perf_counter_ns()
        try:
            ok = bool(self.cache.allocate(req, n))
        finally:
            rec.cache_op_ns += time.perf_counter_ns() - t0
        rec.evicted_tokens += self.cache.stats.evicted_tokens - evicted
        return ok

    def _preempt(self, req: Request) -> None:
        self._timed(req, self.cache.release)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.records[req.request_id].preemptions += 1
        self._in_prefill.discard(req.request_id)
        self.waiting.appendleft(req)

    def _finish(self, req: Request) -> None:
        self._timed(req, self.cache.release)
        self._simulated.pop(req.request_id, None)
        self.running.remove(req)
        rec = self.records[req.request_id]
        rec.finish_step, rec.finish_time = self.step_count, self.clock
        if rec.first_token_step is None:  # max_new_tokens == 0: prefill only
            rec.first_token_step, rec.first_token_time = self.step_count, self.clock
        self.num_finished += 1

    def _simulated_tokens(self, req: Request) -> list[int]:
        """The output tokens of ``req``, indexed by output position, made on its first decode
        step and kept until it finishes: the planned ones if the workload planned them, else
        seeded pseudo-random tokens that depend only on (seed, request id, position), so every
        backend sees the same."""
        planned = req.memo.get(PLANNED_OUTPUT)
        k = req.num_output_tokens
        if isinstance(planned, (list, tuple)) and k < len(planned):
            tokens = [int(t) for t in planned]
        else:
            n = max(req.max_new_tokens, k + 1)
            tokens = simulated_tokens(self.seed, req.request_id, n, self.vocab_size)
        self._simulated[req.request_id] = tokens
        return tokens

    def _run_model(self, scheduled: list[tuple[Request, int]]) -> list[int]:
        from prefixcache.model import SeqChunk  # model mode only: torch stays out of simulation

        chunks = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            table = self._timed(req, self.cache.page_table)
            chunks.append(SeqChunk(list(req.all_token_ids[start : start + n]), start, table))
        logits = self.model.step(chunks)  # type: ignore[union-attr]  # [B, vocab]
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
