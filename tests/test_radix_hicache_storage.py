"""HiCache's L3 storage tier and prefetch (backends/radix/hicache_storage.py) against SGLang
0.5.23 as read from the installed code (``unified_radix_cache.py``: ``write_backup_storage``,
``prefetch_from_storage``, ``check_prefetch_progress``, ``_can_terminate_prefetch``,
``_handle_prefetch_result``, the storage drains; ``cache_controller.py``: ``_storage_hit_query``,
``prefetch_rate_limited``). There is no CPU-runnable upstream recording of L3 (its prefetch and
backup threads need a storage backend behind the controller), so no fixture: every expectation
below follows the 0.5.23 code as read, on our clock of engine steps (``advance_transfers``).

L3 is shared by instances, so scenario tests fill it from one cache and look up on another
that shares its store (L1 + L2 miss there)."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from prefixcache.backends.radix.hicache_storage import (
    DEFAULT_PREFETCH_POLICY,
    DEFAULT_PREFETCH_THRESHOLD,
    DEFAULT_STORAGE_PAGES_PER_STEP,
    HiCacheStorage,
    namespace_seed,
    page_keys,
)
from prefixcache.backends.radix.key import RadixKey

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.helpers import Checked, tokens
from tests.test_radix_hicache import nodes, serve, state

pytestmark = pytest.mark.filterwarnings("ignore:HiCache host pool")

PROMPT = tokens(1000, 7)


def l3cache(capacity: int = 2000, page_size: int = 1, **tier: object) -> Checked:
    clock = itertools.count().__next__
    cfg = HostTierConfig(storage=True, **tier)  # type: ignore[arg-type]
    return Checked(make_cache("radix", CacheConfig(capacity, page_size), host_tier=cfg, clock=clock))


def step(cache: Checked, n: int = 1) -> None:
    for _ in range(n):
        cache.host_tier.advance_transfers()
        cache.check_invariants()


def filled_l3(num_tokens: int, page_size: int = 1) -> Checked:
    """A cache whose L3 holds the first ``num_tokens`` of PROMPT (write-through, acked)."""
    writer = l3cache(page_size=page_size, prefetch_policy="best_effort")  # never pending
    serve(writer, Request("w", PROMPT[:num_tokens]))  # its host copy acks in serve's step
    step(writer)  # the storage write acks: the host copy is unpinned
    assert len(writer.storage.store) == num_tokens // page_size
    return writer


def sharing(writer: Checked, page_size: int = 1, **tier: object) -> Checked:
    cache = l3cache(page_size=page_size, **tier)
    cache.storage.store = writer.storage.store  # one storage backend behind two instances
    return cache


# ---------------------------------------------------------------------------- scenario 5
@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_scenario_5_l3_threshold_and_prefetch_policies(policy: str) -> None:
    """REFERENCE-tiers scenario 5 under 0.5.23: a 1000-token prompt, L1 + L2 miss.
    L3 holds 200 -> the hit query's 200 < prefetch_threshold 256: revoked, nothing loads.
    L3 holds 512 -> prefetched (128 pages per step after the query drains): wait_complete
    (and timeout, well inside its 1.125 s) admit only once all 512 reached host and load
    them; best_effort, polled after 2 arrival steps, stops there and loads the 256 arrived."""
    small = sharing(filled_l3(200), prefetch_policy=policy)
    req = Request("b", list(PROMPT))
    if policy == "best_effort":
        small.host_tier.enqueue(req)
    else:
        assert small.lookup(req).pending  # the hit query is in flight
    step(small)  # the query drains: 200 < 256
    assert small.storage.revoked == 1 and not small.storage.ops
    m = small.lookup(req)
    assert (m.pending, m.tokens, m.host_tokens) == (False, 0, 0)
    assert small.host_tier.usage().in_use == 0

    cache = sharing(filled_l3(512), prefetch_policy=policy)
    req = Request("b", list(PROMPT))
    if policy == "best_effort":
        cache.host_tier.enqueue(req)  # enqueued: the scheduler reaches it 3 steps later
        step(cache, 3)  # drain, then 2 x 128 pages
        m = cache.lookup(req)  # admission: best_effort stops the prefetch here
        assert (m.pending, m.tokens, m.host_tokens) == (False, 0, 256)
    else:
        arrived = []
        for _ in range(5):  # issue, drain, 4 x 128 pages
            m = cache.lookup(req)
            assert m.pending and m.host_tokens == 0
            with pytest.raises(ValueError, match="pending"):
                cache.allocate(req, 10, m)
            step(cache)
            arrived.append(cache.storage.ops[req.request_id].completed if cache.storage.ops else 512)
        assert arrived == [0, 128, 256, 384, 512]
        m = cache.lookup(req)
        assert (m.pending, m.tokens, m.host_tokens) == (False, 0, 512)
    loaded = m.host_tokens
    assert cache.allocate(req, req.num_tokens - loaded, m)
    assert req.num_computed_tokens == loaded and cache.host_tier.loaded_tokens(req) == loaded
    assert cache.host_tier.metrics()["prefetched_tokens"] == loaded
    assert cache.host_tier.metrics()["cached_tokens_host"] == loaded
    host_only = [n for n in nodes(cache) if len(n.key) == loaded]
    assert [state(n) for n in host_only] == ["device+host"]  # became host-only, then loaded
    assert cache.storage.occupied == 0 and not cache.storage.ops
    step(cache)
    assert cache.host_tier.usage().in_use == 0  # no prefetch slot leaked


# ---------------------------------------------------------------------------- keys
def test_page_keys_are_the_sha256_chain_over_uint32_le_ids() -> None:
    """0.5.23 ``get_hash_str``: SHA-256(previous digest, page ids as uint32 LE), per page;
    a partial page gets no key; a namespace seeds the chain (``storage_namespace_seed``)."""
    ids = [5, 70_000, 3, 2**32 - 1, 9]
    prior = None
    want = []
    for page in (ids[0:2], ids[2:4]):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        h.update(np.asarray(page, dtype="<u4").tobytes())
        prior = h.digest()
        want.append(prior)
    assert page_keys(RadixKey(ids), 2) == want
    seed = hashlib.sha256(b"sglang-cache-namespace-v1")
    seed.update(b"\x00" + b"\x01" + (1).to_bytes(8, "little") + b"s")
    assert namespace_seed((None, "s")) == seed.digest()
    salted = page_keys(RadixKey(ids, (None, "s")), 2)
    assert salted[0] == hashlib.sha256(seed.digest() + np.asarray(ids[:2], dtype="<u4").tobytes()).digest()


# ---------------------------------------------------------------------------- writes
def test_l3_is_written_after_the_host_copy_acks_and_pinned_until_its_own_ack() -> None:
    """``_finish_write_through_ack`` -> ``write_backup_storage``: pages reach L3 only at the
    write-through ack; the host copy stays pinned (``host_lock_ref``) until the storage ack
    (the next step); keys already stored are skipped."""
    cache = l3cache(prefetch_policy="best_effort")
    serve(cache, Request("a", PROMPT[:300]), ack=False)
    assert len(cache.storage.store) == 0  # the host copy is still in flight
    step(cache)
    assert len(cache.storage.store) == 300 and cache.host_tier.metrics()["backuped_tokens"] == 300
    assert cache.host_tier.usage().in_use == 300  # pinned for the storage write
    assert cache.evict(5000) == 300  # device eviction may demote it ...
    assert cache.cache.hitree.evict_host(300) == 0  # ... but host eviction may not drop it
    step(cache)
    assert cache.host_tier.usage().in_use == 0
    serve(cache, Request("a2", PROMPT[:400]))
    assert len(cache.storage.store) == 400 and cache.host_tier.metrics()["backuped_tokens"] == 400


def test_write_back_never_writes_l3() -> None:
    """0.5.23 writes L3 only from the write-through ack; write_back's eviction copy is not one."""
    cache = l3cache(write_policy="write_back", prefetch_policy="best_effort")
    serve(cache, Request("a", PROMPT[:300]))
    assert cache.evict(5000) == 300 and cache.stats.stored_tokens == 300
    step(cache, 2)
    assert len(cache.storage.store) == 0


