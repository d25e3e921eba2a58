"""Model mode: a cache hit must give the logits that recomputing the whole prompt gives.

The caching backend hands out the page tables; the model writes KV into those pages and reads
the hit's KV back through them. Against it stands the same model behind the "none" backend,
which computes every token. The pools start as NaN, so reading a page nobody wrote shows.
"""

from __future__ import annotations

import random

import pytest
import torch

from prefixcache import CacheConfig, PrefixCache, Request, available_backends, make_cache
from prefixcache.model import Model, ModelConfig, SeqChunk
from tests.helpers import tokens

pytestmark = pytest.mark.kernel

CONFIG = ModelConfig(vocab_size=512, n_layers=2, dim=64, n_heads=4, n_kv_heads=2, intermediate_size=172)
# fp32 logits of std ~1 through 2 layers: cached and recomputed KV differ only in summation order.
LOGITS_TOL = dict(atol=1e-4, rtol=1e-4)
CAPACITY_TOKENS = 256
SHARED, TAIL = 34, 9  # B shares its first 34 tokens with A, then has 9 of its own

CACHING_BACKENDS = [b for b in available_backends() if b != "none"] or [
    pytest.param("none", marks=pytest.mark.skip(reason="no caching backend is registered yet"))
]


def make_model_and_cache(backend: str, page_size: int) -> tuple[Model, PrefixCache]:
    config = CacheConfig(CAPACITY_TOKENS, page_size)
    try:
        cache = make_cache(backend, config)
    except (ImportError, AttributeError, NotImplementedError) as e:  # registered, not built yet
        pytest.skip(f"backend {backend!r} cannot be made yet: {e!r}")
    model = Model(CONFIG, config.num_pages, page_size, seed=0)
    for k_cache, v_cache in zip(model.k_caches, model.v_caches, strict=True):
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))
    return model, cache


def prefill(
    model: Model, cache: PrefixCache, req: Request, chunk: int | None = None
) -> tuple[int, torch.Tensor]:
    """Run ``req``'s prompt through cache and model as the engine would; (hit, last logits [vocab])."""
    hit = cache.lookup(req).tokens
    n = req.num_tokens - hit if chunk is None else min(chunk, req.num_tokens - hit)
    assert cache.allocate(req, n)
    assert req.num_computed_tokens == hit
    while True:
        start = req.num_computed_tokens
        # [0, start) reused or computed earlier; [start, start + n) computed now
        step = SeqChunk(req.all_token_ids[start : start + n], start, cache.page_table(req))
        logits = model.step([step])[0]  # [vocab]
        req.num_computed_tokens += n
        cache.commit(req)
        cache.check_invariants()
        if req.num_computed_tokens == req.num_tokens:
            return hit, logits
        n = min(n, req.num_tokens - req.num_computed_tokens)
        assert cache.allocate(req, n)


def recompute(prompt: list[int], page_size: int) -> torch.Tensor:
    """Logits [vocab] at the last token of ``prompt`` with no cache at all."""
    model, cache = make_model_and_cache("none", page_size)
    hit, logits = prefill(model, cache, Request("recompute", prompt))
    assert hit == 0
    return logits


