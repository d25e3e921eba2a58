"""Both backends emit vLLM's KV events (``kv_events=True``), where their upstream emits them.

- hashchain follows vLLM 0.33.0's BlockPool: the event stream of every scenario recorded from
  vLLM's own KVCacheManager with ``enable_kv_cache_events`` (experiments/upstream/
  vllm_kv_events_driver.py --streams; dense, full + sliding-window and Mamba layouts) is
  reproduced op by op, field by field and byte for byte (msgpack of the batch).
- radix follows SGLang 0.5.23's RadixCache + KVCacheEventRecorder: the stream recorded from the
  real SGLang (experiments/upstream/sglang_kv_events_driver.py) is reproduced op by op at page
  sizes 1 and 4 (SGLang's own ``cache_salt`` field, absent from vLLM's schema, is not compared).
- Done-when (issue 17): over random request sequences, the events replayed after every step
  give exactly what the cache holds (zero lag, no loss); dropped batches leave sequence gaps
  that ``kv_events.SequenceGaps`` and ``BlockIndex`` report.
- A cluster of hashchain and radix replicas with Dynamo's router on KV events ends with the
  router's index equal to the replicas' caches.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

kv_events = pytest.importorskip("prefixcache.kv_events", reason="needs msgspec (the events extra)")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from prefixcache.backends.hashchain.backend import HashChainCache  # noqa: E402
from prefixcache.experiments.upstream.kv_event_cases import event_json  # noqa: E402

from prefixcache import CacheConfig, PrefixCache, Request, make_cache  # noqa: E402
from prefixcache.cluster.routers.event_index import BlockIndex  # noqa: E402
from prefixcache.tiers import HostTierConfig  # noqa: E402

EVENTS = Path(__file__).parent / "fixtures" / "upstream" / "events"
VLLM_STREAMS = sorted((EVENTS / "vllm_streams").glob("vllm_events_*.json"))
SGLANG_STREAMS = sorted((EVENTS / "sglang_streams").glob("sglang_events_*.json"))


# ------------------------------------------------------------------ replaying a scenario
def make_hashchain(scenario: dict[str, Any]) -> HashChainCache:
    if "layout" in scenario:
        config = CacheConfig(
            scenario["capacity_tokens"], scenario["block_size"], layout=[tuple(x) for x in scenario["layout"]]
        )
        cache = make_cache(
            "hashchain",
            config,
            kv_events=True,
            free_skipped_on_failure=True,
            prefix_cache_retention_interval=scenario["retention"],
        )
    else:
        cache = make_cache(
            "hashchain", CacheConfig(scenario["capacity_tokens"], scenario["page_size"]), kv_events=True
        )
    assert isinstance(cache, HashChainCache)
    return cache


def replay(cache: PrefixCache[Any], scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorders' ops through the PrefixCache contract; per op the events it drained."""
    reqs: dict[str, Request] = {}
    records: list[dict[str, Any]] = []
    for op in scenario["ops"]:
        kind, rid = op["op"], op.get("rid")
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[rid] = Request(rid, op["prompt"], cache_salt=op.get("salt"))
        elif kind == "lookup":
            cache.lookup(reqs[rid])
        elif kind == "alloc":
            req = reqs[rid]
            if not cache.is_live(req):
                m = cache.lookup(req)
                left = req.num_tokens - m.tokens
                ok = cache.allocate(req, left if op.get("n") is None else min(op["n"], left), m)
                rec["hit"] = req.num_computed_tokens if ok else None
            else:
                left = req.num_tokens - req.num_computed_tokens
                n = left if op.get("n") is None else min(op["n"], left)
                ok = n > 0 and cache.allocate(req, n)
            rec["ok"] = ok
        elif kind == "run":
            req = reqs[rid]
            if cache.is_live(req):
                req.num_computed_tokens = cache.reserved_tokens(req)
                cache.commit(req)
        elif kind == "append":
            reqs[rid].append_output_token_ids(op["tokens"])
        elif kind == "release":
            if cache.is_live(reqs[rid]):
                cache.release(reqs[rid])
        elif kind == "evict":
            cache.evict(op["n"])
        elif kind == "reset":
            rec["ok"] = cache.reset()
        else:
            raise ValueError(f"no op {kind!r}")
        rec["events"] = cache.kv_events.take_events()
        records.append(rec)
    return records


