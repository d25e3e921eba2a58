"""Batch-invariant mode: a cache hit's logits are a full recompute's, bit for bit.

The later of two prompts that share a random prefix is served by a caching backend after the
earlier one left its KV there, both prefilled in random chunkings; against it stands the "none"
backend's recompute of the whole prompt in one step. With ``Model(batch_invariant=True)`` the
two logit vectors must be ``torch.equal``; in the default mode they are not always, which is
what makes the property worth testing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prefixcache.experiments.analysis.divergence import (
    CACHES,
    TINY_MODEL,
    cached_logits,
    fixed_chunks,
    prompt_pair,
    recomputed_logits,
)

from prefixcache.model import Model
from tests.strategies import token_lists

pytestmark = pytest.mark.kernel

MAX_LEN = 32
INVARIANT = "batch-invariant"  # the model mode under test (experiments/analysis/divergence.py)
# Step sizes of a chunking; after the drawn steps the rest goes in one step (so at most 4).
chunkings = st.lists(st.integers(1, 24), max_size=3)


@st.composite
def served_prompts(draw: st.DrawFn, page_size: int) -> tuple[list[int], list[int]]:
    """(earlier prompt, later prompt): they share a random prefix of at least a page (so
    that a cache of ``page_size`` pages hits) and differ right after it."""
    vocab = TINY_MODEL.vocab_size
    n = draw(st.integers(max(8, page_size + 1), MAX_LEN))
    later = draw(token_lists(vocab, n, n))
    shared = draw(st.integers(page_size, n - 1))
    tail = draw(token_lists(vocab, 1, MAX_LEN - shared))
    tail[0] = (later[shared] + 1 + draw(st.integers(0, vocab - 2))) % vocab  # != later[shared]
    return later[:shared] + tail, later


def check_cache_hit_is_recompute_bit_for_bit(
    backend: str, page_size: int, dtype: torch.dtype, prompts: tuple[list[int], list[int]],
    first_chunks: list[int], chunks: list[int],
) -> None:
    first, prompt = prompts
    hit, cached = cached_logits(backend, page_size, first, prompt, dtype, INVARIANT, first_chunks, chunks)
    assert hit >= page_size, f"{backend} p{page_size} should reuse a page of the shared prefix, hit {hit}"
    recomputed = recomputed_logits(page_size, prompt, dtype, INVARIANT)
    assert torch.isfinite(cached).all(), "NaN logits: the model read a KV slot nobody wrote"
    diff = float((cached - recomputed).abs().max())
    assert torch.equal(cached, recomputed), (
        f"{backend} p{page_size}: hit {hit} of {len(prompt)}, chunks {first_chunks} / {chunks}: "
        f"max |diff| {diff:.3g}"
    )


@pytest.mark.parametrize(("backend", "page_size"), CACHES, ids=[f"{b}-p{p}" for b, p in CACHES])
@settings(max_examples=15)
@given(data=st.data(), first_chunks=chunkings, chunks=chunkings)
def test_batch_invariant_cache_hit_is_recompute_bit_for_bit(
    backend: str, page_size: int, data: st.DataObject, first_chunks: list[int], chunks: list[int]
) -> None:
    prompts = data.draw(served_prompts(page_size))
    check_cache_hit_is_recompute_bit_for_bit(backend, page_size, torch.float32, prompts, first_chunks, chunks)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("backend", "page_size"), CACHES, ids=[f"{b}-p{p}" for b, p in CACHES])
@settings(max_examples=100)
@given(data=st.data(), first_chunks=chunkings, chunks=chunkings)
def test_batch_invariant_cache_hit_is_recompute_bit_for_bit_many(
    backend: str, page_size: int, dtype: torch.dtype, data: st.DataObject, first_chunks: list[int],
    chunks: list[int],
) -> None:
    prompts = data.draw(served_prompts(page_size))
    check_cache_hit_is_recompute_bit_for_bit(backend, page_size, dtype, prompts, first_chunks, chunks)


def test_default_mode_cache_hit_differs_from_recompute_by_rounding_only() -> None:
    """Not vacuous: without batch invariance a hit's logits differ from recompute's in the
    last bits (the linears' GEMMs and the kernel's tiles depend on the step's shape), though
    never by more than rounding."""
    differing = 0
    for seed in range(1):
        pair = prompt_pair(seed, 20, MAX_LEN, min_shared=16)
        for backend, page_size in CACHES:
            hit, cached = cached_logits(backend, page_size, pair.first, pair.second, torch.float32, "default",
                                        fixed_chunks(8, len(pair.first)), fixed_chunks(8, len(pair.second)))
            assert hit >= 16
            recomputed = recomputed_logits(page_size, pair.second, torch.float32, "default")
            torch.testing.assert_close(cached, recomputed, atol=1e-4, rtol=1e-4)
            differing += not torch.equal(cached, recomputed)
    assert differing > 0, "the default mode was bit-exact too: the invariant test proves nothing"


def test_batch_invariant_mode_needs_the_triton_kernel() -> None:
    with pytest.raises(ValueError, match="batch_invariant"):
        Model(TINY_MODEL, 8, 16, attention_impl="reference", batch_invariant=True)
