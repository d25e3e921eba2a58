"""vLLM's ``scheduler_reserve_full_isl`` as an engine option (issue 33).

vLLM 0.33.0 ``v1/core/sched/scheduler.py`` ``Scheduler.schedule`` admits a waiting request with
``allocate_slots(..., full_sequence_must_fit=self.scheduler_reserve_full_isl)`` (default True,
``config/scheduler.py``); ``v1/core/kv_cache_manager.py`` ``KVCacheManager.allocate_slots`` then
returns None unless ``get_num_blocks_to_allocate(num_tokens=min(request.num_tokens,
max_model_len), ..., apply_admission_cap=True)`` plus the watermark (0 by default) fits in the
free blocks, whatever the first chunk needs. The numbers below are the pinned code's: 10 blocks
of 16 (9 usable), C (48 tokens) cached and freed, A (64) running, B = C + 52 tokens: hit 48,
5 free blocks, 7 needed for B's whole 100 tokens (4 new + C's 3 free cached blocks it touches),
so allocate_slots(B, 16, full_sequence_must_fit=True) is None and without the gate it is not.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixcache import CacheConfig, Engine, Request, make_cache
from prefixcache.interface import PrefixCache

C_PROMPT = list(range(1, 49))


def _cache() -> PrefixCache[Any]:
    return make_cache("hashchain", CacheConfig(10 * 16, 16))


def test_whole_sequence_fits_counts_blocks_as_vllm() -> None:
    cache = _cache()
    c = Request("C", C_PROMPT)
    assert cache.allocate(c, 48, cache.lookup(c))
    c.num_computed_tokens = 48
    cache.commit(c)
    cache.release(c)
    a = Request("A", list(range(1000, 1064)))
    assert cache.allocate(a, 64, cache.lookup(a))
    b = Request("B", C_PROMPT + list(range(2000, 2052)))
    m = cache.lookup(b)
    usage = cache.usage()
    assert m.tokens == 48 and usage.free + usage.evictable == 5  # vLLM's free blocks: 2 + C's 3
    assert not cache.whole_sequence_fits(b, m)
    assert cache.allocate(b, 16, m)  # the first chunk alone fits


@pytest.mark.parametrize("reserve_full_isl", [False, True])
def test_a_request_whose_whole_sequence_does_not_fit_waits_only_with_the_gate(reserve_full_isl: bool) -> None:
    cache = _cache()
    engine = Engine(cache, "fcfs", token_budget=80, scheduler_reserve_full_isl=reserve_full_isl)
    engine.add_request(Request("C", C_PROMPT, max_new_tokens=1))
    engine.step()  # C computes its prompt, emits its one token and is released: 3 cached blocks
    assert not engine.running and cache.usage().evictable == 3
    engine.add_request(Request("A", list(range(1000, 1064)), max_new_tokens=4))
    engine.add_request(Request("B", C_PROMPT + list(range(2000, 2052)), max_new_tokens=1))
    engine.step()  # A takes 64 tokens (4 blocks), B's first chunk would be 16 after its 48-token hit
    records = engine.records
    assert records["A"].admission_step == 1
    if reserve_full_isl:
        assert records["B"].admission_step is None  # 7 blocks for its 100 tokens, 5 free
        engine.run()
        assert records["B"].admission_step > 1
    else:
        assert records["B"].admission_step == 1 and records["B"].hit_tokens == 48


def test_the_gate_refuses_a_backend_that_does_not_model_it() -> None:
    cache = make_cache("radix", CacheConfig(10 * 16, 16))
    engine = Engine(cache, "fcfs", token_budget=80, scheduler_reserve_full_isl=True)
    engine.add_request(Request("A", list(range(64))))
    with pytest.raises(NotImplementedError, match="whole-sequence admission gate"):
        engine.step()
