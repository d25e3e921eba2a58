"""Cached versus recomputed logits in model mode: how far apart, and why.

A request whose prompt shares a prefix with an earlier one is served twice:

* **cached**: through a caching backend, after the earlier request left its KV there; the hit's
  KV is read back and only the rest of the prompt is computed, in prefill chunks;
* **recomputed**: through the "none" backend, the whole prompt in one step.

Both use the same weights. The KV of the shared prefix was computed in other steps (other
shapes) in the two runs, and the new tokens' attention runs in other launches, so in the
default mode the two logit vectors can differ, by reduction order alone; in batch-invariant
mode (``Model(batch_invariant=True)``) they must be equal bit for bit. Two ablations make one
of the model's two parts invariant and leave the other as it is, to say which part the default
mode's differences come from.
"""

from __future__ import annotations

import os

# The model runs on CPU tensors, so the kernel needs Triton's interpreter, which must be on
# before the kernel module is first imported (triton.jit decides at decoration).
os.environ.setdefault("TRITON_INTERPRET", "1")

import random  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import torch  # noqa: E402

from prefixcache import CacheConfig, PrefixCache, Request, make_cache  # noqa: E402
from prefixcache.model import Model, ModelConfig, SeqChunk, StepBatch  # noqa: E402

# A tiny decoder: the interpreter runs each attention program op by op in numpy, at a fixed
# cost per program, so one KV head (one program per query block) halves the time of two.
TINY_MODEL = ModelConfig(vocab_size=512, n_layers=2, dim=64, n_heads=4, n_kv_heads=1, intermediate_size=172)
CAPACITY_TOKENS = 512
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (backend, page size) pairs where each applies: vLLM's 16-token blocks, SGLang's page 1 and 16.
CACHES = [("hashchain", 16), ("radix", 1), ("radix", 16)]
WHOLE = 0  # chunk size meaning "the whole rest of the prompt in one step"
# How much of the model is batch-invariant: none of it, all of it, or one of its two parts.
MODES = ("default", "batch-invariant", "invariant-ops", "invariant-attention")


class Divergence(NamedTuple):
    """How the cached logits differ from the recomputed ones at the prompt's last token."""

    hit_tokens: int  # prompt tokens the cached run read back from the cache
    max_abs_diff: float  # max over the vocabulary of |cached - recomputed| (fp32 logits)
    bit_identical: bool  # torch.equal of the two logit vectors
    top1_agrees: bool  # the same argmax token
    top1_logprob_diff: float  # |log p(t) cached - log p(t) recomputed|, t the recomputed argmax


class PartlyInvariantModel(Model):
    """Ablation: batch invariance for one part of the model only. ``invariant_ops``: the
    per-token ops one token at a time, attention in the kernel's default tiles; otherwise the
    per-token ops batched, attention in the kernel's fixed tiles."""

    def __init__(self, *args: Any, invariant_ops: bool, **kwargs: Any) -> None:
        super().__init__(*args, batch_invariant=invariant_ops, **kwargs)

    def _batch(self, chunks: list[SeqChunk]) -> tuple[torch.Tensor, StepBatch]:
        token_ids, batch = super()._batch(chunks)
        return token_ids, batch._replace(invariant_attention=not batch.invariant_ops)


