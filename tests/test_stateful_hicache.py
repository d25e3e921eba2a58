"""The radix backend with its HiCache host tier (SGLang 0.5.23 rules), hunted through the common
interface with a shadow KV model of both tiers: what KV each device slot and each host slot
holds. The model computes KV into device slots; the tier's copies (``on_transfer``: a store
D -> H, a load H -> D) move that model KV as the real copies would.

Requests interleave lookup / allocate (stale matches and failures included) / prefill chunks /
decode / release / preemption / device eviction / scheduler steps (acks) / reset, under every
write policy, page size 1 and 4, host pools roomy and tight. After every step:

* ``check_invariants()`` holds: device and host free + evictable + in use == total;
* every live request reads its own KV at every computed position, a hit loaded from the host
  included (checked right after its allocate, before it computes anything);
* every host copy in the tree holds exactly the KV of its node's prefix, every device copy too.

Default profile: about 1,300 steps per machine (some 10 s in all). ``HYPOTHESIS_PROFILE=thorough``:
6 machines x 300 runs of up to 100 steps; one run gave 149,630 steps (4,499 admissions with a
host hit) in 8 min 15 s on 2 shared cores.
"""

from __future__ import annotations

import itertools
import os
import random
import warnings

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule
from prefixcache.backends.radix.backend import extra_key

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.stateful_admission import AdmissionRules

VOCAB = 3
STEPS: dict[str, int] = {}
HOST_HITS: dict[str, int] = {}  # admissions that loaded from host, per machine
HOST_EVICTIONS: dict[str, int] = {}


def _settings() -> settings:
    if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
        return settings(max_examples=300, stateful_step_count=100)
    return settings(max_examples=30, stateful_step_count=50, derandomize=True)


