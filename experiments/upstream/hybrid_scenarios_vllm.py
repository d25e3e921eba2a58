"""Hybrid (full + sliding-window) scenarios for vLLM 0.33's KVCacheManager and our hashchain
backend (REFERENCE-hybrid.md, "Scenario tests"; recorded by vllm_hybrid_driver.py).

A scenario is a dict: ``name``, ``block_size``, ``retention`` (prefix_cache_retention_interval:
None dense, 0 vLLM's engine default), and either ``groups`` (explicit KV-cache groups, e.g.
[["full"], ["sliding_window", 32]]) over ``num_blocks`` blocks, or ``layout`` (a list of layers)
over ``capacity_tokens`` per layer, whose groups and pool vLLM's planning rule forms. ``ops``:

  {"op": "new", "rid", "prompt"}       create a request
  {"op": "alloc", "rid", "n"}          allocate (the first call looks up and admits; n=None:
                                       the rest of the prompt after the hit)
  {"op": "run", "rid"}                 the KV of everything allocated is computed
  {"op": "append", "rid", "tokens"}    output tokens appended
  {"op": "release", "rid"}             finished: free
  {"op": "lookup", "rid"}              get_computed_blocks only (pure)
  {"op": "evict_blocks", "ids"}        drop the hashes of these block ids (KV-connector hook)
  {"op": "evict_hit", "rid", "group", "index"}   evict the block at [group][index] of rid's hit
  {"op": "evict_keys", "rid", "keys"}  evict every block cached under the keys [group, index]
                                       (index into rid's block hashes), as vLLM's tests pop them

``use_eagle``: True for vLLM's ``KVCacheManager(use_eagle=True)`` (EAGLE scenarios only).
"""

from __future__ import annotations

import random
from typing import Any

Op = dict[str, Any]


