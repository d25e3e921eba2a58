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
import warnings
from collections import Counter, defaultdict

import pytest
from hypothesis.stateful import precondition, rule

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.stateful_lifecycle import HostTierLifecycle, Lifecycle, ShadowKV
from tests.stateful_rules import SALTED, evict_rule, machine_tests, new_request_rule, step_rule, suffixes

# per machine: steps, admissions that loaded from host, steps after a host eviction
SEEN: defaultdict[str, Counter[str]] = defaultdict(Counter)


class HiCacheLifecycle(HostTierLifecycle):
    page_size = 1
    capacity_tokens = 40
    write_policy = "write_through"
    host_tokens: int | None = None  # None: ratio 2.0
    SEEN = SEEN

    def host_tier(self) -> HostTierConfig:
        return HostTierConfig(
            write_policy=self.write_policy, capacity_tokens=self.host_tokens, load_back_threshold=2
        )

    def start(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tight host pools are smaller than the device pool
            self.cache = make_cache(
                "radix",
                CacheConfig(self.capacity_tokens, self.page_size),
                host_tier=self.host_tier(),
                clock=itertools.count().__next__,
            )
        self.shadows = [ShadowKV(self.page_size)]  # device slot -> KV content
        self.host: dict[int, tuple] = {}  # host slot -> KV content
        self._watch()

    def _watch(self) -> None:
        device = self.shadows[0].slots

        def moved(kind: str, on_device: object, host: object) -> None:
            for d, h in zip(on_device.tolist(), host.tolist(), strict=True):  # type: ignore[attr-defined]
                if kind == "store":
                    assert d in device, f"store of device slot {d}, which holds no KV"
                    self.host[h] = device[d]
                else:
                    assert h in self.host, f"load of host slot {h}, which holds no KV"
                    device[d] = self.host[h]

        self.cache.tree.on_transfer = moved

    new_request = new_request_rule(share=16, suffix=10, namespaces=[(None, None), *SALTED])
    step = step_rule(chunk=12, decode=6)
    evict = evict_rule(32)
    reset = rule()(Lifecycle.reset)

    @precondition(lambda self: self.corpus)
    @rule(target=Lifecycle.waiting, suffix=suffixes(3))
    def follow_up(self, suffix: list[int]) -> Request:
        """A next turn: a whole earlier sequence and a little more (multi-turn chat)."""
        self.counter += 1
        tokens = self.rng.choice(self.corpus)[0] + tuple(suffix)
        self.corpus.append((tokens, (None, None)))
        return Request(f"r{self.counter}", tokens)

    @rule()
    def scheduler_step(self) -> None:
        self.cache.host_tier.advance_transfers()
        assert self.cache.host_tier.usage().in_use == 0, "a copy outlived its ack"

    @rule()
    def ack_and_evict_everything(self) -> None:
        """Device pressure after a scheduler step: every unpinned node leaves the device
        (backed-up ones stay as host copies), so later hits come from the host."""
        self.cache.host_tier.advance_transfers()
        self._evict(10**6)

    def _finish_all(self) -> None:
        for rid in sorted(self.live_reqs):
            self.release_request(self.live_reqs[rid], preempt=False)

    def _returning(self, suffix: list[int]) -> Request:
        """An earlier conversation's next turn."""
        self.counter += 1
        return Request(f"r{self.counter}", self.rng.choice(self.corpus)[0] + tuple(suffix))

    @precondition(lambda self: self.corpus)
    @rule(target=Lifecycle.waiting, suffix=suffixes(3))
    def come_back(self, suffix: list[int]):  # type: ignore[no-untyped-def]
        """The running requests finish, device pressure takes every unpinned node, then an
        earlier conversation returns: a hit from host if its prefix was backed up (and still
        is), loaded at once."""
        self._finish_all()
        self.ack_and_evict_everything()
        req = self._returning(suffix)
        return self._admit(req, self.cache.lookup(req), self.max_chunk, "come back")

    def after_reset(self) -> None:
        assert self.cache.host_tier.usage() == (self.cache.host_tier.num_pages(), 0, 0)
        self._watch()  # a fresh tree

    def check_more(self) -> None:
        """Every host copy in the tree holds exactly the KV of its node's prefix, every device
        copy too."""
        if self.cache.stats.host_evicted_tokens:
            self.count("host evictions")
        device = self.shadows[0].slots
        for node in self.cache.tree.iter_nodes():
            path, up = [], node
            while up.parent is not None:
                path.append(up.key.token_ids.tolist())
                up = up.parent
            tokens = [t for part in reversed(path) for t in part]
            start = len(tokens) - len(node.key)
            ns = node.key.extra_key or (None, None)
            for i in range(len(node.key)):
                want = (ns, tuple(tokens[: start + i + 1]))
                if node.host_value is not None:
                    got = self.host.get(int(node.host_value[i]))
                    assert got == want, f"host copy of {node} at {i} holds {got}"
                if node.value is not None:
                    got = device.get(int(node.value[i]))
                    assert got == want, f"device copy of {node} at {i} holds {got}"


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


(
    TestWriteThroughPage1,
    TestWriteThroughPage4,
    TestSelectiveTightHost,
    TestWriteBackTightHost,
    TestWriteBackPage4,
    TestWriteThroughTightHost,
) = machine_tests(
    HiCacheLifecycle,
    WriteThroughPage4,
    SelectiveTightHost,
    WriteBackTightHost,
    WriteBackPage4,
    WriteThroughTightHost,
    runs=30,
    steps=50,
    thorough_runs=300,
)


def test_the_machines_loaded_from_host_and_evicted_host() -> None:
    """Not vacuous: hits came from the host tier, and tight host pools evicted host copies."""
    if not SEEN:
        pytest.skip("run with the machines above")
    print(f"hicache stateful: {dict(SEEN)}")
    for name in SEEN:
        assert SEEN[name]["host hits"] > 0, f"{name} never admitted a request with a host hit"
    for name in ("WriteBackTightHost", "WriteThroughTightHost"):
        if name in SEEN:
            assert SEEN[name]["host evictions"] > 0, f"{name} never evicted a host copy"
