"""The hashchain host tier (vLLM 0.33's OffloadingConnector) under a lifecycle machine with a
shadow KV model of both tiers.

Device slots hold the KV last written into them (test_stateful.ShadowKV); host chunks hold what
the tier's transfer jobs copied (the machine is the connector's worker: a store copies the
request's device blocks when it is submitted, a load copies host chunks into device blocks at
admission). A released request's blocks are read as they were at its release (vLLM flushes a
store before its source blocks are reused). After every rule:

* ``check_invariants()``: device free + evictable + in use == total and the same for the host
  pages; the CPU manager's ref counts, free list and policy agree; every job's chunks are
  pinned;
* every live request's computed positions hold its own KV, and a hit served partly from the
  host hands back exactly that prefix's KV (loaded pages included), also for a match taken
  rules before its allocate.

Issue 33's interleavings, as vLLM 0.33's scheduler makes them:

* async host loads (``admit_loading_later``): a host hit admitted with ``allocate(req, 0, m)``
  holds exactly the GPU hit's and the loaded blocks, computes nothing while
  ``host_tier.load_pending`` (1 + ``host_ack_delay`` step boundaries, while the other rules run on),
  then allocates its first chunk (``first_chunk_after_load``) and reads the loaded KV;
* finish order (``finish_several_in_one_step``): at every step boundary (``_advance``) the
  finish callbacks are exactly the requests released in the step before, in release order,
  and come after every store of the step (vLLM ``_build_connector_meta``);
* KV events (``OffloadLifecycleEvents``): a finished load's blocks are one BlockStored of their
  own, the blocks after them (reserved at admission, or computed) the next, whose parent is
  the last loaded block's hash; replayed into a multiset and Dynamo's ``BlockIndex`` after
  every rule, the events equal the cache's hash map.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import consumes, multiple, precondition, rule

from prefixcache import CacheConfig, Match, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.stateful_lifecycle import HostTierLifecycle, Lifecycle, ShadowKV
from tests.stateful_rules import VOCAB, new_request_rule
from tests.stateful_tier_loads import Loading, TierLoadEvents
from tests.strategies import NAMESPACES

SEEN: defaultdict[str, Counter[str]] = defaultdict(Counter)  # per machine: what its runs exercised


@dataclass(slots=True)
class Admission:
    """How the admission in progress goes on: ``waits``, a host hit loaded asynchronously (only
    loaded now, its first chunk computed once the load is acknowledged), with
    ``reserves_chunk`` the chunk reserved at admission too."""

    waits: bool = False
    reserves_chunk: bool = False


class OffloadLifecycle(HostTierLifecycle, TierLoadEvents):
    page_size = 4
    capacity_pages = 14
    chunk_tokens = 8  # two GPU blocks per host chunk
    host_chunks = 6
    policy = "lru"
    ack_delay = 0
    name = "lru"
    max_prompt = 44
    SEEN = SEEN

    def start(self) -> None:
        config = CacheConfig(self.capacity_pages * self.page_size, self.page_size)
        tier = HostTierConfig(
            capacity_tokens=self.host_chunks * self.chunk_tokens,
            block_size=self.chunk_tokens,
            eviction_policy=self.policy,
        )
        self.cache = make_cache(
            "hashchain", config, host_tier=tier, host_ack_delay=self.ack_delay, kv_events=self.kv_events
        )
        connector = self.cache.offload.connector
        connector.worker = self._transfer
        # The CPU manager's protocol calls within one step boundary: ("store" | "finish", req id)
        self.manager_calls: list[tuple[str, str]] = []
        for name, method in (("store", "prepare_store"), ("finish", "on_request_finished")):
            setattr(connector.manager, method, self._spy(name, getattr(connector.manager, method)))
        self.released_now: list[str] = []  # released since the last step boundary
        self.released_prev: list[str] = []  # released in the step before: finished at the next
        self.loading: dict[str, Loading] = {}
        self.admission = Admission()
        self._start_events()
        self.shadows = [ShadowKV(self.page_size)]
        self.host: dict[tuple[int, int], tuple] = {}  # (chunk id, block in chunk) -> its KV
        self.released: dict[str, dict[int, tuple]] = {}  # rid -> its blocks' KV at release
        self.served: list[tuple[tuple[int, ...], tuple]] = []  # what released requests computed

    def _spy(self, name: str, method: Any) -> Any:
        def call(*args: Any) -> Any:
            self.manager_calls.append((name, args[-1].req_id))  # the ReqContext is the last argument
            return method(*args)

        return call

    # ------------------------------------------------------------ the worker
    def _block(self, block_id: int) -> tuple:
        p, slots = self.page_size, self.shadows[0].slots
        return tuple(slots.get(block_id * p + i) for i in range(p))

    def _transfer(self, job) -> None:  # type: ignore[no-untyped-def]
        p, slots = self.page_size, self.shadows[0].slots
        for block_id, chunk_id, b in job.copies:
            if job.is_store:
                live = job.req_id in self.live_reqs
                self.host[(chunk_id, b)] = (
                    self._block(block_id) if live else self.released[job.req_id][block_id]
                )
            else:
                content = self.host[(chunk_id, b)]
                for i in range(p):
                    slots[block_id * p + i] = content[i]

    # ------------------------------------------------------------ what differs
    def tokens_to_reserve(self, match: Match, n: int) -> int:
        return 0 if self.admission.waits and not self.admission.reserves_chunk else n

    def begin(self, req: Request, match: Match, n: int) -> None:
        if self.admission.waits:
            self._wait_for_load(req, match, n, self.admission.reserves_chunk)
        else:
            self._compute(req, n)

    def _admit(  # type: ignore[no-untyped-def]
        self, req: Request, match, chunk: int, what: str, waits: bool = False, reserves_chunk: bool = False
    ):
        """Admit ``req`` and compute its first chunk, or, with ``waits`` and a host hit that
        loads asynchronously, only load it (``allocate(req, 0, m)``, vLLM's scheduler; with
        ``reserves_chunk`` the chunk is reserved now too) and leave it to
        ``first_chunk_after_load``."""
        current = self.cache.revalidate(match)
        if current.pending:
            with pytest.raises(ValueError, match="pending"):
                self.cache.allocate(req, 1, match)
            return multiple(req)  # retried later, as vLLM's scheduler does
        waits = waits and current.host_tokens > 0 and not self.cache.host_tier.load_overlapped
        self.admission = Admission(waits, reserves_chunk)
        return super()._admit(req, current, chunk, what)

    def _wait_for_load(self, req: Request, match: Any, chunk: int, reserved: bool) -> None:
        load_end = match.tokens + match.external_tokens
        if not reserved:  # vLLM allocate_slots(num_new_tokens=0, num_external_computed_tokens)
            assert len(self.cache.page_table(req)) == -(-load_end // self.page_size), (
                f"{req.request_id}: an async load's admission took blocks past the GPU hit and the "
                f"loaded ones ({match.tokens} + {match.external_tokens} tokens)"
            )
        pending = self.cache.host_tier.load_pending(req)
        assert pending, f"{req.request_id}: its load was acknowledged at admission"
        self.loading[req.request_id] = Loading(
            req, match.tokens, load_end, chunk, reserved, 1 + self.ack_delay
        )

    @rule(
        target=Lifecycle.waiting,
        req=consumes(Lifecycle.waiting),
        chunk=st.integers(1, 16),
        reserves_chunk=st.booleans(),
    )
    def admit_loading_later(self, req: Request, chunk: int, reserves_chunk: bool):  # type: ignore[no-untyped-def]
        """vLLM's admission of a request whose host hit loads asynchronously (a plain admission
        when there is no host hit)."""
        return self._admit(req, self.cache.lookup(req), chunk, "hit loaded later", True, reserves_chunk)

    @precondition(lambda self: any(w.steps_left == 0 for w in self.loading.values()))
    @rule(data=st.data())
    def first_chunk_after_load(self, data: st.DataObject) -> None:
        """The request's first step once its load is acknowledged (any step from then on: the
        other rules run meanwhile): its first chunk is allocated and computed after the loaded
        KV. (One that reserved its chunk at admission computes it in the step its load is
        acknowledged, ``_advance``: its reserved blocks are published then, as vLLM publishes
        the blocks of the tokens it schedules.)"""
        ready = sorted(r for r, w in self.loading.items() if not w.steps_left)
        self._first_chunk(self.loading[data.draw(st.sampled_from(ready))])

    def _first_chunk(self, w: Loading) -> None:
        req, hit = w.req, w.req.num_computed_tokens
        self._check(req, hit, "the loaded KV at its first step")
        if not self._allocate(req, w.chunk):
            return
        self._compute(req, w.chunk)
        del self.loading[req.request_id]
        self.count("first chunks after a load")
        self._check_first_chunk_events(w, hit)

    @precondition(lambda self: len(self.live_reqs) > len(self.loading))
    @rule(data=st.data(), chunk=st.integers(1, 16))
    def step(self, data: st.DataObject, chunk: int) -> None:
        """A running request's next chunk or decode token (a loading one computes nothing)."""
        self._step(self._pick(data, self.live_reqs.keys() - self.loading.keys()), chunk)

    new_request = new_request_rule(share=40, suffix=12, namespaces=NAMESPACES[:2])

    @precondition(lambda self: self.corpus)
    @rule(target=Lifecycle.waiting)
    def revisit(self) -> Request:
        """A request repeating an earlier one's tokens plus one (often a hit across tiers)."""
        base, ns = self.rng.choice(self.corpus)
        tokens = base + (self.rng.randrange(VOCAB),)
        self.counter += 1
        return Request(f"r{self.counter}", tokens[-44:], cache_salt=ns[0], lora_name=ns[1])

    @rule(
        target=Lifecycle.waiting,
        length=st.integers(9, 40),
        chunk=st.integers(1, 32),
        waits=st.booleans(),
        reserves_chunk=st.booleans(),
    )
    def serve_again(self, length: int, chunk: int, waits: bool, reserves_chunk: bool):  # type: ignore[no-untyped-def]
        """A conversation's next turn: a request computes its prompt and finishes, its stores are
        acknowledged, the device's copy is evicted, then the repeat (most often served from
        the host) is admitted, computing at once or, with ``waits``, once its load is done."""
        base, ns = (
            self.rng.choice(self.served) if self.served and self.rng.random() < 0.5 else ((), (None, None))
        )
        tokens = (base + tuple(self.rng.randrange(VOCAB) for _ in range(length)))[:length]
        self.counter += 1
        first = Request(f"r{self.counter}", tokens, cache_salt=ns[0], lora_name=ns[1])
        m = self.cache.lookup(first)
        hit = m.tokens + m.host_tokens
        if m.pending or not self.cache.allocate(first, len(tokens) - hit, m):
            return multiple()
        self._check(first, hit, "first turn")
        self._compute(first, len(tokens) - hit)
        self.live_reqs[first.request_id] = first
        self.release_request(first, preempt=False)
        for _ in range(3 + self.ack_delay):
            self._advance()
        self._evict(10**6)
        self.counter += 1
        again = Request(
            f"r{self.counter}", (*tokens, self.rng.randrange(VOCAB)), cache_salt=ns[0], lora_name=ns[1]
        )
        return self._admit(again, self.cache.lookup(again), chunk, "next turn", waits, reserves_chunk)

    @rule(steps=st.integers(1, 3))
    def advance(self, steps: int) -> None:
        """Engine step boundaries: stores are built and submitted, transfers acknowledged."""
        for _ in range(steps):
            self._advance()

    def _advance(self) -> None:
        """One step boundary, checked as vLLM's ``build_connector_meta`` and
        ``update_connector_output`` order it: the requests released in the step before get
        their finish callback once, in release order, after every store of the step (so a
        recency commit cannot reorder the next request's store evictions); each async load is
        acknowledged exactly 1 + ack_delay boundaries after its admission, and then (events
        on) caches its blocks as their own BlockStored."""
        self._take_events()  # what the rule did before the boundary
        self.manager_calls.clear()
        self.cache.host_tier.advance_transfers()
        finishing, self.released_prev, self.released_now = self.released_prev, self.released_now, []
        finished = [rid for call, rid in self.manager_calls if call == "finish"]
        assert finished == finishing, (
            f"finish callbacks {finished}, expected {finishing} (released the step before)"
        )
        calls = [call for call, _ in self.manager_calls]
        assert "store" not in calls[calls.index("finish") :] if finished else True, (
            f"a store made after a finish callback in one step: {self.manager_calls}"
        )
        if len(finished) > 1:
            self.count("steps finishing several")
        events = self._take_events()
        acknowledged = []
        for w in self.loading.values():
            if not w.steps_left:
                continue
            w.steps_left -= 1
            assert self.cache.host_tier.load_pending(w.req) == (w.steps_left > 0), (
                f"{w.req.request_id}: load pending={self.cache.host_tier.load_pending(w.req)} with "
                f"{w.steps_left} step boundaries to its acknowledgement"
            )
            if not w.steps_left:
                acknowledged.append(w)
                self._check_load_events(w, events)
        for w in acknowledged:
            if w.reserved:
                self._first_chunk(w)

    @precondition(lambda self: len(self.live_reqs) >= 2)
    @rule(data=st.data())
    def finish_several_in_one_step(self, data: st.DataObject) -> None:
        """Several requests finish in one step (loading ones too: vLLM aborts a request waiting
        for its KV); the next boundary ends that step, the one after builds their final stores
        and then, all stores made, their finish callbacks (checked in ``_advance``)."""
        rids = data.draw(st.lists(st.sampled_from(sorted(self.live_reqs)), min_size=2, unique=True))
        for rid in rids:
            self.release_request(self.live_reqs[rid], preempt=False)
        self._advance()
        self._advance()

    def _release(self, req: Request) -> None:
        self.loading.pop(req.request_id, None)
        self.released_now.append(req.request_id)
        self.released[req.request_id] = {b: self._block(b) for b in self.cache.page_table(req)}
        self.cache.release(req)
        entry = (tuple(req.all_token_ids[: req.num_computed_tokens]), (req.cache_salt, req.lora_name))
        self.corpus.append(entry)
        self.served.append(entry)

    def _evict(self, num_tokens: int) -> int:
        host = self.cache.host_tier.usage()
        freed = super()._evict(num_tokens)
        assert self.cache.host_tier.usage() == host, "a device eviction touched the host tier"
        return freed

    @rule()
    def evict_device(self) -> None:
        """All unpinned device KV dropped: only the host tier can serve it back."""
        self._evict(10**6)

    reset = rule()(Lifecycle.reset)

    def after_reset(self) -> None:
        assert tuple(self.cache.host_tier.usage()) == (self.host_chunks, 0, 0)
        self.released_now.clear()  # the connector's request states are dropped with it
        self.released_prev.clear()

    def check_more(self) -> None:
        self._check_events_agree()


class OffloadLifecycleARC(OffloadLifecycle):
    policy = "arc"
    name = "arc"


class OffloadLifecycleSlowAcks(OffloadLifecycle):
    ack_delay = 2
    host_chunks = 4
    name = "lru_ack2"


class OffloadLifecycleEvents(OffloadLifecycle):
    ack_delay = 1
    kv_events = True
    name = "lru_ack1_events"


MACHINES = [OffloadLifecycle, OffloadLifecycleARC, OffloadLifecycleSlowAcks, OffloadLifecycleEvents]


@pytest.mark.parametrize("machine", MACHINES)
def test_host_tier_lifecycle_keeps_both_tiers_consistent_and_never_corrupts_kv(machine: type) -> None:
    seen = SEEN[machine.name] = Counter()
    machine.TestCase().runTest()
    for what in ("host hits", "first chunks after a load", "steps finishing several"):
        assert seen[what] > 0, f"no {what}: the machine proved nothing of it"
    print(f"stateful steps run: host tier {machine.name} " + " ".join(f"{k}={v}" for k, v in seen.items()))