# ---------------------------------------------------------------------------- prefetch rules
def test_threshold_boundary_on_the_hit() -> None:
    """The drain revokes a hit under prefetch_threshold (``hit_tokens < threshold``): 256 is
    fetched, 255 revoked."""
    for held, fetched in ((256, 256), (255, 0)):
        cache = sharing(filled_l3(held), prefetch_policy="wait_complete")
        req = Request("b", list(PROMPT))
        while cache.lookup(req).pending:
            step(cache)
        assert cache.lookup(req).host_tokens == fetched
        assert cache.storage.revoked == (fetched == 0)


def test_a_short_request_is_not_prefetched() -> None:
    """``prefetch_from_storage``: a requested span under the threshold issues nothing (no
    query, no pin, never pending), even when L3 holds all of it."""
    cache = sharing(filled_l3(300), prefetch_policy="wait_complete")
    req = Request("b", PROMPT[:256])  # 255 looked up
    m = cache.lookup(req)
    assert not m.pending and not cache.storage.ops and cache.storage.occupied == 0
    assert req.request_id in cache.storage.done
    assert cache.lookup(Request("c", PROMPT[:257])).pending  # 256 requested: issued


def test_a_prefetch_needs_a_backed_up_anchor() -> None:
    """0.5.23 ``_prefetch_kvcache``: only when the L1+L2 match ends at a backed-up node (or
    the root); selective's device-only node there means a certain L3 miss: no prefetch."""
    writer = filled_l3(600)
    cache = sharing(writer, write_policy="write_through_selective", prefetch_policy="wait_complete")
    serve(cache, Request("a", PROMPT[:100]))  # hit_count 1 < 2: device only
    m = cache.lookup(Request("b", list(PROMPT)))
    assert (m.tokens, m.pending) == (100, False) and not cache.storage.ops