@pytest.mark.parametrize("chunk", [None, 4], ids=["one-chunk", "chunked"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend", CACHING_BACKENDS)
def test_cache_hit_gives_the_logits_of_recompute(backend: str, page_size: int, chunk: int | None) -> None:
    model, cache = make_model_and_cache(backend, page_size)
    prompt_a = tokens(SHARED + 6, seed=1, vocab=CONFIG.vocab_size)
    prompt_b = prompt_a[:SHARED] + tokens(TAIL, seed=2, vocab=CONFIG.vocab_size)

    a = Request("a", prompt_a)
    prefill(model, cache, a)
    cache.release(a)
    b = Request("b", prompt_b)
    hit, logits = prefill(model, cache, b, chunk)
    cache.release(b)

    assert 0 < hit <= SHARED, f"{backend} should reuse part of the {SHARED} shared tokens, hit {hit}"
    expected = recompute(prompt_b, page_size)
    assert torch.isfinite(logits).all(), "NaN logits: the model read a page nobody wrote"
    torch.testing.assert_close(logits, expected, **LOGITS_TOL)
    # Not vacuous: another first token moves the logits far beyond the tolerance.
    other = recompute([(prompt_b[0] + 1) % CONFIG.vocab_size, *prompt_b[1:]], page_size)
    assert (other - expected).abs().max() > 100 * LOGITS_TOL["atol"]


def _shuffled_tables(lengths: list[int], page_size: int, num_pages: int, seed: int) -> list[list[int]]:
    """Non-contiguous page tables for sequences of ``lengths`` tokens, page 0 never used."""
    pages = list(range(1, num_pages))
    random.Random(seed).shuffle(pages)
    tables = []
    for n in lengths:
        need = -(-n // page_size)
        tables.append(pages[:need])
        pages = pages[need:]
    return tables


def test_pages_of_1_and_16_give_the_same_logits() -> None:
    prompts = [tokens(21, seed=3, vocab=CONFIG.vocab_size), tokens(13, seed=4, vocab=CONFIG.vocab_size)]
    new = [[7], [8, 9, 10, 11, 12]]  # then a decode step and an extend step in one batch
    totals = [len(p) + len(n) for p, n in zip(prompts, new, strict=True)]
    logits = {}
    for page_size, num_pages in ((1, 64), (16, 6)):
        model = Model(CONFIG, num_pages, page_size, seed=0)
        tables = _shuffled_tables(totals, page_size, num_pages, seed=page_size)
        first = model.step([SeqChunk(p, 0, t) for p, t in zip(prompts, tables, strict=True)])  # [2, vocab]
        second = model.step(
            [SeqChunk(n, len(p), t) for p, n, t in zip(prompts, new, tables, strict=True)]
        )  # [2, vocab]
        logits[page_size] = (first, second)
    for small, large in zip(logits[1], logits[16], strict=True):
        torch.testing.assert_close(small, large, **LOGITS_TOL)


def test_triton_and_reference_attention_give_the_same_logits() -> None:
    chunks = [SeqChunk(tokens(10, seed=5, vocab=CONFIG.vocab_size), 0, [3]), SeqChunk([1, 2, 3], 0, [5])]
    triton_logits = Model(CONFIG, 8, 16).step(chunks)  # [2, vocab]
    reference_logits = Model(CONFIG, 8, 16, attention_impl="reference").step(chunks)  # [2, vocab]
    torch.testing.assert_close(triton_logits, reference_logits, **LOGITS_TOL)


def test_half_precision_model_runs() -> None:
    model = Model(CONFIG, 8, 16, dtype=torch.bfloat16)
    logits = model.step([SeqChunk(tokens(12, seed=6, vocab=CONFIG.vocab_size), 0, [2])])  # [1, vocab]
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert model.k_caches[0].dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("field", "value"),
    [("dim", 63), ("n_kv_heads", 3), ("n_layers", 0), ("vocab_size", -1), ("norm_eps", 0.0)],
)
def test_model_config_rejects_bad_shapes(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{field: value})


@pytest.mark.parametrize(
    "chunk",
    [
        SeqChunk([1, 2, 3], 0, []),  # no page for the tokens
        SeqChunk([1], 0, [99]),  # page outside the pool
        SeqChunk([], 0, [1]),  # no new token
        SeqChunk([CONFIG.vocab_size], 0, [1]),  # token outside the vocabulary
    ],
)
def test_step_rejects_chunks_that_do_not_fit(chunk: SeqChunk) -> None:
    with pytest.raises(ValueError):
        Model(CONFIG, 8, 4).step([chunk])


def test_step_rejects_two_writes_to_one_slot() -> None:
    with pytest.raises(ValueError, match="same KV slot"):
        Model(CONFIG, 8, 4).step([SeqChunk([1, 2], 0, [3]), SeqChunk([4], 0, [3])])