def _ids(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def scenario_4_5(retention: int | None, evict: list[int] | None) -> dict[str, Any]:
    """vLLM's ``test_prefill_hybrid_model``: full + 2 x SWA(32), bs 16, 21 blocks. req0 55
    tokens; req1 = its first 48 + 5 new. With ``evict``: req0 finished, these ids evicted,
    then a lookup of req1 (scenario 5)."""
    common = _ids(48, 1)
    ops: list[Op] = [
        {"op": "new", "rid": "r0", "prompt": common + _ids(7, 1000)},
        {"op": "alloc", "rid": "r0", "n": None},
        {"op": "run", "rid": "r0"},
    ]
    req1 = {"op": "new", "rid": "r1", "prompt": common + _ids(5, 2000)}
    if evict is None:
        ops += [
            req1,
            {"op": "alloc", "rid": "r1", "n": None},
            {"op": "run", "rid": "r1"},
            {"op": "release", "rid": "r0"},
            {"op": "release", "rid": "r1"},
        ]
    else:
        ops += [
            {"op": "release", "rid": "r0"},
            {"op": "evict_blocks", "ids": evict},
            req1,
            {"op": "lookup", "rid": "r1"},
        ]
    name = "scenario4" if evict is None else "scenario5_evict_" + "_".join(map(str, evict))
    return {
        "name": f"{name}_{'dense' if retention is None else f'ret{retention}'}",
        "block_size": 16,
        "retention": retention,
        "groups": [["full"], ["sliding_window", 32], ["sliding_window", 32]],
        "num_blocks": 21,
        "ops": ops,
    }


# Scenario 5's evictions: the ids of req0's blocks are full [1-4], SWA [5-8], [9-12].
SCENARIO_5_EVICTIONS = {
    "swa_block0": [5, 9],
    "full_block0": [1],
    "block2_all": [3, 7, 11],
    "full_block2": [3],
    "swa1_block2": [7],
    "full_block2_swa_block0": [3, 5, 9],
}


def scenario_7(retention: int | None) -> dict[str, Any]:
    """Free order, one full group, 11 blocks: req0 55 tokens, req1 shares 3 blocks; free both."""
    common = _ids(48, 1)
    ops: list[Op] = [
        {"op": "new", "rid": "r0", "prompt": common + _ids(7, 1000)},
        {"op": "alloc", "rid": "r0", "n": None},
        {"op": "run", "rid": "r0"},
        {"op": "new", "rid": "r1", "prompt": common + _ids(5, 2000)},
        {"op": "alloc", "rid": "r1", "n": None},
        {"op": "run", "rid": "r1"},
        {"op": "release", "rid": "r0"},
        {"op": "release", "rid": "r1"},
    ]
    return {
        "name": f"scenario7_{'dense' if retention is None else f'ret{retention}'}",
        "block_size": 16,
        "retention": retention,
        "groups": [["full"]],
        "num_blocks": 11,
        "ops": ops,
    }


def _random_ops(
    rng: random.Random, num_requests: int, prefix_len: int, block_size: int, aligned: bool = False
) -> list[Op]:
    """Requests that share prefixes, prefill in chunks, decode a little, finish in random order;
    up to three live at once (the pool is small, so later ones evict earlier ones' blocks).
    ``aligned``: every chunk is 1 or 2 blocks (Mamba "align": the scheduler ends chunks on
    block boundaries, so each boundary state is written)."""
    prefixes = [[rng.randrange(1, 500) for _ in range(prefix_len)] for _ in range(3)]
    ops: list[Op] = []
    live: list[str] = []
    for k in range(num_requests):
        rid = f"r{k}"
        prefix = rng.choice(prefixes)[: rng.randrange(block_size, prefix_len + 1)]
        prompt = prefix + [rng.randrange(500, 1000) for _ in range(rng.randrange(1, 2 * block_size))]
        ops += [{"op": "new", "rid": rid, "prompt": prompt}, {"op": "lookup", "rid": rid}]
        if aligned:
            chunk = rng.choice([block_size, 2 * block_size])
            for _ in range(-(-len(prompt) // chunk)):  # the driver skips allocs past the prompt
                ops += [{"op": "alloc", "rid": rid, "n": chunk}, {"op": "run", "rid": rid}]
        else:
            chunk = rng.choice([None, block_size, 3 * block_size // 2])
            ops += [{"op": "alloc", "rid": rid, "n": chunk}, {"op": "run", "rid": rid}]
            if chunk is not None:
                ops += [{"op": "alloc", "rid": rid, "n": None}, {"op": "run", "rid": rid}]
        for _ in range(rng.randrange(0, 3)):
            ops += [
                {"op": "append", "rid": rid, "tokens": [rng.randrange(1000, 1100)]},
                {"op": "alloc", "rid": rid, "n": 1},
                {"op": "run", "rid": rid},
            ]
        live.append(rid)
        while len(live) > rng.randrange(1, 4):
            ops.append({"op": "release", "rid": live.pop(rng.randrange(len(live)))})
    ops += [{"op": "release", "rid": rid} for rid in live]
    return ops


def random_scenario(
    name: str,
    seed: int,
    layout: list[list[Any]],
    capacity_tokens: int,
    retention: int | None,
    num_requests: int = 10,
    aligned: bool = False,
) -> dict[str, Any]:
    rng = random.Random(seed)
    block_size = 4
    return {
        "name": f"{name}_{'dense' if retention is None else f'ret{retention}'}",
        "block_size": block_size,
        "retention": retention,
        "layout": layout,
        "capacity_tokens": capacity_tokens,
        "ops": _random_ops(
            rng, num_requests, 28 if not aligned else 48, 2 * block_size if aligned else block_size, aligned
        ),
    }


def scenario_10(retention: int | None, evict: bool) -> dict[str, Any]:
    """Full + Mamba ("align"), bs 16: req0 100 tokens prefilled in block-aligned chunks (a state
    at every 16 tokens), 20 decode steps, freed; req1 = req0's prompt + 2 looked up (hit 96,
    [null x 5, state]); with ``evict``, the hit's Mamba state block is evicted first."""
    prompt = _ids(100, 1)
    ops: list[Op] = [{"op": "new", "rid": "r0", "prompt": prompt}]
    for _ in range(7):
        ops += [{"op": "alloc", "rid": "r0", "n": 16}, {"op": "run", "rid": "r0"}]
    for t in range(20):
        ops += [
            {"op": "append", "rid": "r0", "tokens": [3000 + t]},
            {"op": "alloc", "rid": "r0", "n": 1},
            {"op": "run", "rid": "r0"},
        ]
    ops += [{"op": "release", "rid": "r0"}, {"op": "new", "rid": "r1", "prompt": prompt + [7, 8]}]
    if evict:
        ops.append({"op": "evict_hit", "rid": "r1", "group": 1, "index": -1})
    ops += [
        {"op": "lookup", "rid": "r1"},
        {"op": "alloc", "rid": "r1", "n": None},
        {"op": "run", "rid": "r1"},
        {"op": "release", "rid": "r1"},
    ]
    name = "scenario10" + ("_evict_state" if evict else "")
    return {
        "name": f"{name}_{'dense' if retention is None else f'ret{retention}'}",
        "block_size": 16,
        "retention": retention,
        "groups": [["full"], ["mamba", 8]],
        "num_blocks": 40,
        "ops": ops,
    }


def scenario_11() -> dict[str, Any]:
    """The block floor (vLLM #40696): mamba-hybrid (3 x Mamba(528) + full) raises the block to
    528. A 480-token shared prefix hits 0; a repeated 552-token prompt (prefilled 528 + 24, as
    align mode chunks it) hits 528."""
    shared = _ids(480, 1)
    long = _ids(552, 5000)
    ops: list[Op] = []
    for rid, prompt in (("a", shared + _ids(100, 1000)), ("b", shared + _ids(100, 2000)), ("c", long)):
        ops += [
            {"op": "new", "rid": rid, "prompt": prompt},
            {"op": "alloc", "rid": rid, "n": 528},
            {"op": "run", "rid": rid},
            {"op": "alloc", "rid": rid, "n": None},
            {"op": "run", "rid": rid},
            {"op": "release", "rid": rid},
        ]
    ops += [{"op": "new", "rid": "c2", "prompt": long}, {"op": "lookup", "rid": "c2"}]
    return {
        "name": "scenario11_block_floor_ret0",
        "block_size": 16,
        "retention": 0,
        "layout": [["mamba", 528]] * 3 + [["full"]],
        "capacity_tokens": 528 * 8,
        "ops": ops,
    }


# Small-window stand-ins for the presets (same shapes, windows a few blocks long).
GEMMA3_SMALL = [["sliding_window", 12]] * 5 + [["full"]]
GPT_OSS_SMALL = [["sliding_window", 8], ["full"]]
MIXED_WINDOWS = [["sliding_window", 6], ["full"], ["sliding_window", 13], ["full"]]
MAMBA_SMALL = [["mamba", 8], ["full"], ["mamba", 8], ["sliding_window", 12]]  # block 4 -> 8


def all_scenarios() -> list[dict[str, Any]]:
    out = []
    for retention in (None, 0):
        out.append(scenario_4_5(retention, None))
        out += [scenario_4_5(retention, ids) for ids in SCENARIO_5_EVICTIONS.values()]
        out.append(scenario_7(retention))
        out.append(random_scenario("random_gemma3", 1, GEMMA3_SMALL, 40, retention))
        out.append(random_scenario("random_gptoss", 2, GPT_OSS_SMALL, 60, retention))
        out.append(random_scenario("random_mixed", 3, MIXED_WINDOWS, 48, retention))
    for retention in (None, 0):
        out.append(scenario_10(retention, False))
        out.append(scenario_10(retention, True))
        out.append(
            random_scenario("random_mamba", 4, MAMBA_SMALL, 64, retention, num_requests=12, aligned=True)
        )
    out.append(scenario_11())
    # --prefix-match-unit below the block size (hashes per unit, blocks keyed by their last
    # unit's hash; hits stay block-aligned: no Mamba group).
    for scenario, unit in (
        (scenario_4_5(None, None), 8),
        (random_scenario("random_gptoss", 2, GPT_OSS_SMALL, 60, 0), 2),
    ):
        out.append({**scenario, "name": f"{scenario['name']}_unit{unit}", "prefix_match_unit": unit})
    # A positive interval: one window tail per 8 (gpt-oss) / 16 (gemma3) tokens besides the boundaries.
    out.append(random_scenario("random_gptoss", 2, GPT_OSS_SMALL, 60, 8))
    out.append(random_scenario("random_gemma3", 1, GEMMA3_SMALL, 40, 16))
    return out


# ---------------------------------------------------------------- EAGLE (use_eagle=True)
# vLLM 0.33 ``KVCacheManager(use_eagle=True)``: the block drop, which the engine uses for
# EAGLE/EAGLE3/MTP when lookahead block hashes are off (``disable_lookahead_block_hashes`` or a
# KV connector). Recorded under tests/fixtures/upstream/hybrid/eagle/.


def _eagle_name(name: str, retention: int | None) -> str:
    return f"{name}_{'dense' if retention is None else f'ret{retention}'}"


def scenario_6(retention: int | None, evict: list[list[int]] | None = None, tag: str = "") -> dict[str, Any]:
    """vLLM's ``test_prefill_hybrid_model_eagle``: full + 2 x SWA(48), bs 16, 31 blocks, EAGLE.
    req0 = 6 blocks + 7 tokens, req1 = the same 6 blocks + 5 (hit 80: one block dropped per
    group). With ``evict`` ([group, block index of the request's hashes] keys): both freed,
    every block under those keys evicted, then a third request like req1 looked up."""
    common = [i for i in range(6) for _ in range(16)]
    ops: list[Op] = [
        {"op": "new", "rid": "r0", "prompt": common + [6] * 7},
        {"op": "alloc", "rid": "r0", "n": None},
        {"op": "run", "rid": "r0"},
        {"op": "new", "rid": "r1", "prompt": common + [6] * 5},
        {"op": "alloc", "rid": "r1", "n": None},
        {"op": "run", "rid": "r1"},
        {"op": "release", "rid": "r0"},
        {"op": "release", "rid": "r1"},
    ]
    if evict is not None:
        ops += [
            {"op": "new", "rid": "r2", "prompt": common + [6] * 5},
            {"op": "evict_keys", "rid": "r2", "keys": evict},
            {"op": "lookup", "rid": "r2"},
            {"op": "alloc", "rid": "r2", "n": None},
            {"op": "run", "rid": "r2"},
            {"op": "release", "rid": "r2"},
        ]
    name = "scenario6" if evict is None else f"scenario6_evict_{tag}"
    return {
        "name": _eagle_name(name, retention),
        "block_size": 16,
        "retention": retention,
        "use_eagle": True,
        "groups": [["full"], ["sliding_window", 48], ["sliding_window", 48]],
        "num_blocks": 31,
        "ops": ops,
    }


# Scenario 6's evictions, as vLLM's test names them: [group, index into block_hashes].
SCENARIO_6_EVICTIONS = {
    "swa_block0": [[1, 0], [2, 0]],
    "full_block0": [[0, 0]],
    "last_all": [[0, -1], [1, -1], [2, -1]],
    "full_last": [[0, -1]],
    "swa1_second_last": [[1, -2]],
    "swa2_second_last": [[2, -2]],
    "full_last_swa_first": [[0, -1], [1, 0], [2, 0]],
}


def eagle_dense_lengths(retention: int | None) -> dict[str, Any]:
    """One full-attention group (a plain model), EAGLE: r0 = 4 blocks exactly, decoded 20
    tokens (its blocks are cached as they fill), freed; then lookups + admissions of prompts
    of k*B - 1, k*B, k*B + 1 ... tokens of r0's sequence (vLLM 0.33's unitary hit:
    floor((n - 1) / B) blocks, less one)."""
    B = 16
    seq = _ids(4 * B + 20, 1)
    ops: list[Op] = [
        {"op": "new", "rid": "r0", "prompt": seq[: 4 * B]},
        {"op": "alloc", "rid": "r0", "n": None},
        {"op": "run", "rid": "r0"},
    ]
    for t in seq[4 * B :]:
        ops += [
            {"op": "append", "rid": "r0", "tokens": [t]},
            {"op": "alloc", "rid": "r0", "n": 1},
            {"op": "run", "rid": "r0"},
        ]
    ops.append({"op": "release", "rid": "r0"})
    for k, n in enumerate((B - 1, B, B + 1, 2 * B, 2 * B + 1, 4 * B - 1, 4 * B, 4 * B + 1, 5 * B, 5 * B + 1)):
        rid = f"q{k}"
        ops += [
            {"op": "new", "rid": rid, "prompt": seq[:n]},
            {"op": "lookup", "rid": rid},
            {"op": "alloc", "rid": rid, "n": None},
            {"op": "run", "rid": rid},
            {"op": "release", "rid": rid},
        ]
    return {
        "name": _eagle_name("scenario6_dense_lengths", retention),
        "block_size": B,
        "retention": retention,
        "use_eagle": True,
        "groups": [["full"]],
        "num_blocks": 24,
        "ops": ops,
    }


def eagle_random(name: str, scenario: dict[str, Any]) -> dict[str, Any]:
    return {**scenario, "name": f"{name}_{scenario['name'].rsplit('_', 1)[1]}", "use_eagle": True}


def eagle_random_dense(seed: int, retention: int | None) -> dict[str, Any]:
    """Random traffic on one full-attention group (explicit groups), EAGLE."""
    rng = random.Random(seed)
    return {
        "name": _eagle_name("random_eagle_plain", retention),
        "block_size": 4,
        "retention": retention,
        "use_eagle": True,
        "groups": [["full"]],
        "num_blocks": 30,
        "ops": _random_ops(rng, 12, 28, 4),
    }


def eagle_fixed_point(evict: list[list[int]], tag: str) -> dict[str, Any]:
    """The fixed point's EAGLE bookkeeping (vLLM issue #32802): full + SWA(8) + SWA(16), bs 4,
    three spec groups (no "simple hybrid" shortcut). r0's 50 tokens cached densely, freed; some
    window blocks evicted; the same prompt looked up. ``once_per_length``: a group whose drop
    held at a length does not drop again when another group's drop shrinks it (28, not 24);
    ``redrop_after_shrink``: a shrink without a drop makes every group drop again (16, not 20)."""
    seq = _ids(50, 1)
    return {
        "name": f"fixed_point_{tag}_dense",
        "block_size": 4,
        "retention": None,
        "use_eagle": True,
        "groups": [["full"], ["sliding_window", 8], ["sliding_window", 16]],
        "num_blocks": 60,
        "ops": [
            {"op": "new", "rid": "r0", "prompt": seq},
            {"op": "alloc", "rid": "r0", "n": None},
            {"op": "run", "rid": "r0"},
            {"op": "release", "rid": "r0"},
            {"op": "new", "rid": "r2", "prompt": seq},
            {"op": "evict_keys", "rid": "r2", "keys": evict},
            {"op": "lookup", "rid": "r2"},
            {"op": "alloc", "rid": "r2", "n": None},
            {"op": "run", "rid": "r2"},
            {"op": "release", "rid": "r2"},
        ],
    }


def eagle_scenarios() -> list[dict[str, Any]]:
    # One full-attention group ignores retention: recorded at the engine default (0) only.
    out = [eagle_dense_lengths(0), eagle_random_dense(11, 0)]
    out.append(eagle_fixed_point([[1, 7], [2, 8]], "once_per_length"))
    out.append(eagle_fixed_point([[1, 5], [2, 8]], "redrop_after_shrink"))
    for retention in (None, 0):
        out.append(scenario_6(retention))
        out += [scenario_6(retention, keys, tag) for tag, keys in SCENARIO_6_EVICTIONS.items()]
        out.append(eagle_random("random_eagle_gptoss", random_scenario("x", 2, GPT_OSS_SMALL, 60, retention)))
        out.append(eagle_random("random_eagle_gemma3", random_scenario("x", 1, GEMMA3_SMALL, 40, retention)))
        out.append(eagle_random("random_eagle_mixed", random_scenario("x", 3, MIXED_WINDOWS, 48, retention)))
    # Positive intervals (segment tails shifted by the EAGLE peek): gpt-oss-like at 8 (a tail
    # covers every block), mixed windows at 16 and Gemma-3-like at 32 (sparse tails).
    out.append(eagle_random("random_eagle_gptoss", random_scenario("x", 2, GPT_OSS_SMALL, 60, 8)))
    out.append(eagle_random("random_eagle_mixed", random_scenario("x", 3, MIXED_WINDOWS, 48, 16)))
    out.append(eagle_random("random_eagle_gemma3", random_scenario("x", 1, GEMMA3_SMALL, 40, 32)))
    # Not recorded: --prefix-match-unit below the block size. vLLM 0.33 then registers the
    # prompt's tail block under a partial (sub-block) hash (FullAttentionManager.
    # _cache_partial_tail_block; with EAGLE up to the whole prompt), which our backend does not
    # model: it refuses use_eagle with such a unit.
    return out


# Scenario 1 (vLLM ``test_sliding_window_possible_cached_prefix``): window 4, bs 2; which
# blocks are cached (T) -> hit length and leading nulls.
SCENARIO_1_PATTERNS = ["TTFTFFTTFTTT", "TTFTFFTTFFF", "TTFTFFTTFFFT", "T", "TF", "TTF", "FFFF", "FTTF"]

# Scenario 8: grouping of layer lists (kind, window, count) in model order.
SCENARIO_8_LAYOUTS = {
    "gemma3_27b": ([["sliding_window", 1024]] * 5 + [["full"]]) * 10 + [["sliding_window", 1024]] * 2,
    "gemma3_unit": [["sliding_window", 1024]] * 5 + [["full"]],
    "gpt_oss_12_12": [["sliding_window", 128], ["full"]] * 12,
    "gpt_oss_eagle_12_13": [["sliding_window", 128], ["full"]] * 12 + [["full"]],
    "mixed_windows": [["sliding_window", 64], ["full"], ["sliding_window", 128], ["full"]] * 2,
    "dense4": [["full"]] * 4,
}

# Scenario 9: (block sizes of the groups, prefix_match_unit) -> (scheduler, hash) block sizes.
SCENARIO_9_CASES = [
    ([16, 32], None),
    ([16], None),
    ([16], 8),
    ([16, 32], 8),
    ([16, 32], 12),
    ([32, 48], None),
    ([16, 16], 4),
]
