"""The engine's clock with a host tier (prefixcache.tiers.HostLink): SGLang's HiCache loads a
host hit in the same forward, layer by layer, so the admission step lasts as long as its
compute or its load, whichever ends later; vLLM's OffloadingConnector loads asynchronously,
so the request computes nothing until its load is done and starts from a later step."""

from __future__ import annotations

import pytest

from prefixcache import CacheConfig, CostModel, Engine, Request, make_cache
from prefixcache.tiers import HostLink, HostTierConfig
from tests.helpers import tokens

pytestmark = pytest.mark.filterwarnings("ignore:HiCache host pool")

COST = CostModel(step_overhead_s=0.01, prefill_token_s=1e-4, decode_token_s=1e-3)
SLOW = HostLink(bandwidth_bytes_per_s=1e9, latency_s=0.0)  # 1000 tokens of Llama-3-8B: 131 ms


def requests() -> list[Request]:
    """A, then X (other tokens) that pushes A out of the device pool, then B = A + 10."""
    a, x = tokens(1000, 1), tokens(1000, 2)
    return [Request("a", a, max_new_tokens=1, arrival_time=0.0),
            Request("x", x, max_new_tokens=1, arrival_time=1.0),
            Request("b", a + tokens(10, 3), max_new_tokens=1, arrival_time=2.0)]


def run(backend: str, page: int, **tier: object) -> Engine:
    cache = make_cache(backend, CacheConfig(1100 if page == 1 else 1120, page),
                       host_tier=HostTierConfig(**tier))  # type: ignore[arg-type]
    engine = Engine(cache, cost_model=COST, host_link=SLOW, check_invariants=True)
    engine.run(requests())
    return engine


def test_a_radix_host_hit_loads_in_the_same_forward_and_the_step_waits_for_the_load() -> None:
    e = run("radix", 1)
    b = e.records["b"]
    assert b.hit_tokens == 1000 and e.cache.stats.host_hits == 1000
    load = SLOW.transfer_time(1000)
    compute = COST.step_time(10, 0)
    assert load > compute
    assert b.first_token_time - b.admission_time == pytest.approx(load)  # one step, load-bound
    assert b.first_token_step == b.admission_step
    assert e.load_wait_s == pytest.approx(load - compute)


def test_a_model_with_a_host_tier_is_refused() -> None:
    cache = make_cache("radix", CacheConfig(1100, 1), host_tier=HostTierConfig())
    with pytest.raises(ValueError, match="model mode has no host tier"):
        Engine(cache, model=object())


def test_a_vllm_async_load_admission_reserves_only_the_hit() -> None:
    """vLLM 0.33 ``Scheduler.schedule``: a request whose external tokens load asynchronously
    is admitted with ``allocate_slots(num_new_tokens=0)``, its loaded blocks only (issue 33,
    case 1; tests/test_hashchain_fidelity_cases.py has the upstream numbers). Its chunk is
    allocated at its first step after the load."""
    cache = make_cache("hashchain", CacheConfig(1120, 16), host_tier=HostTierConfig())
    engine = Engine(cache, cost_model=COST, host_link=SLOW, check_invariants=True)
    engine.arrivals.read_from(requests())
    b = None
    while b is None or engine.records["b"].admission_step is None:
        engine.step()
        b = next((r for r in engine.running if r.request_id == "b"), b)
    hit = engine.records["b"].hit_tokens
    assert cache.stats.host_hits > 0 and "b" in engine._loading
    assert cache.reserved_tokens(b) == hit < b.num_tokens  # the hit, nothing computed past it
    while engine.has_unfinished():
        engine.step()
    assert engine.records["b"].output_tokens == 1