def first_difference(
    ours: list[dict[str, Any]],
    upstream: list[dict[str, Any]],
    fields: tuple[str, ...],
    drop: tuple[str, ...] = (),
) -> str | None:
    for i, (a, b) in enumerate(zip(ours, upstream, strict=True)):
        for f in fields:
            if f in b and a.get(f) != b[f]:
                return f"op {i}: {f} ours={a.get(f)} upstream={b[f]}"
        mine = [event_json(e) for e in a["events"]]
        theirs = [{k: v for k, v in e.items() if k not in drop} for e in b["events"]]
        if mine != theirs:
            return f"op {i}: events\n ours     {mine}\n upstream {theirs}"
    return None


# ------------------------------------------------------------------ hashchain = vLLM 0.33
@pytest.mark.parametrize("path", VLLM_STREAMS, ids=[p.stem for p in VLLM_STREAMS])
def test_hashchain_emits_vllms_event_stream(path: Path, vllm_hash_seed: None) -> None:
    """Follows vLLM 0.33.0 BlockPool: BlockStored at cache_full_blocks (parent = the hash before
    the range, even unhashed; an empty one for an all-masked window range), one BlockRemoved per
    hash at lazy eviction, AllBlocksCleared at a successful reset; int hashes (vLLM's default)."""
    fixture = json.loads(path.read_text())
    assert fixture["pythonhashseed"] == "0"
    ours = replay(make_hashchain(fixture["scenario"]), fixture["scenario"])
    diff = first_difference(ours, fixture["records"], ("ok", "hit"))
    assert diff is None, diff
    for i, (a, b) in enumerate(zip(ours, fixture["records"], strict=True)):
        payload = kv_events.encode(kv_events.KVEventBatch(ts=0.0, events=a["events"]))
        assert payload.hex() == b["payload"], f"op {i}: msgpack bytes differ"


def test_the_fixtures_cover_every_event_kind_and_a_hybrid_layout() -> None:
    kinds: Counter[str] = Counter()
    spec_kinds: set[str] = set()
    for path in VLLM_STREAMS:
        for rec in json.loads(path.read_text())["records"]:
            for e in rec["events"]:
                kinds[e["type"]] += 1
                spec_kinds.add(e.get("kv_cache_spec_kind", ""))
    assert kinds["BlockStored"] and kinds["BlockRemoved"] and kinds["AllBlocksCleared"]
    assert {"full_attention", "sliding_window"} <= spec_kinds


def test_events_are_off_by_default_and_the_option_is_checked() -> None:
    cache = make_cache("hashchain", CacheConfig(64, 4))
    req = Request("a", list(range(9)))
    cache.allocate(req, 9, cache.lookup(req))
    assert cache.kv_events is None and cache.manager.take_events() == []
    with pytest.raises(ValueError, match="kv_events"):
        make_cache("hashchain", CacheConfig(64, 4), kv_events=1)


# ------------------------------------------------------------------ radix = SGLang 0.5.23
@pytest.mark.parametrize("path", SGLANG_STREAMS, ids=[p.stem for p in SGLANG_STREAMS])
def test_radix_emits_sglangs_event_stream(path: Path) -> None:
    """Follows SGLang 0.5.23 RadixCache + KVCacheEventRecorder: AllBlocksCleared at every reset
    (construction included), BlockStored for each new leaf's pages (chained SHA-256 page
    hashes as int64, parent = the parent node's last page; none for a split), BlockRemoved
    per evicted leaf, merged as its enqueue merges them. Its ``cache_salt`` field is not in
    vLLM's schema, so not compared (the salt does enter the hashes, which are)."""
    fixture = json.loads(path.read_text())
    scenario = fixture["scenario"]
    cache = make_cache(
        "radix", CacheConfig(scenario["capacity_tokens"], scenario["page_size"]), kv_events=True
    )
    first = cache.kv_events.take_events()  # the construction's reset, which SGLang's first drain holds too
    ours = replay(cache, scenario)
    ours[0]["events"] = first + ours[0]["events"]
    diff = first_difference(ours, fixture["records"], ("ok", "hit"), drop=("cache_salt",))
    assert diff is None, diff