def test_prefetch_starts_after_the_l1_l2_match_and_is_decided_once() -> None:
    """The requested span starts after the device + host match; once a request's prefetch
    is decided (here: revoked) no later lookup issues another, even with L3 grown since."""
    writer = filled_l3(600)
    cache = sharing(writer, prefetch_policy="wait_complete")
    serve(cache, Request("a", PROMPT[:100]))
    req = Request("b", list(PROMPT))
    assert cache.lookup(req).pending
    op = cache.storage.ops["b"]
    assert (op.matched, op.requested, op.hit) == (100, 899, 500)
    cache.cache.storage.threshold = 10**6  # make the drain revoke
    step(cache)
    cache.cache.storage.threshold = DEFAULT_PREFETCH_THRESHOLD
    assert cache.lookup(req).host_tokens == 0 and not cache.storage.ops
    assert cache.storage.revoked == 1


def test_timeout_stops_after_the_0523_budget_of_steps() -> None:
    """timeout: 1 s + 0.25 s per 1024 requested tokens after the first blocked admission poll
    (999 requested: 1.2439 s), at step_time_s 0.1 -> stopped at the poll 13 steps after the
    first; what arrived by then (8 pages per step after the drain) is loaded."""
    cache = sharing(filled_l3(999), prefetch_policy="timeout", storage_pages_per_step=8, step_time_s=0.1)
    assert HiCacheStorage.timeout_s(999) == pytest.approx(1 + 999 / 1024 * 0.25)
    req = Request("b", list(PROMPT))
    for _ in range(13):
        assert cache.lookup(req).pending  # 0 .. 12 steps after the first poll: 1.2 s <= 1.24 s
        step(cache)
    m = cache.lookup(req)
    assert not m.pending and m.host_tokens == 12 * 8  # 13 steps: one drain, 12 arrivals
    assert cache.storage.prefetched_tokens == 96