class HiCacheLifecycle(AdmissionRules):
    page_size = 1
    capacity_tokens = 40
    write_policy = "write_through"
    host_tokens: int | None = None  # None: ratio 2.0
    waiting = Bundle("waiting")
    matched = Bundle("matched")

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        tier = HostTierConfig(
            write_policy=self.write_policy, capacity_tokens=self.host_tokens, load_back_threshold=2
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tight host pools are smaller than the device pool
            self.cache = make_cache(
                "radix",
                CacheConfig(self.capacity_tokens, self.page_size),
                host_tier=tier,
                clock=itertools.count().__next__,
            )
        self.device: dict[int, tuple] = {}  # device slot -> KV content
        self.host: dict[int, tuple] = {}  # host slot -> KV content
        self._watch()
        self.live_reqs: dict[str, Request] = {}
        self.corpus: list[tuple[int, ...]] = []
        self.counter = 0

    def _watch(self) -> None:
        def moved(kind: str, device: object, host: object) -> None:
            for d, h in zip(device.tolist(), host.tolist(), strict=True):  # type: ignore[attr-defined]
                if kind == "store":
                    assert d in self.device, f"store of device slot {d}, which holds no KV"
                    self.host[h] = self.device[d]
                else:
                    assert h in self.host, f"load of host slot {h}, which holds no KV"
                    self.device[d] = self.host[h]

        self.cache.tree.on_transfer = moved

    @staticmethod
    def content(req: Request, pos: int) -> tuple:
        return (extra_key(req), tuple(req.all_token_ids[: pos + 1]))

    def slot(self, req: Request, pos: int) -> int:
        table = self.cache.page_table(req)
        return table[pos // self.page_size] * self.page_size + pos % self.page_size

    def check_reads(self, req: Request, stop: int, what: str) -> None:
        for pos in range(stop):
            got = self.device.get(self.slot(req, pos))
            assert got == self.content(req, pos), f"{what}: {req.request_id} position {pos} reads {got}"

    def _compute(self, req: Request, n: int) -> None:
        self.check_reads(req, req.num_computed_tokens, "about to compute")
        for pos in range(req.num_computed_tokens, req.num_computed_tokens + n):
            self.device[self.slot(req, pos)] = self.content(req, pos)
        req.num_computed_tokens += n
        self.cache.commit(req)

    def _snapshot(self) -> tuple:
        c = self.cache
        tables = {r.request_id: (tuple(c.page_table(r)), r.num_computed_tokens) for r in c.live_requests}
        return c.usage(), c.host_usage(), tables

    @rule(
        target=waiting,
        share=st.integers(0, 16),
        suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
        salt=st.sampled_from([None, None, "s"]),
    )
    def new_request(self, share: int, suffix: list[int], salt: str | None) -> Request:
        base = self.rng.choice(self.corpus) if self.corpus else ()
        tokens = base[:share] + tuple(suffix)
        self.corpus.append(tokens)
        self.counter += 1
        return Request(f"r{self.counter}", tokens, cache_salt=salt)

    @precondition(lambda self: self.corpus)
    @rule(target=waiting, suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3))
    def follow_up(self, suffix: list[int]) -> Request:
        """A next turn: a whole earlier sequence and a little more (multi-turn chat)."""
        self.counter += 1
        tokens = self.rng.choice(self.corpus) + tuple(suffix)
        self.corpus.append(tokens)
        return Request(f"r{self.counter}", tokens)

    def _admit(self, req: Request, match, chunk: int, what: str):  # type: ignore[no-untyped-def]
        current = self.cache.revalidate(match)
        hit = current.tokens + current.host_tokens
        n = min(chunk, req.num_tokens - hit)
        if -(-(hit + n) // self.page_size) > self.cache.num_usable_pages():
            return multiple()
        before = self._snapshot()
        if not self.cache.allocate(req, n, current):
            assert self._snapshot() == before, "a failed allocate changed the cache"
            return multiple(req)
        assert req.num_computed_tokens == hit and self.cache.loaded_tokens(req) == current.host_tokens
        if current.host_tokens:
            HOST_HITS[type(self).__name__] = HOST_HITS.get(type(self).__name__, 0) + 1
        self.check_reads(req, hit, what)  # a hit from host hands back that prefix's KV
        self._compute(req, n)
        self.live_reqs[req.request_id] = req
        return multiple()

    @precondition(lambda self: self.live_reqs)
    @rule(data=st.data(), chunk=st.integers(1, 12), decode=st.integers(1, 6))
    def step(self, data: st.DataObject, chunk: int, decode: int) -> None:
        req = self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs)))]
        steps = 1 if req.num_computed_tokens < req.num_tokens else decode
        for _ in range(steps):
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids(self.rng.randrange(VOCAB))
                chunk = 1
            n = min(chunk, req.num_tokens - req.num_computed_tokens)
            if -(-(req.num_computed_tokens + n) // self.page_size) > self.cache.num_usable_pages():
                return
            before = self._snapshot()
            if not self.cache.allocate(req, n):
                assert self._snapshot() == before, "a failed extend changed the cache"
                return
            self._compute(req, n)

    @precondition(lambda self: self.live_reqs)
    @rule(target=waiting, data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool):  # type: ignore[no-untyped-def]
        req = self.live_reqs.pop(data.draw(st.sampled_from(sorted(self.live_reqs))))
        self.cache.release(req)
        self.corpus.append(tuple(req.all_token_ids))
        if not preempt:
            return multiple()
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        return multiple(req)

    @rule()
    def scheduler_step(self) -> None:
        self.cache.advance_transfers()
        assert self.cache.host_usage().in_use == 0, "a copy outlived its ack"

    @rule(num_tokens=st.integers(0, 32))
    def evict(self, num_tokens: int) -> None:
        in_use = self.cache.usage().in_use
        assert self.cache.evict(num_tokens) >= 0
        assert self.cache.usage().in_use == in_use, "evict touched pinned pages"

    @rule()
    def ack_and_evict_everything(self) -> None:
        """Device pressure after a scheduler step: every unpinned node leaves the device
        (backed-up ones stay as host copies), so later hits come from the host."""
        self.cache.advance_transfers()
        self.evict(10**6)

    @precondition(lambda self: self.corpus)
    @rule(target=waiting, suffix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3))
    def come_back(self, suffix: list[int]):  # type: ignore[no-untyped-def]
        """The running requests finish, device pressure takes every unpinned node, then an
        earlier conversation returns: a hit from host if its prefix was backed up (and still
        is), loaded at once."""
        for rid in sorted(self.live_reqs):
            req = self.live_reqs.pop(rid)
            self.cache.release(req)
            self.corpus.append(tuple(req.all_token_ids))
        self.ack_and_evict_everything()
        self.counter += 1
        req = Request(f"r{self.counter}", self.rng.choice(self.corpus) + tuple(suffix))
        return self._admit(req, self.cache.lookup(req), self.max_chunk, "come back")

    @rule()
    def reset(self) -> None:
        before = self._snapshot()
        if self.cache.reset():
            assert not self.live_reqs and self.cache.usage().evictable == 0
            assert self.cache.host_usage() == (self.cache.num_host_pages(), 0, 0)
            self._watch()  # a fresh tree
        else:
            assert self.live_reqs and self._snapshot() == before

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        name = type(self).__name__
        STEPS[name] = STEPS.get(name, 0) + 1
        if self.cache.stats.host_evicted_tokens:
            HOST_EVICTIONS[name] = HOST_EVICTIONS.get(name, 0) + 1
        self.cache.check_invariants()
        for req in self.live_reqs.values():
            self.check_reads(req, req.num_computed_tokens, "live request")
        p = self.page_size
        for node in self.cache.tree.iter_nodes():
            path, up = [], node
            while up.parent is not None:
                path.append(up.key.token_ids.tolist())
                up = up.parent
            tokens = [t for part in reversed(path) for t in part]
            start = len(tokens) - len(node.key)
            ns = node.key.extra_key
            for i in range(len(node.key)):
                want = (ns, tuple(tokens[: start + i + 1]))
                if node.host_value is not None:
                    got = self.host.get(int(node.host_value[i]))
                    assert got == want, f"host copy of {node} at {i} holds {got}"
                if node.value is not None:
                    got = self.device.get(int(node.value[i]))
                    assert got == want, f"device copy of {node} at {i} holds {got}"
        assert p >= 1