def test_radix_events_are_off_by_default_and_refused_with_eagle() -> None:
    cache = make_cache("radix", CacheConfig(64, 1))
    req = Request("a", list(range(9)))
    cache.allocate(req, 9, cache.lookup(req))
    req.num_computed_tokens = 9
    cache.commit(req)
    assert cache.kv_events is None and cache.tree.events is None
    with pytest.raises(ValueError, match="kv_events"):
        make_cache("radix", CacheConfig(64, 1), kv_events="yes")
    with pytest.raises(ValueError, match="is_eagle"):
        make_cache("radix", CacheConfig(64, 1), kv_events=True, is_eagle=True)


# ------------------------------------------------------------------ Done-when: events == cache
PREFIXES = [[(7 * i + 13 * k) % 997 + 1 for k in range(80)] for i in range(3)]

# (backend, page size, layout, options): hashchain at block size 16, with vLLM's LRU, with a
# ranked policy of ours (evicts one block at a time), and one full + sliding-window layout
CONFIGS: dict[str, tuple[str, int, Any, dict[str, Any]]] = {
    "hashchain_p16": ("hashchain", 16, None, {}),
    "hashchain_p16_lfu": ("hashchain", 16, None, {"eviction_policy": "lfu"}),
    "hashchain_p16_gptoss": ("hashchain", 16, (("sliding_window", 32), ("full",)), {}),
    "radix_p1": ("radix", 1, None, {}),
    "radix_p16": ("radix", 16, None, {}),
    # the unified tree's components: full + sliding window (pages of 4), full + Mamba
    "radix_swa_p4": ("radix", 4, (("sliding_window", 8), ("full",)), {}),
    "radix_mamba_p1": ("radix", 1, (("mamba", 4), ("full",)), {}),
    # HiCache: a block is stored once per medium (device, host) that holds it
    "radix_hicache_p4": ("radix", 4, None, {"host_tier": HostTierConfig(ratio=0.5)}),
}


def build(name: str) -> PrefixCache[Any]:
    backend, page, layout, options = CONFIGS[name]
    capacity = 14 * 16 if page == 16 else 120  # small: the sequences evict
    return make_cache(backend, CacheConfig(capacity, page, layout=layout), kv_events=True, **options)


def cached_blocks(cache: PrefixCache[Any]) -> Counter[tuple[int | None, int]]:
    """What the cache holds, as (group, published hash), read from its index, not its events:
    hashchain the keys of the hash map (vLLM's int hash: the block hash's last 8 bytes);
    radix every page of every node, hashed along its path from the root (SGLang's chain)."""
    if isinstance(cache, HashChainCache):
        return Counter(
            (int.from_bytes(key[-4:], "big"), int.from_bytes(key[-12:-4], "big"))
            for key, _ in cache.block_pool.cached_block_hash_to_block.items()
        )
    from prefixcache.backends.radix.events import event_hash, page_digest

    tree, p = cache.tree, cache.page_size  # type: ignore[attr-defined]
    out: Counter[tuple[int | None, int]] = Counter()
    for node in tree.iter_nodes():
        # HiCache: a host copy is published when its write acks (SGLang's finish_write_through)
        on_host = getattr(node, "host_value", None) is not None and node.write_ack is None
        copies = (node.value is not None) + on_host
        path, up = [], node
        while up is not tree.root_node:
            path.append(up.key.token_ids)
            up = up.parent
        tokens = np.concatenate(path[::-1])
        salt = node.key.extra_key[1] if node.key.extra_key is not None else None
        prior = None if salt is None else hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest()
        for start in range(0, len(tokens), p):
            prior = page_digest(prior, tokens[start : start + p])
            if start >= len(tokens) - len(node.key):
                out[(None, event_hash(prior))] += copies
    return out


