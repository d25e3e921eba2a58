"""Where the two designs must agree: hit lengths, request by request, against a brute force.

Requests run one after another (each fully computed and released before the next) in a cache
large enough that nothing is evicted, unless a test says otherwise.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from prefixcache import CacheConfig, Request, available_backends, make_cache
from tests.helpers import Checked, run_to_completion
from tests.strategies import Spec, reference_hits, request_specs

BLOCK = 4
BIG = 4096  # tokens: far more than any generated sequence needs


def replay(name: str, specs: list[Spec], *, page_size: int, capacity: int = BIG) -> list[int]:
    cache = Checked(make_cache(name, CacheConfig(capacity, page_size)))
    return [
        run_to_completion(cache, Request(f"r{i}", s.tokens, cache_salt=s.salt, lora_name=s.lora))
        for i, s in enumerate(specs)
    ]


def needs(*names: str) -> None:
    missing = [n for n in names if n not in available_backends()]
    if missing:
        pytest.skip(f"backend(s) {missing} not registered")


@given(request_specs(block=BLOCK))
@example([Spec((0, 1, 2, 0)), Spec((0, 1, 2, 0))])  # exact repeat of one full block: n-1 cap
@example([Spec((0, 1, 2, 0, 1), "s1"), Spec((0, 1, 2, 0, 1), "s2")])  # same tokens, other salt
def test_radix_page1_hit_is_min_of_lcp_and_n_minus_1(specs: list[Spec]) -> None:
    needs("radix")
    assert replay("radix", specs, page_size=1) == reference_hits(specs)


@given(request_specs(block=BLOCK))
@example([Spec((0, 1, 2, 0, 1, 2, 0, 1)), Spec((0, 1, 2, 0, 1, 2, 0, 1))])  # k blocks hit k-1
@example([Spec((0, 1, 2, 0, 1)), Spec((0, 1, 2, 1, 1))])  # divergence inside the first block
def test_hashchain_hit_is_radix_page1_hit_floored_to_blocks(specs: list[Spec]) -> None:
    needs("hashchain")
    expected = [h // BLOCK * BLOCK for h in reference_hits(specs)]
    assert replay("hashchain", specs, page_size=BLOCK) == expected


@pytest.mark.parametrize("page", [2, BLOCK])
@given(specs=request_specs(block=BLOCK))
def test_radix_paged_hit_equals_hashchain_hit_request_by_request(page: int, specs: list[Spec]) -> None:
    needs("radix", "hashchain")
    assert replay("radix", specs, page_size=page) == replay("hashchain", specs, page_size=page)


@given(request_specs(block=BLOCK, namespaces=False), st.sampled_from(["s1", "s2"]))
def test_a_namespace_never_hits_another_namespaces_entries(specs: list[Spec], salt: str) -> None:
    """Everything is cached in the default namespace, then the same prompts come salted, and
    as a LoRA whose name equals the salt: not one token may hit."""
    for name in [n for n in available_backends() if n != "none"]:
        for page in (1, BLOCK):
            cache = Checked(make_cache(name, CacheConfig(BIG, page)))
            for i, s in enumerate(specs):
                run_to_completion(cache, Request(f"plain{i}", s.tokens))
            for i, s in enumerate(specs):
                assert cache.lookup(Request(f"salt{i}", s.tokens, cache_salt=salt)).tokens == 0
            for i, s in enumerate(specs):
                run_to_completion(cache, Request(f"salted{i}", s.tokens, cache_salt=salt))
            for i, s in enumerate(specs):
                assert cache.lookup(Request(f"lora{i}", s.tokens, lora_name=salt)).tokens == 0


@given(request_specs(block=BLOCK))
def test_the_no_cache_backend_never_hits(specs: list[Spec]) -> None:
    assert replay("none", specs, page_size=BLOCK) == [0] * len(specs)


@pytest.mark.parametrize("capacity_pages", [3, 6, 12])
@given(specs=request_specs(block=BLOCK, max_requests=10))
def test_bounded_capacity_never_beats_the_unbounded_hit(capacity_pages: int, specs: list[Spec]) -> None:
    """With eviction, a backend may only lose hits, request by request; invariants hold throughout
    (Checked). Requests too large for the pool are left out."""
    fit = [s for s in specs if -(-len(s.tokens) // BLOCK) <= capacity_pages - 1]
    for name in [n for n in available_backends() if n != "none"]:
        unbounded = replay(name, fit, page_size=BLOCK)
        bounded = replay(name, fit, page_size=BLOCK, capacity=capacity_pages * BLOCK)
        assert all(b <= u for b, u in zip(bounded, unbounded, strict=True)), (name, bounded, unbounded)
