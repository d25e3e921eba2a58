"""The routers of REFERENCE-routing.md, section 4's ten scenarios by name (two replicas, "first"
= W1 = replica 0), plus the pieces each scenario rests on. Each router follows the upstream
version its module docstring names; where versions differ (SGLang's low-match branch) both are
tested."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from prefixcache import Request
from prefixcache.cluster import ReplicaState, TokenText, make_router
from prefixcache.cluster.routers.base import chained_block_hashes
from prefixcache.cluster.routers.dynamo import classic_cost, pick_probabilities, softmax_pick
from prefixcache.cluster.routers.llmd import load_aware_score, prompt_block_hashes, queue_scores
from prefixcache.cluster.routers.preble import exploits


class Literal(TokenText):
    """Each token is one character (its code point), so a test can route literal text."""

    def spell(self, token: int) -> str:
        return chr(token)


def req(text: str, rid: str = "r") -> Request:
    return Request(rid, [ord(c) for c in text])


def states(
    *, waiting=(0, 0), active=None, kv=(0.0, 0.0), prefill=(0, 0), decode=(0, 0)
) -> list[ReplicaState]:
    active = waiting if active is None else active
    return [ReplicaState(k, active[k], waiting[k], kv[k], prefill[k], decode[k]) for k in range(2)]


def text_of(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij") for _ in range(n))


# ------------------------------------------------------------------ 1-4: SGLang cache_aware
@pytest.mark.parametrize("version", ["gateway", "old"])
def test_scenario_1_sglang_cache_aware_with_balanced_load(version: str) -> None:
    r = make_router("sglang", 2, version=version, text=Literal())
    picks = [r.route(req(t), states(), now=0.0).replica for t in ("hello world", "hello world", "hello")]
    assert len(set(picks)) == 1
    assert r.route(req("hello world"), states(), 0.0).branch == "cache"


def test_scenario_2_sglang_cache_aware_with_imbalanced_load() -> None:
    r = make_router("sglang", 2, cache_threshold=0.5, balance_abs=5, balance_rel=2, text=Literal())
    r.load = [20, 0]
    decisions = [r.route(req("test"), states(), 0.0) for _ in range(5)]
    assert [d.replica for d in decisions] == [1] * 5 and {d.branch for d in decisions} == {"balance"}
    defaults = make_router("sglang", 2)
    for loads, imbalanced in (((64, 0), False), ((300, 250), False), ((100, 70), False),
                              ((65, 0), True), ((300, 150), True)):
        defaults.load = list(loads)
        assert defaults.is_imbalanced() is imbalanced, loads


@pytest.mark.parametrize("version", ["gateway", "old"])
@pytest.mark.parametrize("shared, expected", [(300, 1), (301, 0)])
def test_scenario_3_sglang_threshold_is_strict(version: str, shared: int, expected: int) -> None:
    r = make_router("sglang", 2, version=version, text=Literal())
    s = "s" * shared
    r.tree.insert(s + "a" * (1000 - shared), 0, 0.0)
    r.load = [1, 0]
    d = r.route(req(s + "b" * (1000 - shared)), states(), 0.0)
    assert d.replica == expected
    low_match = {"gateway": "least-load", "old": "smallest-tree"}[version]
    assert d.branch == ("cache" if expected == 0 else low_match)


@pytest.mark.parametrize("version, expected", [("old", 1), ("gateway", 0)])
def test_scenario_4_sglang_low_match_branch_differs_by_version(version: str, expected: int) -> None:
    r = make_router("sglang", 2, version=version, text=Literal())
    r.tree.insert("x" * 1000, 0, 0.0)
    r.tree.insert("y" * 10, 1, 0.0)
    r.load = [0, 3]
    assert r.tree.size == {0: 1000, 1: 10}
    assert r.route(req("unrelated prompt"), states(), 0.0).replica == expected


def test_sglang_eviction_trims_each_worker_to_max_tree_size_lru_first() -> None:
    r = make_router("sglang", 2, max_tree_size=25, eviction_interval_s=10.0, text=Literal())
    r.tree.insert("a" * 20, 0, now=1.0)
    r.tree.insert("b" * 20, 0, now=2.0)
    r.route(req("c" * 5), states(), now=10.0)  # the interval has passed: evict, then route
    assert r.tree.size[0] <= 25
    assert r.tree.tenant_match("a" * 20, 0) == 0 and r.tree.tenant_match("b" * 20, 0) == 20


# ------------------------------------------------------------------ 5-6: Dynamo
@pytest.mark.parametrize("weight, expected, costs", [(1.0, 1, (32, 15)), (10.0, 0, (50, 105))])
def test_scenario_5_dynamo_classic_cost(weight: float, expected: int, costs: tuple[int, int]) -> None:
    assert classic_cost(160, 8, 16, 0, 30, weight) == costs[0]
    assert classic_cost(160, 0, 16, 0, 5, weight) == costs[1]
    r = make_router("dynamo", 2, block_size=16, overlap_weight=weight)
    prompt = req(text_of(160, 5))
    tokens = prompt.prompt_token_ids
    for h in chained_block_hashes(tokens, 16)[:8]:
        r.blocks[0][h] = math.inf  # W1 holds the first 8 blocks
    d = r.route(prompt, states(decode=(30, 5)), 0.0)
    assert d.replica == expected
    assert d.predicted_tokens == (128 if expected == 0 else 0)


def test_scenario_6_dynamo_temperature() -> None:
    p = pick_probabilities([15, 32], temperature=1.0)
    assert p[0] == pytest.approx(1 / (1 + math.exp(-1)), abs=1e-12) and round(p[0], 3) == 0.731
    assert pick_probabilities([20, 20], 1.0) == [0.5, 0.5]
    rng = random.Random(0)
    picks = [softmax_pick([15, 32], 1.0, rng) for _ in range(20_000)]
    assert picks.count(0) / len(picks) == pytest.approx(0.731, abs=0.01)
    assert softmax_pick([15, 32, 15], 0.0, rng) == 0  # T=0: the cheapest, first on ties


def test_dynamo_history_mode_remembers_routed_blocks_until_the_ttl() -> None:
    r = make_router("dynamo", 2, block_size=4, ttl_s=120.0)
    tokens = [ord(c) for c in text_of(66, 1)]  # 16 full blocks and 2 tokens
    first = r.route(Request("a", tokens), states(), 0.0)
    assert first.predicted_tokens == 0
    again = r.route(Request("b", tokens), states(), 100.0)
    assert (again.replica, again.predicted_tokens, again.branch) == (first.replica, 64, "cache")
    hashes = chained_block_hashes(tokens, 4)
    assert r.overlap(first.replica, hashes, 100.0 + 119.0) == 16  # refreshed by the second route
    assert r.overlap(first.replica, hashes, 100.0 + 121.0) == 0  # expired


# ------------------------------------------------------------------ 7: llm-d
@pytest.mark.parametrize("kv_a, expected, totals", [(0.8, 1, (3.4, 3.6)), (0.5, 0, (4.0, 3.6))])
def test_scenario_7_llmd_weighted_scorers(kv_a: float, expected: int, totals: tuple[float, float]) -> None:
    r = make_router("llm-d", 2, text=Literal())
    text = text_of(640, 7)
    hashes = prompt_block_hashes(text, "model")
    for h in hashes:
        r.lru[0][h] = None  # pod A holds the whole prompt: prefix score 1
    scores = {"prefix": r.prefix_scores(hashes), "queue": queue_scores([10, 0]), "kv": [1 - kv_a, 0.8]}
    assert scores["prefix"] == [1.0, 0.0]
    assert r.totals(scores) == pytest.approx(list(totals))
    assert r.route(req(text), states(waiting=(10, 0), kv=(kv_a, 0.2)), 0.0).replica == expected


def test_scenario_7_llmd_approximate_prefix_score() -> None:
    r = make_router("llm-d", 2, text=Literal())
    text = text_of(640, 3)
    hashes = prompt_block_hashes(text, "model")
    assert len(hashes) == 11  # the model block + 10 blocks of 64 characters
    for h in hashes[:6]:  # the model block and 5 content blocks
        r.lru[0][h] = None
    assert r.prefix_scores(hashes)[0] == pytest.approx(6 / 11) and round(6 / 11, 3) == 0.545
    assert len(prompt_block_hashes(text + "x" * 63, "model")) == 11  # a tail under 64 is dropped
    assert len(prompt_block_hashes("z" * 64 * 300, "model")) == 256


def test_llmd_queue_and_load_aware_scores() -> None:
    assert queue_scores([3, 3]) == [1.0, 1.0] and queue_scores([10, 0, 5]) == [0.0, 1.0, 0.5]
    assert load_aware_score(0) == 0.5 and load_aware_score(64) == 0.25 and load_aware_score(500) == 0.0


# ------------------------------------------------------------------ 8: Ray Serve
def test_scenario_8_ray_serve_prefix_affinity() -> None:
    r = make_router("ray-serve", 2, text=Literal())
    skewed = r.route(req("anything"), states(active=(12, 1)), 0.0)
    assert (skewed.replica, skewed.branch) == (1, "power-of-two")  # two replicas: it samples both
    assert r.route(req("another"), states(active=(10, 0)), 0.0).branch != "power-of-two"
    r = make_router("ray-serve", 2, text=Literal())
    held = "h" * 100
    r.tree.insert(held, 0, 0.0)
    low = r.route(req("h" * 5 + "q" * 95), states(), 0.0)  # rate 0.05
    assert (low.replica, low.branch) == (1, "fewest-chars")
    r = make_router("ray-serve", 2, text=Literal())
    r.tree.insert(held, 0, 0.0)
    at = r.route(req("h" * 10 + "q" * 90), states(), 0.0)  # rate exactly 0.10: not below
    assert (at.replica, at.branch) == (0, "cache")


# ------------------------------------------------------------------ 9: production-stack
def test_scenario_9_production_stack_prefixaware() -> None:
    p = text_of(300, 9)
    for load in ((0, 0), (50, 0)):
        r = make_router("production-stack", 2, text=Literal())
        r.route(req(p), states(), 0.0)
        owner = 0 if r.root.children[next(iter(r.root.children))].endpoints == {0} else 1
        d = r.route(req(p[:200] + "Z" * 100), states(active=load), 0.0)  # chunk 0 shared
        assert d.replica == owner and d.branch == "cache"
    seen = set()
    for seed in range(20):
        r = make_router("production-stack", 2, seed=seed, text=Literal())
        r.route(req(p), states(), 0.0)
        d = r.route(req(p[:100] + "Z" * 200), states(), 0.0)  # chunk 0 differs: no match
        assert d.branch == "random"
        seen.add(d.replica)
    assert seen == {0, 1}


# ------------------------------------------------------------------ 10: Preble
def test_scenario_10_preble_exploit_or_explore() -> None:
    assert exploits(cached=6000, new=1200)
    assert not exploits(cached=500, new=3000)
    assert not exploits(cached=1000, new=1000)  # strict
    r = make_router("preble", 2)
    shared = list(range(1, 6001))
    r.route(Request("a", shared + [7] * 100), states(active=(0, 0)), 0.0)
    first = next(iter(r.tree.root.children.values())).tenants
    owner = next(iter(first))
    d = r.route(Request("b", shared + [9] * 1200), states(active=(0, 0)), 1.0)
    assert (d.replica, d.branch) == (owner, "exploit")
    d = r.route(Request("c", shared[:500] + [11] * 3000), states(), 2.0)
    assert d.branch == "explore"


def test_unknown_router_and_bad_options_are_value_errors() -> None:
    with pytest.raises(ValueError, match="unknown router"):
        make_router("nginx", 2)
    with pytest.raises(ValueError, match="version"):
        make_router("sglang", 2, version="v9")
    with pytest.raises(ValueError, match="cost"):
        make_router("dynamo", 2, cost="cheap")
    with pytest.raises(ValueError, match="scorers"):
        make_router("llm-d", 2, weights={"prefix": 1, "latency": 1})
    with pytest.raises(ValueError, match="num_replicas"):
        make_router("round-robin", 0)


# ------------------------------------------------------------------ exact routers: KV events
def stored(tokens, hashes, parent=None, block_size=4, group=0):
    ev = pytest.importorskip("prefixcache.kv_events")
    return ev.BlockStored(block_hashes=list(hashes), parent_block_hash=parent, token_ids=list(tokens),
                          block_size=block_size, lora_id=None, medium="GPU", lora_name=None, group_idx=group)


def removed(hashes, group=0):
    ev = pytest.importorskip("prefixcache.kv_events")
    return ev.BlockRemoved(block_hashes=list(hashes), medium="GPU", group_idx=group)


def test_block_index_follows_stored_removed_and_cleared_events() -> None:
    ev = pytest.importorskip("prefixcache.kv_events")
    from prefixcache.cluster.routers.event_index import BlockIndex

    tokens = list(range(100, 120))  # 5 blocks of 4
    want = chained_block_hashes(tokens, 4)
    index = BlockIndex(2, block_size=4)
    index.apply(0, 0, [stored(tokens[:12], [b"e0", b"e1", b"e2"])])
    index.apply(0, 1, [stored(tokens[12:20], [b"e3", b"e4"], parent=b"e2")])
    assert index.overlap(0, want) == 5 and index.overlap(1, want) == 0
    index.apply(0, 2, [stored(tokens[:3], [b"p"], block_size=3),  # a partial block: not indexed
                       stored(tokens[:4], [b"w0"], group=1),  # another KV-cache group
                       stored([9, 9, 9, 9], [b"x"], parent=b"never-seen")])
    assert index.held[0] == set(want)
    index.apply(0, 5, [removed([b"e3"])])  # batches 3-4 were lost
    assert index.overlap(0, want) == 3 and index.gaps[0] == [(3, 4)]
    index.apply(0, 6, [ev.AllBlocksCleared()])
    assert index.overlap(0, want) == 0 and not index.held[0]


def test_dynamo_with_kv_events_routes_to_the_replica_whose_events_show_the_prefix() -> None:
    r = make_router("dynamo", 2, block_size=4, use_kv_events=True)
    tokens = list(range(200, 240))
    r.on_events(1, 0, [stored(tokens[:32], [f"b{i}".encode() for i in range(8)])], now=0.0)
    d = r.route(Request("q", tokens), states(), 1.0)
    assert (d.replica, d.predicted_tokens, d.branch) == (1, 32, "cache")
    assert not r.blocks[1], "the event mode keeps no routing history"
    r.on_events(1, 1, [removed([b"b0"])], now=2.0)
    assert r.route(Request("q2", tokens), states(), 3.0).predicted_tokens == 0


def test_llmd_precise_scorer_reads_the_event_index_min_max_normalised() -> None:
    r = make_router("llm-d", 2, prefix="precise", block_size=4, weights={"prefix": 3, "queue": 2})
    tokens = list(range(300, 340))
    r.on_events(0, 0, [stored(tokens[:16], [f"c{i}".encode() for i in range(4)])], now=0.0)
    # A: 4 blocks (prefix 1), queue 5 (score 0) = 3; B: prefix 0, queue 0 (score 1) = 2 -> A
    d = r.route(Request("q", tokens), states(waiting=(5, 0)), 1.0)
    assert (d.replica, d.predicted_tokens) == (0, 16)
    with pytest.raises(ValueError, match="prefix"):
        make_router("llm-d", 2, prefix="exactish")


def test_token_text_spells_through_its_table_exactly_as_token_by_token() -> None:
    """The spelling table (ids below TABLE_SIZE) is a cache, never a different spelling: mixed
    with ids outside it (negative or large) the text and the token counts are the same."""
    from prefixcache.cluster.text import TABLE_SIZE

    inside = [0, 7, 31_999, TABLE_SIZE - 1, 7, 12]
    for tokens in (inside, [*inside, TABLE_SIZE], [-3, *inside]):
        fast, slow = TokenText(seed=5), TokenText(seed=5)
        assert fast.text(tokens) == "".join(slow.spell(t) for t in tokens)
        for chars in (0, 3, 11, 40):
            expected, end = 0, 0
            for t in tokens:
                end += len(slow.spell(t))
                if end > chars:
                    break
                expected += 1
            assert fast.tokens_within(tokens, chars) == expected


@given(
    spellings=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=12),
    picks=st.lists(st.integers(min_value=0, max_value=11), max_size=30),
    chars=st.integers(min_value=0, max_value=160),
)
@example(spellings=["ab", "\0", "c"], picks=[0, 1, 2, 1], chars=4)  # one byte, a NUL spelled
@example(spellings=["x\ud800", "\u20ac", "\0y"], picks=[1, 0, 2], chars=3)  # wide, a lone surrogate
@example(spellings=["ab", "cde"], picks=[1, 0, 1], chars=5)  # one byte, NUL only as padding
def test_spelling_table_gathers_exactly_the_spellings_one_after_another(
    spellings: list[str], picks: list[int], chars: int
) -> None:
    """Every layout of the table (one-byte codes with NUL only as padding, one-byte codes with a
    NUL spelled, wide code points and lone surrogates) spells a prompt and counts the tokens
    within a character offset exactly as a Python step per token does."""
    from prefixcache.cluster.text import SpellingTable

    table = SpellingTable(spellings)
    ids = np.array([i % len(spellings) for i in picks], dtype=np.int64)
    assert table.text(ids) == "".join(spellings[i] for i in ids)
    expected, end = 0, 0
    for i in ids:
        end += len(spellings[i])
        if end > chars:
            break
        expected += 1
    assert table.tokens_within(ids, chars) == expected


def test_common_prefix_length_is_commonprefix_without_the_copy() -> None:
    from prefixcache.cluster.routers.char_tree import common_prefix_length

    rng = random.Random(3)
    for _ in range(3000):
        edge = "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        start = rng.randint(0, len(text))
        assert common_prefix_length(edge, text, start) == len(os.path.commonprefix([edge, text[start:]]))


@given(st.lists(st.integers(min_value=-3, max_value=(1 << 32) + 3), max_size=20))
def test_token_bytes_packs_a_list_as_the_array_path_does(tokens: list[int]) -> None:
    """An event's token ids come as a list and are packed by array(); an array of ids by numpy:
    the same bytes, and the same OverflowError for an id outside [0, 2**32)."""
    from prefixcache.cluster.routers.base import token_bytes

    outside = any(not 0 <= t < 1 << 32 for t in tokens)
    for given_as in (tokens, np.array(tokens, dtype=np.int64)):
        if outside:
            with pytest.raises(OverflowError):
                token_bytes(given_as)
        else:
            assert token_bytes(given_as) == b"".join(t.to_bytes(4, "little") for t in tokens)


@given(st.lists(st.integers(min_value=-2, max_value=0x110001), max_size=20))
def test_preble_spells_tokens_as_the_code_points_chr_gives(tokens: list[int]) -> None:
    """Preble's tree matches token ids as characters: the one-call decode is chr() per token,
    lone surrogates included, and refuses what chr() refuses."""
    from prefixcache.cluster.routers.preble import as_text

    if any(not 0 <= t <= 0x10FFFF for t in tokens):
        with pytest.raises(ValueError):
            as_text(tokens)
    else:
        assert as_text(tokens) == "".join(map(chr, tokens))
        assert as_text(np.array(tokens, dtype=np.int64)) == "".join(map(chr, tokens))