class EventModel:
    """The blocks the events say are cached: a multiset, as a subscriber with no loss keeps."""

    def __init__(self) -> None:
        self.blocks: Counter[tuple[int | None, int]] = Counter()

    def apply(self, events: list[Any]) -> None:
        for e in events:
            kind = type(e).__name__
            if kind == "AllBlocksCleared":
                self.blocks.clear()
            elif kind == "BlockStored":
                for h in e.block_hashes:
                    self.blocks[(e.group_idx, h)] += 1
            else:
                for h in e.block_hashes:
                    assert self.blocks[(e.group_idx, h)] > 0, f"BlockRemoved of {h}, never stored"
                    self.blocks[(e.group_idx, h)] -= 1
                    if not self.blocks[(e.group_idx, h)]:
                        del self.blocks[(e.group_idx, h)]


OP = st.one_of(
    # (prefix, its tokens taken, unique tokens after, salted); no unique tokens and whole blocks
    # repeat a prompt exactly: vLLM then caches its last block twice (the n - 1 hit cap)
    st.tuples(
        st.just("new"),
        st.integers(0, 2),
        st.one_of(st.integers(0, 80), st.sampled_from([16, 32, 48])),
        st.integers(0, 20),
        st.booleans(),
    ),
    st.tuples(st.just("step"), st.integers(0, 3), st.integers(1, 40)),
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("evict"), st.integers(1, 64)),
    st.just(("reset",)),
)


def run_ops(cache: PrefixCache[Any], ops: list[tuple[Any, ...]]) -> Iterator[list[Any]]:
    """Drive ``cache`` (admit / prefill in chunks / commit / decode / release / evict / reset)
    and yield the events drained after every step."""
    live: list[Request] = []
    tier = cache.host_tier
    for i, op in enumerate(ops):
        if tier is not None:  # an engine step (a tier's copies of earlier steps ack)
            tier.advance_transfers()
        if op[0] == "new" and len(live) < 4:
            prefix, cut, extra, salted = op[1:]
            req = Request(
                f"r{i}",
                PREFIXES[prefix][: max(cut, 1)] + [1000 + i] * extra,
                cache_salt="s" if salted and i % 2 else None,
            )
            m = cache.lookup(req)
            hit = m.tokens + m.host_tokens  # (a host hit is loaded by the admission, as the engine does)
            if cache.allocate(req, min(req.num_tokens - hit, 24), m):
                live.append(req)
        elif op[0] == "step" and live:
            req = live[op[1] % len(live)]
            if req.num_computed_tokens < cache.reserved_tokens(req):
                req.num_computed_tokens = cache.reserved_tokens(req)
                cache.commit(req)
            elif req.num_computed_tokens < req.num_tokens:
                cache.allocate(req, min(op[2], req.num_tokens - req.num_computed_tokens))
            else:  # decode: a token out, its slot allocated
                req.append_output_token_ids([2000 + i])
                cache.allocate(req, 1)
        elif op[0] == "release" and live:
            cache.release(live.pop(op[1] % len(live)))
        elif op[0] == "evict":
            cache.evict(op[1])
        elif op[0] == "reset":
            cache.reset()  # refused while a request is live
        yield cache.kv_events.take_events()
    for req in live:
        cache.release(req)
        yield cache.kv_events.take_events()


def full_group(cache: PrefixCache[Any]) -> int | None:
    groups = cache.kv_groups()
    return (
        next(i for i, g in enumerate(groups) if g.kind == "full")
        if isinstance(cache, HashChainCache)
        else None
    )