def test_the_prefetch_cap_is_half_the_host_pool() -> None:
    """``prefetch_rate_limited``: once the tokens requested by prefetches in flight reach
    0.5 x host, a new prefetch is refused (and issued at a later lookup, once room frees)."""
    writer = filled_l3(999)
    cache = sharing(writer, capacity=2000, capacity_tokens=1997, prefetch_policy="wait_complete")
    assert cache.storage.capacity_limit == 999  # int(0.5 x 1998 host slots)
    first, second = Request("b1", list(PROMPT)), Request("b2", PROMPT + [1, 2])
    assert cache.lookup(first).pending and cache.storage.occupied == 999
    assert cache.lookup(second).pending is False and "b2" not in cache.storage.done
    cache.storage.occupied -= 1  # 998 < 999: the next lookup issues it
    assert cache.lookup(second).pending
    cache.storage.occupied += 1


def test_prefetched_pages_take_host_slots_and_evict_host_copies() -> None:
    """The drain takes host slots for the hit (``allocate_storage_hit`` with host eviction,
    partial down to the threshold): a full host gives up its unpinned host-only copies; the
    slots are in use until the pages are in the tree."""
    writer = filled_l3(999)
    cache = sharing(writer, capacity=1200, capacity_tokens=600, prefetch_policy="wait_complete")
    serve(cache, Request("x", tokens(200, 3)))  # 199 requested: no prefetch of its own
    cache.evict(5000)  # x is host-only: 200 of 601 host slots
    req = Request("b", list(PROMPT))
    assert cache.lookup(req).pending
    step(cache)  # drain: 999 wanted, 401 free -> x's copy goes -> 601 taken
    assert cache.stats.host_evicted_tokens == 200
    assert cache.host_tier.usage() == (0, 0, 601)
    while cache.lookup(req).pending:
        step(cache)
    m = cache.lookup(req)
    assert m.host_tokens == 601 and cache.host_tier.usage().in_use == 0


def test_a_finished_prefetch_keeps_only_pages_the_tree_lacks() -> None:
    """``insert_host``: pages the tree gained meanwhile (another request computed them)
    stay the tree's; the fetched copies of them go back to the host pool."""
    writer = filled_l3(600)
    cache = sharing(writer, prefetch_policy="best_effort")
    req = Request("b", list(PROMPT))
    cache.host_tier.enqueue(req)
    step(cache, 3)  # drain + 256 arrived
    serve(cache, Request("a", PROMPT[:100]), ack=False)  # the tree holds 100 of them now
    m = cache.lookup(req)
    assert (m.tokens, m.host_tokens) == (100, 156)
    host_only = [n for n in nodes(cache) if state(n) == "host"]
    assert [len(n.key) for n in host_only] == [156]
    step(cache, 2)  # a's host copy acks, then its storage write
    assert cache.host_tier.usage().in_use == 0
    assert cache.host_tier.usage().evictable == 100 + 156  # a's copy + the fetched tail


def test_no_prefetch_for_a_live_request_and_reset_drops_everything() -> None:
    writer = filled_l3(600)
    cache = sharing(writer, prefetch_policy="wait_complete")
    req = Request("b", list(PROMPT))
    assert cache.lookup(req).pending
    step(cache)
    assert cache.host_tier.usage().in_use == 600  # the prefetch buffer
    assert cache.reset()
    assert cache.host_tier.usage() == (cache.host_tier.num_pages(), 0, 0) and not cache.storage.ops


def test_defaults_and_bad_values() -> None:
    cache = l3cache()
    s = cache.storage
    assert (s.policy, s.threshold, s.pages_per_step) == ("timeout", 256, 128)
    assert DEFAULT_PREFETCH_POLICY == "timeout" and DEFAULT_STORAGE_PAGES_PER_STEP == 128
    assert l3cache(page_size=512, capacity=4096).storage.threshold == 512  # max(threshold, page)
    plain = make_cache("radix", CacheConfig(64, 1), host_tier=HostTierConfig())
    assert plain.storage is None and "prefetched_tokens" not in plain.host_tier.metrics()
    with pytest.raises(ValueError, match="set storage=True"):
        HostTierConfig(prefetch_policy="timeout")
    with pytest.raises(ValueError, match="unknown prefetch_policy"):
        HostTierConfig(storage=True, prefetch_policy="eventually")
    with pytest.raises(ValueError, match="prefetch_threshold"):
        HostTierConfig(storage=True, prefetch_threshold=-1)
    with pytest.raises(ValueError, match="storage_pages_per_step"):
        HostTierConfig(storage=True, storage_pages_per_step=0)
    with pytest.raises(ValueError, match="step_time_s"):
        HostTierConfig(storage=True, step_time_s=0)
    with pytest.raises(ValueError, match="storage must be a bool"):
        HostTierConfig(storage=1)  # type: ignore[arg-type]


