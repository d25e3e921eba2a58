"""Request sequences for the radix host tier (SGLang 0.5.23 HiCache), in the scenario format of
scenarios.py plus one op, ``{"op": "step"}``: a scheduler step passes (SGLang:
``check_hicache_events``, whose ``writing_check`` acks finished write-through copies; ours:
``advance_transfers``). Each case also names its host tier: ``{"write_policy", "ratio"}``.

Scenarios 1-4 are REFERENCE-tiers.md (b); the seeded ones are multi-turn sequences over a few
shared stems with device pressure, explicit evictions and tight host pools.
"""

from __future__ import annotations

import random
from typing import Any

from prefixcache.experiments.upstream.scenarios import Scenario

Case = dict[str, Any]


def _toks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]


def _case(s: Scenario, write_policy: str = "write_through", ratio: float = 2.0) -> Case:
    sc = s.to_json()
    sc["tier"] = {"write_policy": write_policy, "ratio": ratio}
    return sc


def _serve(s: Scenario, rid: str, prompt: list[int], out: list[int] = ()) -> Scenario:
    """Prefill, decode, release as the engine does: the last sampled token gets no KV."""
    s.prefill(rid, prompt)
    if out:
        s.decode(rid, list(out[:-1])).append(rid, list(out[-1:]))
    return s.release(rid)


def _step(s: Scenario) -> Scenario:
    s.ops.append({"op": "step"})
    return s


def scenario_1() -> Case:
    a = _toks(1000, 1)
    s = Scenario("scenario1", 1101, 1)
    _step(_serve(s, "a", a, [7]))
    _step(_serve(s, "x", _toks(1000, 2), [7]))  # device pressure: a's node goes host-only
    _step(_serve(s, "b", a + _toks(10, 3)))
    return _case(s)


def scenario_2(write_policy: str) -> Case:
    a, out = _toks(1000, 1), _toks(50, 4)
    s = Scenario(f"scenario2_{write_policy}", 1201, 1)
    _step(_serve(s, "a", a, out))
    s.evict(5000)
    _step(_serve(s, "t2", a + out + _toks(20, 5)))
    return _case(s, write_policy)


def scenario_3() -> Case:
    a, tail = _toks(500, 1), _toks(8, 2)
    s = Scenario("scenario3", 1201, 1)
    _step(_serve(s, "a", a, [7]))
    _step(_serve(s, "a8", a + tail, [7]))
    s.evict(8)
    _step(_serve(s, "b", a + tail + _toks(5, 3)))
    return _case(s)


def scenario_4(evicted: bool) -> Case:
    a = _toks(1000, 1)
    s = Scenario(f"scenario4_{'host' if evicted else 'device'}", 64 * 41, 64)
    _step(_serve(s, "a", a, [7]))
    if evicted:
        s.evict(5000)
    _step(_serve(s, "b", list(a)))
    return _case(s)


def seeded(seed: int, page_size: int, write_policy: str, ratio: float, capacity: int, n: int = 24) -> Case:
    """Multi-turn traffic: prompts extend an earlier sequence (a next turn) or share a stem,
    one or two requests live at a time, chunked prefills, decodes, steps and evictions."""
    rng = random.Random(seed)
    p = page_size
    stems = [_toks(rng.randrange(2, 12) * p, seed * 100 + i) for i in range(3)]
    history: list[list[int]] = []
    s = Scenario(f"seeded{seed}_p{p}_{write_policy}_r{ratio}", capacity, p, systems=("sglang",))
    live: list[str] = []
    for i in range(n):
        rid = f"q{i}"
        if history and rng.random() < 0.5 and max(map(len, history)) < capacity // 4:
            prompt = list(rng.choice([h for h in history if len(h) < capacity // 4])) + [
                rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 3 * p + 2))
            ]
        else:
            stem = rng.choice(stems)
            prompt = stem[: rng.randrange(1, len(stem) + 1)] + [
                rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 2 * p + 2))
            ]
        s.new(rid, prompt)
        if rng.random() < 0.25 and len(prompt) > 2 * p:
            s.alloc(rid, p).run(rid).alloc(rid).run(rid)  # chunked prefill
        else:
            s.alloc(rid).run(rid)
        out = [rng.randrange(30_000, 31_000) for _ in range(rng.randrange(1, 2 * p + 3))]
        s.decode(rid, out[:-1]).append(rid, out[-1:])  # the last sampled token has no KV
        history.append(prompt + out)
        live.append(rid)
        while len(live) > 1 or (live and rng.random() < 0.5):
            s.release(live.pop(rng.randrange(len(live))))
        if rng.random() < 0.7:
            _step(s)
        if rng.random() < 0.2:
            s.evict(rng.randrange(1, 6) * p * 4)
    for rid in live:
        s.release(rid)
    _step(s)
    return _case(s, write_policy, ratio)


def all_cases() -> list[Case]:
    cases = [
        scenario_1(),
        scenario_2("write_through"),
        scenario_2("write_through_selective"),
        scenario_2("write_back"),
        scenario_3(),
        scenario_4(False),
        scenario_4(True),
    ]
    seed = 1
    for p, capacity in ((1, 160), (4, 320)):
        for write_policy in ("write_through", "write_through_selective", "write_back"):
            for ratio in (2.0, 0.5):
                cases.append(seeded(seed, p, write_policy, ratio, capacity))
                seed += 1
    return cases