@pytest.mark.parametrize("name", CONFIGS)
@settings(deadline=None)
@given(ops=st.lists(OP, max_size=30))
def test_events_replayed_after_every_step_hold_exactly_the_cached_blocks(
    name: str, ops: list[tuple[Any, ...]]
) -> None:
    """Zero lag, no loss: after every step the replayed events (a multiset model, and
    BlockIndex as Dynamo / llm-d keep it: the full-attention group, which it finds from the
    events' kinds even where vLLM numbers a sliding-window group 0) equal the cache."""
    cache = build(name)
    model = EventModel()
    page = cache.page_size
    group = full_group(cache)
    index = BlockIndex(1, block_size=page)
    model.apply(cache.kv_events.take_events())
    for seq, events in enumerate(run_ops(cache, ops)):
        model.apply(events)
        index.apply(0, seq, events)
        held = cached_blocks(cache)
        assert model.blocks == held
        assert index.engine_hashes(0) == {h: n for (g, h), n in held.items() if g == group}
    assert not index.gaps[0]


@pytest.mark.parametrize("name", ["hashchain_p16", "radix_p1"])
@settings(deadline=None)
@given(ops=st.lists(OP, min_size=5, max_size=30), seed=st.integers(0, 1 << 16))
def test_lost_batches_leave_gaps_that_the_subscriber_reports(
    name: str, ops: list[tuple[Any, ...]], seed: int
) -> None:
    """Lossy delivery as Cluster's event_loss: each non-empty batch takes a sequence number,
    some are dropped; SequenceGaps and BlockIndex report exactly the dropped runs that a later
    delivered batch reveals."""
    cache = build(name)
    rng = random.Random(seed)
    gaps, index = kv_events.SequenceGaps(), BlockIndex(1, block_size=cache.page_size)
    dropped: list[int] = []
    seq = 0
    for events in [cache.kv_events.take_events(), *run_ops(cache, ops)]:
        if not events:
            continue
        if rng.random() < 0.3:
            dropped.append(seq)
        else:
            gaps.see(seq)
            index.apply(0, seq, events)
        seq += 1
    last = gaps.last_seq if gaps.last_seq is not None else -1
    expected: list[tuple[int, int]] = []
    for s in (s for s in dropped if s < last):
        if expected and expected[-1][1] == s - 1:
            expected[-1] = (expected[-1][0], s)
        else:
            expected.append((s, s))
    if expected and expected[0][0] == 0:  # nothing before the first delivery to compare with
        expected.pop(0)
    assert gaps.gaps == expected == index.gaps[0]


# ------------------------------------------------------------------ a cluster on real events
def test_dynamo_on_real_backend_events_ends_with_an_index_equal_to_the_replicas_caches() -> None:
    """Cluster of a hashchain, a radix and a hybrid (full + sliding-window) hashchain replica
    (block / page 16, small pools: they evict), Dynamo's router in ``use_kv_events`` mode: it
    routes on the events the backends emit, and once the last batches are delivered its index
    holds exactly each replica's cached blocks (of the full-attention group)."""
    from prefixcache.experiments.inputs.workloads import make_workload

    from prefixcache.cluster import Cluster, make_router

    gptoss = (("sliding_window", 32), ("full",))
    caches = [
        make_cache("hashchain", CacheConfig(640, 16), kv_events=True),
        make_cache("radix", CacheConfig(640, 16), kv_events=True),
        make_cache("hashchain", CacheConfig(640, 16, layout=gptoss), kv_events=True),
    ]
    router = make_router("dynamo", 3, block_size=16, use_kv_events=True)
    reqs = make_workload("shared-doc-qa", seed=0, num_requests=24, num_docs=3, doc_len=256).generate()
    for i, r in enumerate(reqs):
        r.arrival_time = 0.05 * i
    c = Cluster(caches, router, kv_events=True, check_invariants=True)
    rows = c.run(reqs)
    c.flush_events()  # the batches still in flight when the last request finished
    index = router.index
    assert index is not None and not any(index.gaps)
    for k, cache in enumerate(caches):
        held = cached_blocks(cache)
        assert held, "the replica cached nothing: the test would prove nothing"
        group = full_group(cache)
        assert index.engine_hashes(k) == {h: n for (g, h), n in held.items() if g == group}
    assert sum(cache.stats.evicted_tokens for cache in caches) > 0
    assert any(r.branch == "cache" and r.predicted_tokens > 0 for r in rows)


