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
computes real KV. The clock is simulated (``cost_model.CostModel``); when nothing runs it jumps
to the next arrival (``arrivals.Arrivals`` reads the source lazily). Per-request
``records.RequestRecord``s are what the research layer analyses; simulated output tokens come
from ``synthesis``.

Decode steps inside held pages are deferred (``multi_step``, on by default, ``run`` only): a
step that changes nothing in the cache but the request's counters (``PrefixCache.decode_room``
while ``decode_in_place_now``: no page taken, evicted or published) gets no cache call and no
per-token work; the request is counted in each step's budget and clock and taken up at once
when its room runs out or anything needs it exact (see "deferred decoders" below). Where a
step that opens a page only takes it (``PrefixCache.decode_takes_pages``), a run of deferred
decoders takes the pages its step opens in one call (``take_decode_pages``) instead. When
nothing waits or arrives and every running request decodes, ``run`` jumps the clock over
those steps (a decode stretch). Records, clock and cache state are those of stepping one by
one (tests/test_engine.py checks it on every built-in workload, with tiers and without a cache).

A host tier (``PrefixCache.host_tier``, ``prefixcache.tiers``) adds loads at admission: the
tokens a match's ``host_tokens`` covers cross ``host_link`` one load after another. SGLang loads
them in the same forward, layer by layer (``HostTier.load_overlapped``): the step lasts as long as its
compute or its loads, whichever ends later. vLLM loads asynchronously: the admission reserves
only the hit (``allocate(req, 0, match)``: the loaded blocks), the request computes nothing
until its load is done, and its first chunk is allocated from the next step on. Each step begins with
``host_tier.advance_transfers()`` (stores acknowledged); a match still ``pending`` on a store is
skipped and retried, as vLLM's scheduler retries a lookup that returned None.

Each run takes fresh requests: a Request object carries its run (outputs, counters), so one
that ran already, or runs elsewhere, is refused as it arrives (``add_request``).

One match per scheduling decision: a policy that looked a waiting request up (lpm) hands its
match to the engine, which revalidates it if the index changed and passes it to ``allocate``;
FCFS looks each request up once, right before admitting it.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import repeat
from typing import Any

from prefixcache.arrivals import Arrivals
from prefixcache.cost_model import Clock, CostModel
from prefixcache.interface import Match, PrefixCache
from prefixcache.records import RequestRecord
from prefixcache.request import Request
from prefixcache.scheduler import Scheduler, make_scheduler
from prefixcache.synthesis import output_tokens
from prefixcache.tiers import HostLink


