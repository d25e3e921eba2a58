"""The decomposition study's ablation switches: each one changes only the behaviour it names.

hashchain ``publish="commit"`` (SGLang's publication time), ``dedupe=True`` (SGLang's insert
frees duplicates), ``eviction_policy="leaf-lru"`` (SGLang's order over blocks); radix
``eviction_granularity="page"`` (vLLM's granularity). With all of them on, hashchain and radix
at one page size serve a workload request for request alike (the study's residual).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefixcache.backends.hashchain.eviction import RankedEviction
from prefixcache.experiments.figures.common import cell_config, read_table, run_cell

from prefixcache import CacheConfig, Request, make_cache
from tests.helpers import checked, run_to_completion, tokens

SGLANG_LIKE = {"publish": "commit", "dedupe": True, "eviction_policy": "leaf-lru"}


def admit(cache, req: Request) -> int:
    match = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - match.tokens, match)
    return req.num_computed_tokens


def finish(cache, req: Request) -> None:
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    cache.release(req)


@pytest.mark.parametrize("options, second_hit", [({}, 32), ({"publish": "commit"}, 0)])
def test_publication_time_alone_decides_a_same_step_hit(options: dict, second_hit: int) -> None:
    """Two equal 48-token prompts admitted before either commits: vLLM publishes at allocation,
    so the second hits the first's 2 full blocks (n-1 cap: 47 tokens, floored); at commit
    (SGLang's time) it hits nothing, as radix p16 does. Everything else stays vLLM's."""
    prompt = tokens(48)
    cache = checked("hashchain", 1024, 16, **options)
    a, b = Request("a", prompt), Request("b", prompt)
    assert admit(cache, a) == 0
    assert admit(cache, b) == second_hit
    finish(cache, a)
    finish(cache, b)
    radix = checked("radix", 1024, 16)
    ra, rb = Request("a", prompt), Request("b", prompt)
    admit(radix, ra)
    assert admit(radix, rb) == 0  # radix never hits a prefill that has not committed
    finish(radix, ra)
    finish(radix, rb)
    # after both commits a third request hits the published blocks either way
    assert run_to_completion(cache, Request("c", prompt)) == 32


def test_publication_at_commit_leaves_decode_tokens_unpublished_until_release() -> None:
    """SGLang checkpoints prefill chunks, not decode steps: a decoded block reaches the index
    at release. vLLM caches it once full."""
    prompt = tokens(16, seed=1)
    out = tokens(17, seed=2)
    for options, during in (({}, 16), ({"publish": "commit"}, 0)):
        cache = checked("hashchain", 1024, 16, **options)
        a = Request("a", prompt)
        admit(cache, a)
        a.num_computed_tokens = a.num_tokens
        cache.commit(a)
        for t in out:  # decode 17 tokens: one more block fills
            a.append_output_token_ids([t])
            assert cache.allocate(a, 1)
            a.num_computed_tokens += 1
            cache.commit(a)
        probe = Request("p", prompt + out + [7])
        # the prompt block is published either way; the decoded block only by vLLM's time
        assert cache.lookup(probe).tokens == 16 + during
        cache.release(a)
        assert cache.lookup(probe).tokens == 32


@pytest.mark.parametrize("options, cached_pages", [({}, 3), ({"dedupe": True}, 2)])
def test_dedupe_alone_gives_the_recomputed_duplicate_back(options: dict, cached_pages: int) -> None:
    """A 32-token prompt served twice: the n-1 cap makes the second recompute block 2. vLLM
    keeps that copy cached beside the first (3 cached blocks); with dedupe it goes back to the
    pool at once, as radix p16 frees its duplicate at insert (2 cached pages). Hits are equal."""
    prompt = tokens(32, seed=3)
    cache = checked("hashchain", 1024, 16, **options)
    assert run_to_completion(cache, Request("a", prompt)) == 0
    assert run_to_completion(cache, Request("b", prompt)) == 16
    assert cache.usage().evictable == cached_pages
    radix = checked("radix", 1024, 16)
    run_to_completion(radix, Request("a", prompt))
    assert run_to_completion(radix, Request("b", prompt)) == 16
    assert radix.usage().evictable == 2


def test_dedupe_takes_the_cached_block_into_the_request_table() -> None:
    """While the second request runs, its table names the first's two blocks (one copy of
    each in use); without dedupe it holds its own copy of the recomputed block."""
    prompt = tokens(32, seed=4)
    for options, shared in (({"dedupe": True}, 2), ({}, 1)):
        cache = checked("hashchain", 1024, 16, **options)
        a = Request("a", prompt)
        admit(cache, a)
        first = cache.page_table(a)
        finish(cache, a)
        b = Request("b", prompt)
        admit(cache, b)
        assert len(set(cache.page_table(b)) & set(first)) == shared
        assert cache.usage().in_use == 2
        finish(cache, b)


@pytest.mark.parametrize("granularity, evicted", [("leaf", 64), ("page", 16)])
def test_eviction_granularity_alone(granularity: str, evicted: int) -> None:
    """A pool of 5 usable pages holds one unlocked 64-token leaf; a 17-token request needs 2
    pages, 1 free: SGLang evicts the whole leaf, page granularity one page from its end."""
    cache = checked("radix", 96, 16, eviction_granularity=granularity)
    run_to_completion(cache, Request("a", tokens(65, seed=5)))  # 4 full pages cached
    assert cache.usage().evictable == 4
    run_to_completion(cache, Request("b", tokens(17, seed=6)))
    assert cache.stats.evicted_tokens == evicted
    # what page granularity kept still hits: the leaf's first 3 pages
    assert run_to_completion(cache, Request("c", tokens(65, seed=5))) == (48 if granularity == "page" else 0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 80)), min_size=4, max_size=30),
       st.sampled_from([64, 128, 256]))
def test_leaf_lru_is_the_free_queue_in_a_replay(reqs: list[tuple[int, int]], capacity: int) -> None:
    """vLLM's free queue, fed each request's blocks tail first, is already a leaf LRU: one
    request at a time, the ranked LRU over leaf blocks hits exactly what the queue hits (the
    study measures the switch at 0 in every cell; this pins why)."""
    hits = {}
    for policy in ("lru", "leaf-lru"):
        cache = make_cache("hashchain", CacheConfig(capacity, 16), eviction_policy=policy)
        out = []
        for i, (prefix, extra) in enumerate(reqs):
            prompt = tokens(48, seed=prefix) + tokens(extra, seed=1000 + i)
            if len(prompt) > cache.config.usable_tokens:
                continue
            out.append(run_to_completion(cache, Request(f"r{i}", prompt)))
        cache.check_invariants()
        hits[policy] = out
    assert hits["lru"] == hits["leaf-lru"]


def test_hashchain_with_every_switch_serves_as_radix_does(tmp_path) -> None:
    """The study's closure: a closed batch of multi-turn chats in the engine at a pool that
    evicts. hashchain p16 with SGLang's publication, insert and order hits per request what
    radix p16 with vLLM's eviction granularity hits; vLLM's hashchain does not."""
    params = dict(conversations=24, turns=4, system_len=250)
    hits = {}
    for label, backend, options in [("vllm", "hashchain", {}), ("all", "hashchain", SGLANG_LIKE),
                                    ("radix-page", "radix", {"eviction_granularity": "page"})]:
        c = cell_config("switches", source="multi-turn-chat", backend=backend, page_size=16,
                        capacity_tokens=1 << 12, options=options, params=params, label=label)
        row = run_cell(c, tmp_path)
        assert row["evicted_tokens"] > 0
        df = read_table(tmp_path / "switches" / row["cell"] / "requests")
        hits[label] = df.set_index("request_id")["hit_tokens"].sort_index().tolist()
    assert hits["all"] == hits["radix-page"]
    assert hits["vllm"] != hits["all"]


@pytest.mark.parametrize("options", [{"publish": "commit"}, {"dedupe": True}])
def test_the_switches_refuse_what_they_do_not_model(options: dict) -> None:
    with pytest.raises(ValueError, match="dense model"):
        make_cache("hashchain", CacheConfig(1024, 16), kv_events=True, **options)
    with pytest.raises(ValueError):
        make_cache("hashchain", CacheConfig(1024, 16), publish="later")
    with pytest.raises(ValueError, match="eviction_granularity"):
        make_cache("radix", CacheConfig(1024, 16), eviction_granularity="block")
    with pytest.raises(ValueError, match="kv_events"):
        make_cache("radix", CacheConfig(1024, 16), eviction_granularity="page", kv_events=True)


def test_leaf_lru_ranks_the_free_cached_leaves() -> None:
    """The switch really ranks: its index holds the free cached leaf blocks (a chain's last
    block), which it evicts by last access, and "lru" keeps vLLM's queue with no index. (That
    the two orders hit alike is the property above.)"""
    cache = make_cache("hashchain", CacheConfig(1024, 16), eviction_policy="leaf-lru")
    assert not isinstance(make_cache("hashchain", CacheConfig(1024, 16)).block_pool.eviction, RankedEviction)
    run_to_completion(cache, Request("a", tokens(48, seed=7)))  # a chain of 3 cached blocks
    run_to_completion(cache, Request("b", tokens(48, seed=8)))
    ranked = cache.block_pool.eviction
    assert isinstance(ranked, RankedEviction) and len(ranked) == 2  # one leaf per chain
    victim = ranked.pop_victim()
    assert victim is not None and victim.block_hash is not None and victim.num_cached_children == 0