def test_block_index_counts_the_copies_of_a_block_vllm_caches_twice() -> None:
    """vLLM 0.33: a prompt of whole blocks hits all but its last block (the n - 1 cap), so a
    second identical request computes that block again into a second block with the same
    hash, and each copy gets its own BlockStored and, when reused, its own BlockRemoved."""
    cache = make_cache("hashchain", CacheConfig(5 * 16, 16), kv_events=True)  # 4 usable blocks
    index = BlockIndex(1, block_size=16)
    prompt = list(range(1, 33))
    a, b = Request("a", prompt), Request("b", prompt)
    steps: list[list[Any]] = []
    for req in (a, b):
        assert cache.allocate(req, 32 - cache.lookup(req).tokens, cache.lookup(req))
        steps.append(cache.kv_events.take_events())
    cache.release(a)
    cache.release(b)
    # the free queue: the never-cached block, then a's last block, b's copy of it, block 0
    other = Request("c", list(range(100, 132)))  # takes the first two: one copy is reused
    assert cache.allocate(other, 32, cache.lookup(other))
    steps.append(cache.kv_events.take_events())
    removed = [e for e in steps[-1] if type(e).__name__ == "BlockRemoved"]
    assert len(removed) == 1
    index.apply(0, 0, steps[0] + steps[1])
    assert sorted(index.engine_hashes(0).values()) == [1, 2]  # the prompt's last block: 2 copies
    index.apply(0, 1, steps[2])
    held = cached_blocks(cache)
    assert sorted(held.values()) == [1, 1, 1, 1]  # the prompt's 2 blocks (one copy left), c's 2
    assert index.engine_hashes(0) == {h: n for (_, h), n in held.items()}
    last = chained_block_hashes_of(prompt)
    assert index.overlap(0, last) == 2, "the second copy still holds the prompt's last block"


def chained_block_hashes_of(tokens: list[int]) -> list[int]:
    from prefixcache.cluster.routers.base import chained_block_hashes

    return chained_block_hashes(tokens, 16)


def test_hashchain_publishes_hash_bytes_with_vllms_int_hashes_off() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the 32 hash bytes; by default their last 8 as an
    int."""
    cache = make_cache("hashchain", CacheConfig(64, 4), kv_events=True)
    assert isinstance(cache, HashChainCache) and cache.block_pool.kv_events is not None
    cache.block_pool.kv_events.int_block_hashes = False
    req = Request("a", list(range(9)))
    cache.allocate(req, 9, cache.lookup(req))
    (stored,) = cache.kv_events.take_events()
    key = cache.block_pool.cached_block_hash_to_block.get_one_block
    assert [len(h) for h in stored.block_hashes] == [32, 32]
    assert all(key(h + bytes(4)) is not None for h in stored.block_hashes)  # group 0's keys


@given(
    tokens=st.lists(st.integers(min_value=0, max_value=(1 << 33)), max_size=40),
    page_size=st.integers(min_value=1, max_value=6),
    salted=st.booleans(),
)
def test_page_digests_chain_page_digest_over_every_whole_page(
    tokens: list[int], page_size: int, salted: bool
) -> None:
    """The run's one encoding gives SGLang's per-page digests, ids past 32 bits included (their
    pages take the wide encoding), and a partial last page is left out."""
    from prefixcache.backends.radix.events import page_digest, page_digests

    arr = np.array(tokens, dtype=np.int64)
    prior = hashlib.sha256(b"salt").digest() if salted else None
    expected, chain = [], prior
    for start in range(0, len(arr) - len(arr) % page_size, page_size):
        chain = page_digest(chain, arr[start : start + page_size])
        expected.append(chain)
    assert page_digests(prior, arr, page_size) == expected