@contextmanager
def rare_full_collections() -> Iterator[None]:
    """Python's collector with thresholds for a run that builds millions of long-lived objects
    (a block per token at page size 1): by default every 25% of growth rescans all of them (a
    third of such a run's time). Young objects are still collected; the thresholds come back
    after. (vLLM and SGLang freeze the heap after start-up for the same reason.) The cluster
    simulator runs its replicas under it too."""
    before = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Engine:
    """Steps requests through a PrefixCache; see the module docstring for the policy."""

    def __init__(
        self,
        cache: PrefixCache[Any],
        scheduler: Scheduler | str = "fcfs",
        token_budget: int = 2048,
        model: Any | None = None,
        *,
        max_num_seqs: int = 256,
        cost_model: Clock | None = None,
        seed: int = 0,
        vocab_size: int = 32_000,
        check_invariants: bool = False,
        multi_step: bool = True,
        host_link: HostLink | None = None,
        time_cache_ops: bool = False,
        scheduler_reserve_full_isl: bool = False,
    ) -> None:
        """time_cache_ops: measure the wall time of every cache call into its request's
        ``RequestRecord.cache_op_ns`` (a measurement for benchmarks: two clock reads a call);
        off, the records' ``cache_op_ns`` stay 0."""
        for name, value in (("token_budget", token_budget), ("max_num_seqs", max_num_seqs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if model is not None and cache.host_tier is not None:
            raise ValueError("model mode has no host tier: its copies hold no tensors")
        self.cache = cache
        self._host_tier = cache.host_tier  # None: no tier, and no call to one
        self._chunking = cache.prefill_chunking
        self.scheduler = make_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
        self.token_budget = token_budget
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.cost_model = cost_model if cost_model is not None else CostModel.measured()
        self.seed = seed
        self.vocab_size = vocab_size
        self.check_invariants = check_invariants
        self.multi_step = multi_step
        self.host_link = host_link if host_link is not None else HostLink()
        self.time_cache_ops = time_cache_ops
        # vLLM's scheduler_reserve_full_isl (its default: on; ours off until decided): a waiting
        # request is admitted only if its whole sequence fits (PrefixCache.whole_sequence_fits).
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.records: dict[str, RequestRecord] = {}
        self.arrivals = Arrivals()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._in_prefill: set[str] = set()
        # request id -> every output token it will emit (synthesis.output_tokens), from its
        # admission to its finish: a step reads its next token by position, with no call
        self._outputs: dict[str, list[int]] = {}
        self.clock = 0.0
        self.step_count = 0
        self.num_finished = 0
        self.peak_pages_in_use = 0
        self.peak_waiting = 0  # the longest waiting queue a scheduler pass saw (lpm's fallback reads it)
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.stretched_steps = 0  # steps taken inside decode stretches (see _decode_stretch)
        self.deferred_decode_steps = 0  # decode steps of requests taken without a cache call
        # Deferred decoders (``run`` only, ``multi_step``): request id -> (the first step it
        # decodes without the cache being called, the step it is taken up again at), and the
        # requests to take up by step. See ``_defer``.
        self._deferred: dict[str, tuple[int, int]] = {}
        # sum over deferred decoders of (computed tokens - first deferred step): their context
        # at step s sums to this + s x their number (for a clock that reads context)
        self._deferred_context_base = 0
        self._take_up_at: dict[int, list[Request]] = {}
        self._may_defer = False
        self._defer_takes_pages = False  # deferred steps that open a page take it (take_decode_pages)
        self._every_step_opens = False  # ... and each one does (page size 1)
        self._loading: dict[str, float] = {}  # request id -> when its async host load is done
        self._link_free_at = 0.0  # the host link carries one load at a time
        self._overlapped_load_end = 0.0  # this step's same-forward loads end here
        self.load_wait_s = 0.0  # load time not hidden behind compute, summed over steps

    # ---------------------------------------------------------------- requests in
    def add_request(self, req: Request) -> None:
        """Take ``req`` (as it arrives from ``run``'s source, or directly): ValueError if its id
        was already added, or if it carries run state from elsewhere (see ``_check_fresh``)."""
        if req.request_id in self.records:
            raise ValueError(f"request id {req.request_id!r} was already added")
        self._check_fresh(req)
        rec = RequestRecord(req.request_id, req.arrival_time, req.num_prompt_tokens, req.max_new_tokens)
        self.records[req.request_id] = rec
        # The longest reservation is the prompt plus every output token but the last (whose
        # KV is never computed); a request that can never fit is rejected, as vLLM does.
        if req.num_prompt_tokens + max(req.max_new_tokens - 1, 0) > self.cache.config.usable_tokens:
            rec.rejected = True
            self.num_finished += 1
            return
        self.arrivals.add(req)

    def _check_fresh(self, req: Request) -> None:
        """ValueError unless ``req`` has never run: no output tokens, nothing computed, never
        preempted, not live in this engine's cache. A Request object carries its run (outputs
        appended, counters advanced), so one handed to a second engine would resume from there:
        a wrong hit rate and no output, silently.

        Refused rather than reset: the engine cannot tell a previous run's output tokens from
        tokens the caller appended on purpose, nor whether another engine is still running the
        request, so a reset could be wrong where a refusal never is. O(1) per request: a
        deferred prompt is not built for it."""
        if not (
            req.num_output_tokens or req.num_computed_tokens or req.num_preemptions or self.cache.is_live(req)
        ):
            return
        ran = []
        if req.num_output_tokens:
            ran.append(f"{req.num_output_tokens} output tokens")
        if req.num_computed_tokens:
            ran.append(f"num_computed_tokens={req.num_computed_tokens}")
        if req.num_preemptions:
            ran.append(f"num_preemptions={req.num_preemptions}")
        if self.cache.is_live(req):
            ran.append("live in the cache")
        raise ValueError(
            f"request {req.request_id!r} carries run state ({', '.join(ran)}): it ran already, "
            "or is running elsewhere. Hand every engine run fresh Request objects (generate "
            "the workload or read the trace again, or copy.deepcopy the list before its first run)"
        )

    def has_unfinished(self) -> bool:
        return bool(self.arrivals or self.waiting or self.running)

    def run(
        self, requests: Iterable[Request] = (), *, progress: bool = False, total: int | None = None
    ) -> list[RequestRecord]:
        """Step until every request has finished; returns the records.

        ``requests`` is consumed lazily (see ``arrivals``), so a long trace never sits in
        memory as token lists.
        """
        from tqdm.auto import tqdm

        self.arrivals.read_from(requests)
        if total is None and hasattr(requests, "__len__"):
            total = len(requests) + len(self.records)  # type: ignore[arg-type]
        self.defer_decoders(True)
        try:
            bar = tqdm(total=total, disable=not progress, unit="req", leave=False)
            with bar, rare_full_collections():
                self._run_to_the_end(bar)
        finally:  # a caller may step on by hand, or look at the requests: all of them exact
            self.defer_decoders(False)
        return list(self.records.values())

    def defer_decoders(self, on: bool) -> None:
        """Let ``step`` defer decode steps inside held pages (``run`` does, with ``multi_step``;
        at page size 1 every decode step opens a page, so only a cache that takes a run's pages
        at once, ``decode_takes_pages``, defers there), or stop, taking every deferred decoder
        up: its requests are exact again. A caller that steps the engine itself with deferral on
        reads a running request's length through ``num_tokens_now``; records, the clock and the
        cache are exact at every step."""
        if on:
            self._defer_takes_pages = self.cache.decode_takes_pages()
            self._every_step_opens = self._defer_takes_pages and self.cache.page_size == 1
            self._may_defer = (self.multi_step and self.model is None
                               and (self.cache.page_size > 1 or self._defer_takes_pages))
            return
        self._may_defer = False
        for req in [r for r in self.running if r.request_id in self._deferred]:
            self._take_up(req)
        self._take_up_at.clear()

    def num_tokens_now(self, req: Request) -> int:
        """``req.num_tokens`` as stepping one by one would have it now: a deferred decoder's
        tokens are appended when it is taken up."""
        deferred = self._deferred.get(req.request_id)
        return req.num_tokens if deferred is None else req.num_tokens + self.step_count - deferred[0]

    def _run_to_the_end(self, bar: Any) -> None:
        idle = 0
        tier = self._host_tier
        self._read_arrivals()
        bar.update(self.num_finished)
        while self.has_unfinished():
            before = self.num_finished
            computed = self._decode_stretch() or self.step()
            busy = computed > 0 or (tier is not None and tier.transfers_in_flight())
            idle = 0 if busy else idle + 1
            if idle > 2:
                raise RuntimeError(f"engine made no progress at step {self.step_count}: {self.waiting!r}")
            bar.update(self.num_finished - before)

    # ---------------------------------------------------------------- one step
    def step(self) -> int:
        """Run one engine step; returns the number of tokens computed in it."""
        due = self._take_up_at.pop(self.step_count, None)
        if due:  # deferred decoders whose room ran out (as the last step left them)
            for req in due:
                entry = self._deferred.get(req.request_id)
                if entry is None or entry[1] != self.step_count:
                    continue  # taken up since, or deferred again
                if not self._opens_a_page(req, entry[0]):
                    self._take_up(req)
        self._move_arrivals()
        next_arrival = self.arrivals.next_time()
        if not self.running and not self.waiting and next_arrival is not None:
            self.clock = max(self.clock, next_arrival)  # idle: jump to the next arrival
            self._move_arrivals()
        if self._host_tier is not None:
            self._host_tier.advance_transfers()
        self._overlapped_load_end = self.clock
        budget = self.token_budget
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        running = self.running
        deferred = self._deferred
        num_deferred = 0  # deferred decoders that decode this step: counted, not called
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if deferred and req.request_id in deferred:
                end = self._deferred_run_end(i)
                if end - i <= budget and self._serve_deferred_run(i, end):
                    budget -= end - i
                    num_deferred += end - i
                    i = end
                    continue
                for r in running[i:end]:  # the budget or the cache says: step them one by one
                    self._take_up(r)
            if self._loading and not self._load_done(req):
                i += 1  # its KV is still coming from the host: nothing to compute yet
                continue
            if req.request_id not in self._in_prefill:  # decoding: the run of decodes from here
                batch = self._decode_run(i, budget)
                done = self._allocate_batch(batch)
                scheduled.extend(zip(batch[:done], repeat(1)))  # (a step of one token each)
                budget -= done
                i += done
                if done == len(batch):
                    continue
                req = batch[done]  # no room for its step: preempt, as below
            start = req.num_computed_tokens
            n = min(req.num_tokens - start, budget)
            if req.request_id in self._in_prefill:  # a decode step is one token: nothing to cut
                n = self._chunking.chunk(req, start, n, budget)
            if n == 0:  # the cache wants this chunk to wait (an aligned end is out of reach)
                i += 1
                continue
            while not self._allocate(req, n):
                victim = running.pop()  # the latest admitted goes first, as in vLLM
                if victim.request_id in deferred:
                    self._take_up(victim)  # (after req: it has not decoded this step)
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
        if deferred and i < len(running):  # the budget ran out before these: no step for them
            for r in running[i:]:
                if r.request_id in deferred:
                    self._take_up(r)
        if not preempted and self.waiting and budget > 0:
            budget = self._admit_waiting(budget, scheduled)
        self.peak_pages_in_use = max(self.peak_pages_in_use, self.cache.usage().in_use)
        if not scheduled and not num_deferred:
            if self._loading:  # only loads in flight: wait for the first to land
                self.clock = max(self.clock, min(self._loading.values()))
            elif self._host_tier is not None and self._host_tier.transfers_in_flight():  # waits on the tier
                self.clock += self.cost_model.step_overhead_s
            return 0
        self._execute(scheduled, num_deferred)
        if self.check_invariants:
            self.cache.check_invariants()
        return self.token_budget - budget

    def _admit_waiting(self, budget: int, scheduled: list[tuple[Request, int]]) -> int:
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        # The queue itself, not a copy (a trace's backlog is thousands long and FCFS admits
        # from its front): nothing below changes it before _remove_waiting.
        plan = self.scheduler.schedule(self.waiting, self._lookup)
        admitted: set[str] = set()
        tier = self._host_tier
        for req in plan.order:
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if admitted and req.request_id in plan.held_back:
                continue  # its prefix is being computed by a request admitted this step
            # The policy's match if it took one (revalidated: admissions before this one may
            # have evicted or cached blocks), else the one lookup of this decision.
            match = plan.matches.get(req.request_id)
            match = self._lookup(req) if match is None else self._timed(req, self.cache.revalidate, match)
            if match.pending:
                continue  # its host copies are still being stored: retried next step
            start = match.tokens + match.host_tokens  # the chunk begins after the hit
            n = self._chunking.chunk(req, start, min(req.num_tokens - start, budget), budget, match)
            if n == 0:
                break
            # vLLM's async load: the admission reserves only the hit (the loaded blocks); the
            # chunk is allocated at the request's first step after the load, as any running one.
            loads_later = match.host_tokens > 0 and tier is not None and not tier.load_overlapped
            if self.scheduler_reserve_full_isl and not self.cache.whole_sequence_fits(req, match):
                break
            if not self._allocate(req, 0 if loads_later else n, match):
                break
            rec = self.records[req.request_id]
            if rec.admission_step is None:
                rec.admission_step, rec.admission_time = self.step_count, self.clock
                rec.hit_tokens = req.num_computed_tokens
            self.running.append(req)
            self._in_prefill.add(req.request_id)
            self._plan_outputs(req)
            admitted.add(req.request_id)
            loaded = tier.loaded_tokens(req) if tier is not None else 0
            if loaded and not self._start_load(req, loaded):
                continue  # async: it computes once the load is done, from a later step
            scheduled.append((req, n))
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

    def _execute(self, scheduled: list[tuple[Request, int]], num_deferred: int = 0) -> None:
        next_tokens = self._run_model(scheduled) if self.model is not None else None
        prefill, decode = 0, num_deferred
        in_prefill, records = self._in_prefill, self.records
        reads_context = self.cost_model.reads_context
        context = pairs = 0  # what a context-reading clock charges (see roofline.py)
        if reads_context and num_deferred:  # each decodes one token after its context
            if self.check_invariants:
                assert num_deferred == len(self._deferred), "a deferred decoder left out of its step"
            context = self._deferred_context_base + num_deferred * self.step_count
            pairs = context + num_deferred
        reqs = []
        for req, n in scheduled:
            if req.request_id in in_prefill:
                prefill += n
                records[req.request_id].computed_prefill_tokens += n
            else:
                decode += n
            if reads_context:
                c = req.num_computed_tokens
                context += c
                pairs += n * c + n * (n + 1) // 2
            req.num_computed_tokens += n
            reqs.append(req)
        self._timed_batch(reqs, self.cache.commit_batch)
        sequences = len(reqs) + num_deferred
        dt = self.cost_model.step_time(prefill, decode, sequences, pairs, context)
        end = self.clock + dt  # times: at the end of the step
        if self._overlapped_load_end > end:
            self.load_wait_s += self._overlapped_load_end - end
            end = self._overlapped_load_end
        self.clock = end
        self.prefill_tokens += prefill
        self.decode_tokens += decode
        step, clock = self.step_count, self.clock
        for idx, req in enumerate(reqs):
            num_tokens = req.num_tokens
            if req.num_computed_tokens < num_tokens:
                continue  # mid-prefill: no token yet
            in_prefill.discard(req.request_id)
            rec = records[req.request_id]
            num_output = num_tokens - req.num_prompt_tokens
            if num_output < req.max_new_tokens:
                if next_tokens is not None:
                    token = next_tokens[idx]
                else:  # the planned or simulated token at this output position
                    token = self._outputs[req.request_id][num_output]
                req.append_output_token_ids(token)
                num_output += 1
                rec.output_tokens = num_output
                if rec.first_token_step is None:
                    rec.first_token_step, rec.first_token_time = step, clock
            if num_output >= req.max_new_tokens:
                self._finish(req)
            elif self._may_defer:
                self._defer(req, step + 1)
        self.step_count += 1  # step numbers count from 0, as admission_step does

    def _decode_stretch(self) -> int:
        """``run``'s shortcut (``multi_step``): take at once the coming steps that would only
        decode inside held pages: nothing waits or arrives before their last one starts, every
        running request decodes in each (the budget covers them all), none finishes, and the
        cache says each step changes nothing but the reservations (``decode_steps_in_place``).
        Every running request is deferred (``_defer``) over those steps and the clock moves on:
        the records, the clock and the cache end exactly as after stepping one by one. Returns
        the tokens computed (0: take a normal step)."""
        if not self._may_defer or self._every_step_opens:
            return 0  # (at page size 1 every step takes a page: no stretch)
        self._move_arrivals()  # as the step would begin
        running = self.running
        if self.waiting or self._in_prefill or self._loading:
            return 0
        if not 0 < len(running) <= self.token_budget:  # each running request decodes each step
            return 0
        if not self.cache.decode_in_place_now():
            return 0
        now, deferred = self.step_count, self._deferred
        steps = min(
            deferred[req.request_id][1] - now if req.request_id in deferred else self._steps_to_defer(req)
            for req in running
        )
        width = len(running)
        dt = self.cost_model.step_time(0, width, width)
        reads_context = self.cost_model.reads_context
        if reads_context:  # the running requests' context at this step
            context = self._deferred_context_base + len(deferred) * now
            context += sum(r.num_computed_tokens for r in running if r.request_id not in deferred)
        next_arrival = self.arrivals.next_time()
        clock, taken = self.clock, 0
        while taken < steps and not (taken and next_arrival is not None and next_arrival <= clock):
            if reads_context:  # each step's context is one token longer per request
                at = context + taken * width
                dt = self.cost_model.step_time(0, width, width, at + width, at)
            clock += dt  # as each step adds its time (the same float sum)
            taken += 1
        steps = taken
        if steps < 2:
            return 0  # a single step is just as quick the normal way
        for req in running:
            if req.request_id not in deferred:
                self._defer(req, now)
        self.clock = clock
        self.decode_tokens += steps * len(running)
        self.step_count += steps
        self.stretched_steps += steps
        if self.check_invariants:
            self.cache.check_invariants()
        return steps * len(running)

    # ---------------------------------------------------------------- deferred decoders
    # A decode step inside pages a request already holds changes nothing in the cache but the
    # request's own counters (``PrefixCache.decode_room``, while ``decode_in_place_now``). Such
    # steps are deferred: the request stays in ``running`` and is counted in each step's
    # budget and clock, but no cache call and no per-token work is made for it until the step
    # its room runs out, the one that emits its last token, or anything that needs it exact
    # (the step cannot serve every deferred decoder, the cache is no longer in place, a
    # preemption): then ``_take_up`` applies the deferred steps at once and it is stepped one
    # by one again. Where a step that opens a page only takes it (``decode_takes_pages``:
    # radix, no cache), a deferred decoder whose room runs out is not taken up: its run takes
    # the pages of those opening one in one call (at page size 1, every step of every one),
    # appended to their page tables, and the reservations follow at the take-up.
    def _steps_to_defer(self, req: Request) -> int:
        """How many coming decode steps of ``req`` may be deferred: its room in the cache (at
        page size 1, where each step takes its page in its run, every one), but not the step
        that emits its last token (it finishes there)."""
        last = self._finishing_step(req, 0)
        return last if self._every_step_opens else min(self.cache.decode_room(req), last)

    @staticmethod
    def _finishing_step(req: Request, first: int) -> int:
        """The step that emits ``req``'s last token, for a decoder deferred from step ``first``
        (its outputs wait with it: they are the ones it had then)."""
        return first + req.max_new_tokens - req.num_output_tokens - 1

    def _opens_a_page(self, req: Request, first: int) -> bool:
        """Whether the deferred ``req``, due now, is due because its room ran out before its
        last step: where the cache takes decode pages, its run takes this step's page for it
        and it stays deferred (``_serve_deferred_run``)."""
        return self._defer_takes_pages and self.step_count < self._finishing_step(req, first)

    def _serve_deferred_run(self, start: int, end: int) -> bool:
        """Whether the deferred decoders ``running[start:end]`` take this step without being
        stepped one by one: in place (the cache says none of their steps changes it now), and
        where the cache takes decode pages, the pages of those whose step opens one (at page
        size 1 every one) taken in one call, their room extended by it. False: nothing
        changed, they are taken up."""
        if not self._defer_takes_pages:
            return self.cache.decode_in_place_now()
        opening = self.running[start:end]
        page = self.cache.page_size
        if not self._every_step_opens:
            if not self.cache.decode_in_place_now():
                return False
            now, deferred = self.step_count, self._deferred
            opening = [r for r in opening if deferred[r.request_id][1] == now]
            if not opening:
                return True
        # an in-place step after the last opening one needs the pool still calm
        calm_after = opening[-1] is not self.running[end - 1]
        if not self._timed_batch(opening, self.cache.take_decode_pages, calm_after):
            return False
        if not self._every_step_opens:  # the page holds the next ``page`` steps: due at the one after
            for req in opening:
                first = deferred[req.request_id][0]
                wake = min(now + page, self._finishing_step(req, first))
                # a wake at this step or before would never come: the decoder deferred for ever
                assert wake > now, f"{req.request_id!r} deferred again at step {now} to wake at {wake}"
                deferred[req.request_id] = (first, wake)
                self._take_up_at.setdefault(wake, []).append(req)
        return True

    def _defer(self, req: Request, first_step: int) -> None:
        """Defer ``req``'s decode steps from ``first_step`` on, as many as it may."""
        steps = self._steps_to_defer(req)
        if steps > 0:
            wake = first_step + steps
            self._deferred[req.request_id] = (first_step, wake)
            self._deferred_context_base += req.num_computed_tokens - first_step
            self._take_up_at.setdefault(wake, []).append(req)

    def _take_up(self, req: Request) -> None:
        """Apply ``req``'s deferred steps (those taken before the current step) as the steps
        one by one would have left it, and step it one by one from here."""
        first, _ = self._deferred.pop(req.request_id)
        self._deferred_context_base -= req.num_computed_tokens - first
        steps = self.step_count - first
        if not steps:
            return
        self.deferred_decode_steps += steps
        # Every token of the deferred steps at once, the last step's too: the reservation's
        # must exist, and the commit of steps inside held pages publishes nothing, so the one
        # token more that it sees changes nothing (one call, not one before and one after).
        self._emit(req, steps)
        self._timed(req, self.cache.advance_in_place, req, steps)
        req.num_computed_tokens += steps
        self._timed(req, self.cache.commit)
        self.records[req.request_id].output_tokens = req.num_output_tokens

    def _deferred_run_end(self, start: int) -> int:
        """The end of the run of deferred decoders in ``running`` from ``start``."""
        running, deferred = self.running, self._deferred
        end, count = start + 1, len(running)
        while end < count and running[end].request_id in deferred:
            end += 1
        return end

    # ---------------------------------------------------------------- helpers
    def _read_arrivals(self) -> None:
        for req in self.arrivals.read(self.clock):
            self.add_request(req)

    def _move_arrivals(self) -> None:
        self._read_arrivals()
        tier = self._host_tier
        if tier is None:
            self.waiting.extend(self.arrivals.pop_arrived(self.clock))
            return
        for req in self.arrivals.pop_arrived(self.clock):
            tier.enqueue(req)  # SGLang starts its L3 prefetch as a request is queued
            self.waiting.append(req)

    def _decode_run(self, start: int, budget: int) -> list[Request]:
        """The running requests from ``start`` on that decode this step (one token each,
        within ``budget``), up to the first that prefills: one ``allocate_batch``, in the
        running order that one-by-one allocation would follow."""
        running, in_prefill, deferred = self.running, self._in_prefill, self._deferred
        end = min(len(running), start + budget)
        k = start
        while k < end:
            rid = running[k].request_id
            if rid in in_prefill or rid in deferred:  # a prefill, or a decoder not stepped now
                break
            k += 1
        return running[start:k]

    def _allocate_batch(self, batch: list[Request]) -> int:
        """``cache.allocate_batch(batch, 1)``; each request's record is charged what its step
        evicted. Returns how many got their room."""
        result = self._timed_batch(batch, self.cache.allocate_batch, 1)
        for index, tokens in result.evicted:
            self.records[batch[index].request_id].evicted_tokens += tokens
        return int(result.done)

    def _timed_batch(self, reqs: list[Request], op: Any, *args: Any) -> Any:
        """``op(reqs, *args)``, its wall time (``time_cache_ops``) split evenly over ``reqs``'
        records: one pair of clock reads per batch, not per request."""
        if not reqs or not self.time_cache_ops:
            return op(reqs, *args)
        t0 = time.perf_counter_ns()
        try:
            return op(reqs, *args)
        finally:
            share, extra = divmod(time.perf_counter_ns() - t0, len(reqs))
            records = self.records
            for req in reqs:
                records[req.request_id].cache_op_ns += share
            records[reqs[0].request_id].cache_op_ns += extra

    def _timed(self, req: Request, op: Any, *args: Any) -> Any:
        """``op(*args)`` (``req`` when none), its wall time (``time_cache_ops``) charged to
        ``req``'s record."""
        if not self.time_cache_ops:
            return op(*args) if args else op(req)
        t0 = time.perf_counter_ns()
        try:
            return op(*args) if args else op(req)
        finally:
            self.records[req.request_id].cache_op_ns += time.perf_counter_ns() - t0

    def _lookup(self, req: Request) -> Match:
        return self._timed(req, self.cache.lookup)  # type: ignore[no-any-return]

    def _allocate(self, req: Request, n: int, match: Match | None = None) -> bool:
        """``cache.allocate(req, n, match)``, its evictions charged to ``req``'s record."""
        evicted = self.cache.stats.evicted_tokens
        ok = bool(self._timed(req, self.cache.allocate, req, n, match))
        self.records[req.request_id].evicted_tokens += self.cache.stats.evicted_tokens - evicted
        return ok

    def _start_load(self, req: Request, num_tokens: int) -> bool:
        """Queue the admitted ``req``'s host load on the link; True if it computes this step
        anyway (a same-forward load), False if it waits for the load (vLLM's async one)."""
        start = max(self._link_free_at, self.clock)
        self._link_free_at = done = start + self.host_link.transfer_time(num_tokens)
        tier = self._host_tier
        if tier is None or tier.load_overlapped:
            self._overlapped_load_end = max(self._overlapped_load_end, done)
            return True
        self._loading[req.request_id] = done
        return False

    def _load_done(self, req: Request) -> bool:
        """Whether ``req`` has no async load in flight at this step's start (and forget it)."""
        done = self._loading.get(req.request_id)
        if done is None:
            return True
        if done > self.clock:
            return False
        del self._loading[req.request_id]
        return True

    def _preempt(self, req: Request) -> None:
        self._loading.pop(req.request_id, None)
        self._timed(req, self.cache.release)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.records[req.request_id].preemptions += 1
        self._in_prefill.discard(req.request_id)
        self.waiting.appendleft(req)

    def _finish(self, req: Request) -> None:
        self._timed(req, self.cache.release)
        self._outputs.pop(req.request_id, None)
        self.running.remove(req)
        rec = self.records[req.request_id]
        rec.finish_step, rec.finish_time = self.step_count, self.clock
        if rec.first_token_step is None:  # max_new_tokens == 0: prefill only
            rec.first_token_step, rec.first_token_time = self.step_count, self.clock
        self.num_finished += 1

    def _plan_outputs(self, req: Request) -> None:
        """Make the admitted ``req``'s output tokens, once (a preempted request keeps them)."""
        if self.model is None and req.request_id not in self._outputs:
            self._outputs[req.request_id] = output_tokens(req, self.seed, self.vocab_size)

    def _emit(self, req: Request, n: int) -> None:
        """Append ``req``'s next ``n`` output tokens (within its ``max_new_tokens``), as ``n``
        steps one by one would."""
        k = req.num_output_tokens
        req.append_known_output(self._outputs[req.request_id][k : k + n])  # checked where made

    def _run_model(self, scheduled: list[tuple[Request, int]]) -> list[int]:
        from prefixcache.model import SeqChunk  # model mode only: torch stays out of simulation

        chunks = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            tables = self._timed(req, self.cache.page_tables)  # one per cache.kv_groups() entry
            chunks.append(SeqChunk(list(req.all_token_ids[start : start + n]), start, tables[0], tables))
        logits = self.model.step(chunks)  # type: ignore[union-attr]  # [B, vocab]
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
