"""The GPU roofline clock (prefixcache/roofline.py): its counts against hand-computed ones for
Llama-3-8B, its times on H100 and H200, and the engine charging it each step's context."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from prefixcache import CacheConfig, Engine, Request, make_cache
from prefixcache.cost_model import CostModel, clock_from_constants, named_clock
from prefixcache.roofline import H100_SXM, H200_SXM, LLAMA3_8B, RooflineClock, _decode_attention_s

# Llama-3-8B by hand (meta-llama/Meta-Llama-3-8B config.json): d = 4096, 32 layers, 32 query
# heads and 8 KV heads of 128, MLP 14336, vocabulary 128256.
#   per layer: q 4096*4096 + k, v 2*4096*1024 + o 4096*4096 + gate, up, down 3*4096*14336
#            = 16,777,216 + 8,388,608 + 16,777,216 + 176,160,768 = 218,103,808
LINEAR_PARAMS = 32 * 218_103_808  # 6,979,321,856
LM_HEAD_PARAMS = 4096 * 128_256  # 525,336,576
KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # 131,072: K and V, every layer, bf16
FLOPS_PER_PAIR = 4 * 32 * 32 * 128  # 524,288: QK^T and PV, every layer and query head


def test_llama3_8b_shape_by_hand() -> None:
    m = LLAMA3_8B
    assert (m.linear_params, m.lm_head_params) == (LINEAR_PARAMS, LM_HEAD_PARAMS)
    assert (LINEAR_PARAMS, LM_HEAD_PARAMS) == (6_979_321_856, 525_336_576)
    assert m.kv_bytes_per_token == KV_BYTES_PER_TOKEN == 131_072
    assert m.attention_flops_per_pair == FLOPS_PER_PAIR
    # Hugging Face's count for the checkpoint, 8,030,261,248, is these plus the input embedding
    # (as large as lm_head) and 65 RMSNorm weight vectors (two a layer and the final one).
    assert m.linear_params + 2 * m.lm_head_params + 65 * 4096 == 8_030_261_248


def test_one_prefill_step_by_hand() -> None:
    """1,000 tokens of one request after 3,000 cached ones."""
    clock = RooflineClock(H100_SXM, LLAMA3_8B)
    pairs = 1000 * 3000 + 1000 * 1001 // 2  # 3,500,500
    w = clock.work(tokens=1000, sequences=1, attention_pairs=pairs, context_tokens=3000)
    assert w.linear_flops == 2 * 6_979_321_856 * 1000 + 2 * 525_336_576 == 13_959_694_385_152
    assert w.weight_bytes == 2 * (6_979_321_856 + 525_336_576) == 15_009_316_864
    assert w.attention_flops == 524_288 * 3_500_500 == 1_835_270_144_000
    assert w.kv_bytes == 131_072 * (3000 + 2 * 1000) == 655_360_000
    peak = 989.5e12  # H100 SXM: 1,979 TFLOPS with sparsity, halved
    # compute-bound both ways: 14.108 ms of projections, 1.855 ms of attention, 4 ms overhead
    expected = 0.004 + 13_959_694_385_152 / peak + 1_835_270_144_000 / peak
    assert clock.step_time(1000, 0, 1, pairs, 3000) == pytest.approx(expected, rel=1e-12)
    assert clock.step_time(1000, 0, 1, pairs, 3000) == pytest.approx(0.019963, abs=1e-6)


def test_one_decode_step_by_hand() -> None:
    """64 requests decoding one token each after 2,000 tokens of context."""
    clock = RooflineClock(H200_SXM, LLAMA3_8B)
    pairs, context = 64 * 2001, 64 * 2000
    w = clock.work(tokens=64, sequences=64, attention_pairs=pairs, context_tokens=context)
    assert w.linear_flops == 2 * 6_979_321_856 * 64 + 2 * 525_336_576 * 64 == 960_596_279_296
    assert w.kv_bytes == 131_072 * (128_000 + 128) == 16_793_993_216
    assert w.attention_flops == 524_288 * 128_064
    bw = 4.8e12  # H200 SXM's HBM3e
    # memory-bound both ways: the weights (3.127 ms) and 64 contexts' KV (3.499 ms)
    expected = 0.004 + 15_009_316_864 / bw + 16_793_993_216 / bw
    assert clock.step_time(0, 64, 64, pairs, context) == pytest.approx(expected, rel=1e-12)
    assert clock.step_time(0, 64, 64, pairs, context) == pytest.approx(0.010626, abs=1e-6)
    # H100's 3.35 TB/s against H200's 4.8: the same memory-bound step is 4.8/3.35 slower there
    h100 = RooflineClock(H100_SXM, LLAMA3_8B)
    bound = h100.step_time(0, 64, 64, pairs, context) - 0.004
    assert bound == pytest.approx((expected - 0.004) * 4.8 / 3.35, rel=1e-12)


def test_the_stated_parameters_move_only_their_term() -> None:
    base = RooflineClock(H100_SXM, LLAMA3_8B)
    slow_gather = RooflineClock(H100_SXM, LLAMA3_8B, kv_read_efficiency=0.5)
    # a memory-bound decode: its KV term doubles, the weights' stays
    kv = base.work(8, 8, 8 * 4001, 8 * 4000).kv_bytes / H100_SXM.hbm_bytes_per_s
    assert slow_gather.step_time(0, 8, 8, 8 * 4001, 8 * 4000) - base.step_time(0, 8, 8, 8 * 4001, 8 * 4000) \
        == pytest.approx(kv, rel=1e-9)
    assert RooflineClock(H100_SXM, LLAMA3_8B, step_overhead_s=0).step_time(0, 0) == 0
    for bad in ({"kv_read_efficiency": 0}, {"kv_read_efficiency": 1.5}, {"step_overhead_s": -1.0},
                {"step_overhead_s": math.nan}):
        with pytest.raises(ValueError):
            RooflineClock(H100_SXM, LLAMA3_8B, **bad)  # type: ignore[arg-type]


def test_isolated_prefill_is_one_step_alone() -> None:
    clock = RooflineClock(H100_SXM, LLAMA3_8B)
    prompt, hit = np.array([4000, 1000, 17]), np.array([3000, 0, 16])
    got = clock.isolated_prefill_s(prompt, hit)
    for p, h, g in zip(prompt.tolist(), hit.tolist(), got.tolist(), strict=True):
        n = p - h
        assert g == pytest.approx(clock.step_time(n, 0, 1, n * h + n * (n + 1) // 2, h), rel=1e-12)


def test_clocks_by_name_and_by_their_recorded_constants() -> None:
    h100 = named_clock("h100-llama3-8b")
    assert h100 == RooflineClock(H100_SXM, LLAMA3_8B) and h100 != named_clock("h200-llama3-8b")
    assert clock_from_constants(h100.constants()) == h100
    assert named_clock("cpu") == CostModel.measured()
    assert clock_from_constants(CostModel.measured().constants()) == CostModel.measured()
    # the constants are what a cell hashes: any change of them is another cell
    assert h100.constants() != RooflineClock(H100_SXM, LLAMA3_8B, step_overhead_s=0.002).constants()
    with pytest.raises(ValueError, match=r"unknown clock .a100-llama3-8b.; valid: cpu .*h100-llama3-8b"):
        named_clock("a100-llama3-8b")
    with pytest.raises(ValueError, match="unknown roofline clock 'h100-llama2'"):
        RooflineClock.named("h100-llama2")


class _Recording(RooflineClock):
    """The roofline clock, noting what each step was charged for."""

    def __init__(self) -> None:
        super().__init__(H100_SXM, LLAMA3_8B)
        object.__setattr__(self, "calls", [])

    def step_time(self, *args: int) -> float:  # type: ignore[override]
        self.calls.append(args)  # type: ignore[attr-defined]
        return super().step_time(*args)


@pytest.mark.parametrize("multi_step", [False, True], ids=["step-by-step", "stretched"])
def test_the_engine_charges_each_steps_context(multi_step: bool) -> None:
    """One request of 100 prompt tokens, budget 64, 6 output tokens: two prefill chunks (64
    tokens after 0, 36 after 64), then decode steps after 100 to 104 tokens of context.
    The engine's clock is the sum of those steps' roofline times, whether it steps them one
    by one or takes the decode-only ones as a stretch."""
    clock = _Recording()
    cache = make_cache("radix", CacheConfig(1024, 16))
    engine = Engine(cache, "fcfs", token_budget=64, cost_model=clock, multi_step=multi_step)
    engine.run([Request("r", list(range(1, 101)), max_new_tokens=6)])
    steps = [(64, 0, 1, 64 * 65 // 2, 0), (36, 0, 1, 36 * 64 + 36 * 37 // 2, 64)]
    steps += [(0, 1, 1, c + 1, c) for c in range(100, 105)]
    expected = 0.0
    for s in steps:
        expected += RooflineClock(H100_SXM, LLAMA3_8B).step_time(*s)
    assert engine.clock == expected
    if multi_step:
        # radix takes the first decode step's slot (its room is 0 after the prefill), the last
        # one finishes: the three between are a stretch
        assert engine.stretched_steps == engine.deferred_decode_steps == 3
    else:
        assert clock.calls == steps  # type: ignore[attr-defined]


def test_saturated_request_seconds_by_hand() -> None:
    """1,000 prompt tokens and 3 output tokens (2 decode steps) in full 2,000-token steps."""
    clock, peak, bw = RooflineClock(H100_SXM, LLAMA3_8B), 989.5e12, 3.35e12
    expected = (2 * LINEAR_PARAMS * 1002 + 2 * LM_HEAD_PARAMS * 3) / peak  # projections, 3 samples
    expected += 0.004 * 1002 / 2000  # the step overhead's share
    expected += FLOPS_PER_PAIR * 500_500 / peak  # the prefill's attention: compute-bound
    expected += KV_BYTES_PER_TOKEN * (1002 + 1003) / bw  # two decodes: memory-bound
    assert clock.saturated_request_s(1000, 3, 2000) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["h100-llama3-8b", "cpu"])
def test_saturated_request_seconds_predict_the_engines_no_cache_makespan(name: str) -> None:
    """The studies' no-cache capacity (1 / saturated_request_s) against the engine itself: 256
    requests of 1,024 tokens and 16 outputs, all at t = 0, no cache, take within 5% of 256 x the
    estimate (the engine's last steps are not full)."""
    clock = named_clock(name)
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(1, 30_000, 1024).tolist(), max_new_tokens=16) for i in range(256)]
    engine = Engine(make_cache("none", CacheConfig(1 << 20, 16)), "fcfs", 2048, cost_model=clock)
    engine.run(reqs)
    estimate = clock.saturated_request_s(1024, 16, 2048)
    assert abs(engine.clock / 256 - estimate) < 0.05 * estimate


@given(st.floats(1e-9, 3.0), st.floats(1e-9, 3.0), st.integers(0, 5000), st.integers(0, 300))
def test_the_decode_attention_closed_form_is_the_sum_of_each_steps_roof(
    pair_s: float, kv_s: float, first: int, steps: int
) -> None:
    by_step = sum(max(pair_s * (c + 1), kv_s * (c + 2)) for c in range(first, first + steps))
    assert _decode_attention_s(pair_s, kv_s, first, steps) == pytest.approx(by_step, rel=1e-9)
