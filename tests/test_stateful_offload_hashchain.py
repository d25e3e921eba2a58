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
"""

from __future__ import annotations

import random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, multiple, precondition, rule

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.stateful_admission import AdmissionRules
from tests.strategies import NAMESPACES
from tests.test_stateful import VOCAB, ShadowKV

STEPS: dict[str, int] = {}
HOST_HITS: dict[str, int] = {}


class OffloadLifecycle(AdmissionRules):
    page_size = 4
    capacity_pages = 14
    chunk = 8  # two GPU blocks per chunk
    host_chunks = 6
    policy = "lru"
    ack_delay = 0
    name = "lru"

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        config = CacheConfig(self.capacity_pages * self.page_size, self.page_size)
        tier = HostTierConfig(
            capacity_tokens=self.host_chunks * self.chunk, block_size=self.chunk, eviction_policy=self.policy
        )
        self.cache = make_cache("hashchain", config, host_tier=tier, host_ack_delay=self.ack_delay)
        self.cache.offload.connector.worker = self._transfer
        self.shadow = ShadowKV(self.page_size)
        self.host: dict[tuple[int, int], tuple] = {}  # (chunk id, block in chunk) -> its KV
        self.released: dict[str, dict[int, tuple]] = {}  # rid -> its blocks' KV at release
        self.live_reqs: dict[str, Request] = {}
        self.corpus: list[tuple[tuple[int, ...], tuple]] = []  # (tokens, namespace)
        self.served: list[tuple[tuple[int, ...], tuple]] = []  # what released requests computed
        self.counter = 0

    # ------------------------------------------------------------ the worker
    def _block(self, block_id: int) -> tuple:
        p = self.page_size
        return tuple(self.shadow.slots.get(block_id * p + i) for i in range(p))

    def _transfer(self, job) -> None:  # type: ignore[no-untyped-def]
        p = self.page_size
        for block_id, chunk_id, b in job.copies:
            if job.is_store:
                live = job.req_id in self.live_reqs
                self.host[(chunk_id, b)] = (
                    self._block(block_id) if live else self.released[job.req_id][block_id]
                )
            else:
                content = self.host[(chunk_id, b)]
                for i in range(p):
                    self.shadow.slots[block_id * p + i] = content[i]

    # ------------------------------------------------------------ rules
    def _snapshot(self) -> tuple:
        c = self.cache
        return (c.usage(), c.host_usage(), {r.request_id: tuple(c.page_table(r)) for r in c.live_requests})

    def _compute(self, req: Request, n: int) -> None:
        self.shadow.write(self.cache, req, req.num_computed_tokens, req.num_computed_tokens + n)
        req.num_computed_tokens += n
        self.cache.commit(req)

    @rule(
        target=AdmissionRules.waiting,
        share=st.integers(0, 40),
        suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
        ns=st.sampled_from(NAMESPACES[:2]),
    )
    def new_request(self, share: int, suffix: list[int], ns: tuple) -> Request:
        base = self.rng.choice(self.corpus)[0] if self.corpus else ()
        tokens = (base[:share] + tuple(suffix))[:44]
        self.corpus.append((tokens, ns))
        self.counter += 1
        return Request(f"r{self.counter}", tokens, cache_salt=ns[0], lora_name=ns[1])

    def _admit(self, req: Request, match, chunk: int, what: str):  # type: ignore[no-untyped-def]
        current = self.cache.revalidate(match)
        if current.pending:
            with pytest.raises(ValueError, match="pending"):
                self.cache.allocate(req, 1, match)
            return multiple(req)  # retried later, as vLLM's scheduler does
        hit = current.tokens + current.host_tokens
        assert hit <= req.num_tokens - 1
        n = min(chunk, req.num_tokens - hit)
        if -(-(hit + n) // self.page_size) > self.capacity_pages - 1:
            return multiple()
        before = self._snapshot()
        if not self.cache.allocate(req, n, current):
            assert self._snapshot() == before, "a failed allocate changed the cache"
            return multiple(req)
        assert req.num_computed_tokens == hit
        assert self.cache.loaded_tokens(req) == current.host_tokens
        if current.host_tokens:
            HOST_HITS[self.name] = HOST_HITS.get(self.name, 0) + 1
        self.shadow.check(self.cache, req, hit, f"{what} (host part {current.host_tokens})")
        self._compute(req, n)
        self.live_reqs[req.request_id] = req
        return multiple()

    @precondition(lambda self: self.live_reqs)
    @rule(data=st.data(), chunk=st.integers(1, 16))
    def step(self, data: st.DataObject, chunk: int) -> None:
        req = self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs)))]
        if req.num_computed_tokens == req.num_tokens:
            req.append_output_token_ids(self.rng.randrange(VOCAB))
            chunk = 1
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        if -(-(req.num_computed_tokens + n) // self.page_size) > self.capacity_pages - 1:
            return
        before = self._snapshot()
        if self.cache.allocate(req, n):
            self._compute(req, n)
        else:
            assert self._snapshot() == before, "a failed extend changed the cache"

    @precondition(lambda self: self.corpus)
    @rule(target=AdmissionRules.waiting)
    def revisit(self) -> Request:
        """A request repeating an earlier one's tokens plus one (often a hit across tiers)."""
        base, ns = self.rng.choice(self.corpus)
        tokens = base + (self.rng.randrange(VOCAB),)
        self.counter += 1
        return Request(f"r{self.counter}", tokens[-44:], cache_salt=ns[0], lora_name=ns[1])

    @rule(target=AdmissionRules.waiting, length=st.integers(9, 40), chunk=st.integers(1, 32))
    def serve_again(self, length: int, chunk: int):  # type: ignore[no-untyped-def]
        """A conversation's next turn: a request computes its prompt and finishes, its stores are
        acknowledged, the device's copy is evicted, then the repeat (most often served from
        the host) is admitted."""
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
        self.shadow.check(self.cache, first, hit, "first turn")
        self._compute(first, len(tokens) - hit)
        self.live_reqs[first.request_id] = first
        self.release_request(first, preempt=False)
        for _ in range(3 + self.ack_delay):
            self.cache.advance_transfers()
        self.evict(10**6)
        self.counter += 1
        again = Request(
            f"r{self.counter}", (*tokens, self.rng.randrange(VOCAB)), cache_salt=ns[0], lora_name=ns[1]
        )
        return self._admit(again, self.cache.lookup(again), chunk, "next turn")

    @rule(steps=st.integers(1, 3))
    def advance(self, steps: int) -> None:
        """Engine step boundaries: stores are built and submitted, transfers acknowledged."""
        for _ in range(steps):
            self.cache.advance_transfers()

    @precondition(lambda self: self.live_reqs)
    @rule(target=AdmissionRules.waiting, data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool):  # type: ignore[no-untyped-def]
        return self.release_request(
            self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs)))], preempt
        )

    def release_request(self, req: Request, preempt: bool):  # type: ignore[no-untyped-def]
        del self.live_reqs[req.request_id]
        self.released[req.request_id] = {b: self._block(b) for b in self.cache.page_table(req)}
        self.cache.release(req)
        entry = (tuple(req.all_token_ids[: req.num_computed_tokens]), (req.cache_salt, req.lora_name))
        self.corpus.append(entry)
        self.served.append(entry)
        if not preempt:
            return multiple()
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        return multiple(req)

    @rule(num_tokens=st.integers(0, 64))
    def evict(self, num_tokens: int) -> None:
        host = self.cache.host_usage()
        self.cache.evict(num_tokens)
        assert self.cache.host_usage() == host, "a device eviction touched the host tier"

    @rule()
    def evict_device(self) -> None:
        """All unpinned device KV dropped: only the host tier can serve it back."""
        self.evict(10**6)

    @rule()
    def reset(self) -> None:
        if self.cache.reset():
            assert tuple(self.cache.host_usage()) == (self.host_chunks, 0, 0)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        STEPS[self.name] = STEPS.get(self.name, 0) + 1
        self.cache.check_invariants()
        for req in self.live_reqs.values():
            self.shadow.check(self.cache, req, req.num_computed_tokens, "live request")


class OffloadLifecycleARC(OffloadLifecycle):
    policy = "arc"
    name = "arc"


class OffloadLifecycleSlowAcks(OffloadLifecycle):
    ack_delay = 2
    host_chunks = 4
    name = "lru_ack2"


@pytest.mark.parametrize("machine", [OffloadLifecycle, OffloadLifecycleARC, OffloadLifecycleSlowAcks])
def test_host_tier_lifecycle_keeps_both_tiers_consistent_and_never_corrupts_kv(machine: type) -> None:
    STEPS.pop(machine.name, None)
    HOST_HITS.pop(machine.name, None)
    machine.TestCase().runTest()
    assert HOST_HITS.get(machine.name, 0) > 0, "no hit was served from the host: the machine proved nothing"
    steps, hits = STEPS[machine.name], HOST_HITS[machine.name]
    print(f"stateful steps run: host tier {machine.name} steps={steps} host hits={hits}")