def test_engine_runs_with_l3_and_the_default_timeout_policy() -> None:
    """Through the engine: a second instance sharing L3 serves a returning prefix from L3
    (the default timeout policy holds it pending until its pages arrived, then loads). The
    pages arrive 64 a step: the engine waits on the tier (transfers_in_flight) through those
    steps, each a scheduler pass of step_overhead_s, instead of giving up as stuck."""
    from prefixcache.engine import Engine

    writer = filled_l3(999)
    tier = HostTierConfig(storage=True, storage_pages_per_step=64)
    cache = make_cache("radix", CacheConfig(2000, 1), host_tier=tier)
    cache.storage.store = writer.storage.store
    engine = Engine(cache, "fcfs", token_budget=4096, check_invariants=True)
    engine.add_request(Request("r", PROMPT + [1], max_new_tokens=2, arrival_time=0.0))
    engine.run()
    assert engine.num_finished == 1
    rec = engine.records["r"]
    waited = -(-999 // 64)  # batches of pages, one a step, before the admission
    assert rec.admission_time == pytest.approx(waited * engine.cost_model.step_overhead_s)
    assert cache.stats.host_hits == 999 and cache.host_tier.metrics()["prefetched_tokens"] == 999
    cache.host_tier.advance_transfers()  # the finished request's new leaf: its host copy acks,
    cache.host_tier.advance_transfers()  # then its storage write
    assert cache.host_tier.usage().in_use == 0


# ---------------------------------------------------------------------------- lifecycle
# The shadow-KV machine of test_stateful_hicache.py with L3 on: the store's pages carry KV
# too (a write copies the host slots' KV under its key; a prefetch copies it into host
# slots), so a hit served from L3 must hand back that prefix's KV; tight host pools push
# backed-up prefixes out of L2, so they come back from L3. After every step the machine's
# invariants hold: check_invariants (device and host pages add up, prefetch buffers
# included), every live request reads its own KV, every tree copy holds its prefix's KV.

from hypothesis.stateful import multiple, precondition, rule  # noqa: E402

from tests.stateful_rules import machine_tests, suffixes  # noqa: E402
from tests.test_stateful_hicache import HiCacheLifecycle  # noqa: E402

PREFETCHED: dict[str, int] = {}  # the most tokens one run prefetched from L3, per machine
L3_ADMISSIONS: dict[str, int] = {}  # admissions that loaded pages prefetched from L3
PENDING: dict[str, int] = {}  # admissions held back by a prefetch in flight
# Machines that ran in this process: under pytest-xdist each test file's machines may run in
# another worker than the check below, which then asks only those it saw.
RAN: set[str] = set()


class StorageLifecycle(HiCacheLifecycle):
    host_tokens: int | None = None  # ratio 2.0: room for backups, so L3 gets written
    policy = "wait_complete"
    step_time_s: float | None = None

    def host_tier(self) -> HostTierConfig:
        return HostTierConfig(
            write_policy=self.write_policy,
            capacity_tokens=self.host_tokens,
            load_back_threshold=2,
            storage=True,
            prefetch_policy=self.policy,
            prefetch_threshold=2,
            storage_pages_per_step=2,
            step_time_s=self.step_time_s,
        )

    def start(self) -> None:
        self.l3: dict[bytes, tuple] = {}
        super().start()

    def _watch(self) -> None:
        super()._watch()
        storage = self.cache.storage
        if not len(storage.store):
            self.l3 = {}  # a fresh store (setup, reset)

        def moved(kind: str, host: object, keys: list[bytes]) -> None:
            slots = host.tolist()  # type: ignore[attr-defined]
            assert len(keys) == 1 and len(slots) == self.page_size
            if kind == "write":
                assert all(h in self.host for h in slots), "L3 write of host slots without KV"
                self.l3[keys[0]] = tuple(self.host[h] for h in slots)
            else:
                assert keys[0] in self.l3, "prefetch of a page L3 never got"
                for h, kv in zip(slots, self.l3[keys[0]], strict=True):
                    self.host[h] = kv

        storage.on_transfer = moved

    def _admit(self, req: Request, match, chunk: int, what: str):  # type: ignore[no-untyped-def]
        name = type(self).__name__
        RAN.add(name)
        current = self.cache.revalidate(match)
        if current.pending:
            PENDING[name] = PENDING.get(name, 0) + 1
            return multiple(req)
        out = super()._admit(req, current, chunk, "L3 " + what)
        if self.cache.host_tier.loaded_tokens(req) and self.cache.storage.fetched.get(req.request_id):
            L3_ADMISSIONS[name] = L3_ADMISSIONS.get(name, 0) + 1  # its KV was checked in _admit
        PREFETCHED[name] = max(PREFETCHED.get(name, 0), self.cache.storage.prefetched_tokens)
        return out

    @rule()
    def host_pressure(self) -> None:
        """Two scheduler steps (host copies ack, then their L3 writes), then device and host
        pressure: every unpinned copy leaves both tiers; L3 keeps its pages."""
        self.cache.host_tier.advance_transfers()
        self.ack_and_evict_everything()
        self.cache.hitree.evict_host(10**6)

    @precondition(lambda self: self.corpus)
    @rule(target=HiCacheLifecycle.waiting, suffix=suffixes(3))
    def come_back_cold(self, suffix: list[int]):  # type: ignore[no-untyped-def]
        """The running requests finish, both tiers are emptied, an earlier conversation
        returns: an L1 + L2 miss, served from L3 if its pages were written there."""
        self._finish_all()
        self.host_pressure()
        req = self._returning(suffix)
        self.cache.host_tier.enqueue(req)  # queued first, as a loaded scheduler would; admitted later
        for _ in range(self.rng.randrange(5)):
            self.scheduler_step()
        match = self.cache.lookup(req)
        for _ in range(20):  # the scheduler polls it every step until its prefetch is done
            if not match.pending:
                break
            self.scheduler_step()
            match = self.cache.lookup(req)
        return self._admit(req, match, self.max_chunk, "cold come back")

    @rule()
    def scheduler_step(self) -> None:
        self.cache.host_tier.advance_transfers()
        s = self.cache.storage
        pinned = {n.id: n for n in s.busy_nodes() if n.host_value is not None}
        held = sum(len(n.host_value) for n in pinned.values()) // self.page_size + len(s.buffer_pages())
        assert self.cache.host_tier.usage().in_use == held, "a copy outlived its ack"


class WaitCompletePage4(StorageLifecycle):
    page_size = 4
    capacity_tokens = 64


class BestEffort(StorageLifecycle):
    policy = "best_effort"


class TimeoutTightHost(StorageLifecycle):
    policy = "timeout"
    host_tokens = 24
    step_time_s = 0.5  # 1 s + a little: stopped 3 steps after the first blocked poll


STORAGE_MACHINES = (StorageLifecycle, WaitCompletePage4, BestEffort, TimeoutTightHost)
TestStorageWaitComplete, TestStorageWaitCompletePage4, TestStorageBestEffort, TestStorageTimeoutTightHost = (
    machine_tests(*STORAGE_MACHINES, runs=25, steps=50, thorough_runs=300)
)


def test_the_storage_machines_prefetched_from_l3() -> None:
    """Not vacuous: every machine fetched pages from L3 and admitted requests with them."""
    if not RAN:
        pytest.skip("run with the machines above")
    print(f"L3 prefetched: {PREFETCHED}; admissions after one: {L3_ADMISSIONS}; pending: {PENDING}")
    for name in sorted(RAN):
        assert PREFETCHED.get(name, 0) > 0, f"{name} never prefetched from L3"
        assert L3_ADMISSIONS.get(name, 0) > 0, f"{name} never admitted with a prefetched page"