def fresh_model(page_size: int, num_pages: int, dtype: torch.dtype, mode: str,
                config: ModelConfig = TINY_MODEL, seed: int = 0) -> Model:
    """The model of ``mode`` (one of MODES) with seeded weights and NaN pools: reading a page
    nobody wrote poisons the logits."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode in ("default", "batch-invariant"):
        model = Model(config, num_pages, page_size, dtype=dtype, seed=seed,
                      batch_invariant=mode == "batch-invariant")
    else:
        model = PartlyInvariantModel(config, num_pages, page_size, dtype=dtype, seed=seed,
                                     invariant_ops=mode == "invariant-ops")
    for k_cache, v_cache in zip(model.k_caches, model.v_caches, strict=True):
        k_cache.fill_(float("nan"))
        v_cache.fill_(float("nan"))
    return model


def prefill(
    model: Model, cache: PrefixCache, req: Request, chunks: Sequence[int] = ()
) -> tuple[int, torch.Tensor]:
    """Run ``req``'s prompt through cache and model as the engine would: look up, then compute
    the rest in steps of ``chunks[0]``, ``chunks[1]``, ... tokens (each clipped to what is
    left), then whatever remains in one last step, committing after each. Returns (hit
    tokens, the fp32 logits [vocab] at the last prompt token)."""
    if any(c < 1 for c in chunks):
        raise ValueError(f"chunk sizes must be >= 1, got {list(chunks)}")
    match = cache.lookup(req)
    hit = done = match.tokens
    if hit >= req.num_tokens:
        raise ValueError(f"{req.request_id}: the whole prompt hit; nothing left to compute logits from")
    step_index = 0
    while done < req.num_tokens:
        left = req.num_tokens - done
        n = min(chunks[step_index], left) if step_index < len(chunks) else left
        admitted = cache.allocate(req, n, match) if step_index == 0 else cache.allocate(req, n)
        if not admitted:
            raise RuntimeError(f"{req.request_id}: no room for {n} more tokens in an idle cache")
        assert req.num_computed_tokens == done
        # [0, done) reused or computed in earlier steps; [done, done + n) computed now
        step = SeqChunk(req.all_token_ids[done : done + n], done, cache.page_table(req))
        logits = model.step([step])[0]  # [vocab]
        req.num_computed_tokens = done = done + n
        cache.commit(req)
        step_index += 1
    return hit, logits


def fixed_chunks(size: int, num_tokens: int) -> list[int]:
    """Steps of ``size`` tokens covering ``num_tokens`` (an engine's prefill chunk size);
    WHOLE: one step."""
    return [] if size == WHOLE else [size] * -(-num_tokens // size)


def cached_logits(backend: str, page_size: int, first: Sequence[int], prompt: Sequence[int],
                  dtype: torch.dtype, mode: str, first_chunks: Sequence[int] = (),
                  chunks: Sequence[int] = ()) -> tuple[int, torch.Tensor]:
    """(hit, logits) of ``prompt`` served by ``backend`` (prefilled in ``chunks``) right after
    ``first`` (prefilled in ``first_chunks``) left its KV in the cache."""
    config = CacheConfig(CAPACITY_TOKENS, page_size)
    cache = make_cache(backend, config)
    model = fresh_model(page_size, config.num_pages, dtype, mode)
    earlier = Request("first", list(first))
    prefill(model, cache, earlier, first_chunks)
    cache.release(earlier)
    req = Request("second", list(prompt))
    hit, logits = prefill(model, cache, req, chunks)
    cache.release(req)
    cache.check_invariants()
    return hit, logits


def recomputed_logits(page_size: int, prompt: Sequence[int], dtype: torch.dtype, mode: str) -> torch.Tensor:
    """Logits of ``prompt`` with no cache at all: the whole prompt in one step."""
    config = CacheConfig(CAPACITY_TOKENS, page_size)
    model = fresh_model(page_size, config.num_pages, dtype, mode)
    return prefill(model, make_cache("none", config), Request("recompute", list(prompt)))[1]


def compare(hit: int, cached: torch.Tensor, recomputed: torch.Tensor) -> Divergence:
    """The divergence of two fp32 logit vectors [vocab]."""
    if not (torch.isfinite(cached).all() and torch.isfinite(recomputed).all()):
        raise RuntimeError("non-finite logits: the model read a KV slot nobody wrote")
    top = int(recomputed.argmax())
    logprob_cached = torch.log_softmax(cached.double(), -1)[top]
    logprob_recomputed = torch.log_softmax(recomputed.double(), -1)[top]
    return Divergence(
        hit_tokens=hit,
        max_abs_diff=float((cached - recomputed).abs().max()),
        bit_identical=bool(torch.equal(cached, recomputed)),
        top1_agrees=int(cached.argmax()) == top,
        top1_logprob_diff=float((logprob_cached - logprob_recomputed).abs()),
    )


class PromptPair(NamedTuple):
    """An earlier prompt and a later one that shares exactly its first ``shared`` tokens."""

    first: list[int]
    second: list[int]
    shared: int


def prompt_pair(seed: int, min_len: int, max_len: int, min_shared: int = 1,
                vocab: int = TINY_MODEL.vocab_size) -> PromptPair:
    """Random prompts of ``min_len``-``max_len`` tokens that share a random prefix of
    ``min_shared`` or more tokens and differ right after it (so the later one hits at most
    ``shared`` tokens, and must compute at least one)."""
    if not 1 <= min_shared < min_len <= max_len:
        raise ValueError(f"need 1 <= min_shared < min_len <= max_len, got {min_shared}, {min_len}, {max_len}")
    rng = random.Random(seed)
    second = [rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))]
    shared = rng.randint(min_shared, len(second) - 1)
    tail = [rng.randrange(vocab) for _ in range(rng.randint(1, max_len - shared))]
    tail[0] = (second[shared] + 1 + rng.randrange(vocab - 1)) % vocab  # != second[shared]
    return PromptPair(second[:shared] + tail, second, shared)


def measure(seed: int, dtype: str, mode: str, chunks: Sequence[int], min_len: int,
            max_len: int, min_shared: int) -> list[dict[str, Any]]:
    """One prompt pair (from ``seed``) through every cache of CACHES at every prefill chunk
    size (WHOLE: one step), each against the recompute at its page size: one row per run."""
    pair = prompt_pair(seed, min_len, max_len, min_shared)
    rows = []
    for page_size in sorted({p for _, p in CACHES}):
        recomputed = recomputed_logits(page_size, pair.second, DTYPES[dtype], mode)
        for backend in (b for b, p in CACHES if p == page_size):
            for chunk in chunks:
                hit, cached = cached_logits(backend, page_size, pair.first, pair.second, DTYPES[dtype],
                                            mode, fixed_chunks(chunk, len(pair.first)),
                                            fixed_chunks(chunk, len(pair.second)))
                rows.append(dict(seed=seed, dtype=dtype, mode=mode, backend=backend,
                                 page_size=page_size, chunk=chunk, prompt_tokens=len(pair.second),
                                 shared_tokens=pair.shared, **compare(hit, cached, recomputed)._asdict()))
    return rows