class WriteThroughPage4(HiCacheLifecycle):
    page_size = 4
    capacity_tokens = 64


class SelectiveTightHost(HiCacheLifecycle):
    write_policy = "write_through_selective"
    host_tokens = 24


class WriteBackTightHost(HiCacheLifecycle):
    write_policy = "write_back"
    host_tokens = 16


class WriteBackPage4(HiCacheLifecycle):
    write_policy = "write_back"
    page_size = 4
    capacity_tokens = 64
    host_tokens = 60


class WriteThroughTightHost(HiCacheLifecycle):
    host_tokens = 20


TestWriteThroughPage1 = HiCacheLifecycle.TestCase
TestWriteThroughPage4 = WriteThroughPage4.TestCase
TestSelectiveTightHost = SelectiveTightHost.TestCase
TestWriteBackTightHost = WriteBackTightHost.TestCase
TestWriteBackPage4 = WriteBackPage4.TestCase
TestWriteThroughTightHost = WriteThroughTightHost.TestCase
for _case in (
    TestWriteThroughPage1,
    TestWriteThroughPage4,
    TestSelectiveTightHost,
    TestWriteBackTightHost,
    TestWriteBackPage4,
    TestWriteThroughTightHost,
):
    _case.settings = _settings()
del _case


def test_the_machines_loaded_from_host_and_evicted_host() -> None:
    """Not vacuous: hits came from the host tier, and tight host pools evicted host copies."""
    if not STEPS:
        pytest.skip("run with the machines above")
    print(f"hicache stateful steps: {STEPS} (total {sum(STEPS.values())}); host hits: {HOST_HITS}")
    for name in STEPS:
        assert HOST_HITS.get(name, 0) > 0, f"{name} never admitted a request with a host hit"
    for name in ("WriteBackTightHost", "WriteThroughTightHost"):
        if name in STEPS:
            assert HOST_EVICTIONS.get(name, 0) > 0, f"{name} never evicted a host copy"
