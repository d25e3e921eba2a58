"""Per-request and per-run metrics, computed from the engine's RequestRecords.

Definitions (rejected requests, which never ran, are left out of every rate):

- token hit rate:   sum(hit tokens) / sum(prompt tokens)
- request hit rate: share of requests with any hit
- block hit rate:   sum(hit // B) / sum(ceil(prompt / B)), B the page size
- prefill computed: tokens whose KV was computed in prefill (recomputation after preemption
                    included); prefill saved: the hit tokens
- granularity loss: tokens an unbounded token-level cache reuses that an unbounded B-token
                    page cache cannot (each request loses its hit mod B; (B-1)/2 on average)
- TTFT:             simulated seconds from arrival to the first output token under the engine's
                    clock (queueing included); ``isolated_ttft_s`` is the no-queue estimate, the
                    missed tokens prefilled alone in one step (the clock's
                    ``isolated_prefill_s``; the CPU clock:
                    ``step_overhead_s + prefill_token_s * (prompt - hit)``).
- fraction of infinite: a hit rate over the same convention's infinite-cache hit rate.

Two block conventions for traces that come as block ids (Mooncake: one id per 512-token block,
the last one partial; an equal id means an equal prefix), named in every table and figure:

- C1 (``"C1"``, Mooncake's ids as they come): a request looks up every id of its prompt, the
  partial last block included, with no cap, and leaves every id cached. A hit on the partial
  block counts its tokens. The infinite-cache block hit rate under C1 is what
  ``traces.infinite_cache_block_hit_rate`` computes.
- C2 (``"C2"``, the engine's): a request looks up only the full blocks of its first n - 1
  tokens (the last token is always computed, as in vLLM and SGLang) and leaves its n // B full
  blocks cached; partial blocks are never cached. Both backends follow C2 at their own page size.

Under both, block hit rate = hit blocks / every block of every prompt (ceil(n / B), partial
ones included); token hit rate = hit tokens / prompt tokens; rejected requests are left out and
counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.bounds import BlockTrace, block_trace, infinite_cache_hits
from prefixcache.experiments.inputs.traces import MOONCAKE_BLOCK, TraceRecord

from prefixcache import CostModel, PrefixCache, RequestRecord
from prefixcache.cost_model import Clock


def dataclass_frame(rows: Sequence[Any]) -> pd.DataFrame:
    """A row per instance of one flat dataclass (scalar fields) and a column per field: what
    ``pd.DataFrame([dataclasses.asdict(r) for r in rows])`` gives, built a column at a time
    (``asdict`` deep-copies each field of each row: 0.2 s for a whole trace's 12k request
    records, 10x the columns' time)."""
    if not rows:
        return pd.DataFrame()
    names = [f.name for f in dataclasses.fields(rows[0])]
    return pd.DataFrame({name: list(map(attrgetter(name), rows)) for name in names})


def records_frame(records: Sequence[RequestRecord], cost_model: Clock | None = None) -> pd.DataFrame:
    """One tidy row per request, with derived columns (ttft_s, isolated_ttft_s, cache_op_us)."""
    cost = cost_model or CostModel.measured()
    df = dataclass_frame(records)
    if df.empty:
        return df
    df["ttft_s"] = df["first_token_time"] - df["arrival_time"]
    df["isolated_ttft_s"] = isolated_ttft_s(df["prompt_tokens"], df["hit_tokens"], cost)
    df["cache_op_us"] = df["cache_op_ns"] / 1e3
    return df


def isolated_ttft_s(prompt_tokens: Any, hit_tokens: Any, cost: Clock) -> Any:
    """TTFT with nothing else running: one step that prefills the missed tokens."""
    return cost.isolated_prefill_s(prompt_tokens, hit_tokens)


def token_hit_rate(records: Sequence[RequestRecord]) -> float:
    ran = _ran(records)
    prompt = sum(r.prompt_tokens for r in ran)
    return sum(r.hit_tokens for r in ran) / prompt if prompt else 0.0


def request_hit_rate(records: Sequence[RequestRecord]) -> float:
    ran = _ran(records)
    return sum(r.hit_tokens > 0 for r in ran) / len(ran) if ran else 0.0


def block_hit_rate(records: Sequence[RequestRecord], page_size: int) -> float:
    ran = _ran(records)
    return block_hit_rate_of([r.prompt_tokens for r in ran], [r.hit_tokens for r in ran], page_size)


def block_hit_rate_of(prompt_tokens: Any, hit_tokens: Any, page_size: int) -> float:
    """The block hit rate of per-request prompt and hit token counts (lists, arrays or
    columns): whole hit blocks over every block of every prompt, partial ones included."""
    prompt, hit = np.asarray(prompt_tokens, dtype=np.int64), np.asarray(hit_tokens, dtype=np.int64)
    blocks = int((-(-prompt // page_size)).sum())
    return int((hit // page_size).sum()) / blocks if blocks else 0.0


def granularity_loss(prompts: Sequence[Sequence[int]], page_size: int) -> tuple[int, float]:
    """(tokens lost, mean per request) of a ``page_size`` cache against a token-level one,
    both unbounded. ``hit - hit % B`` is exactly the page cache's hit: with equal content,
    a page cache hits every whole page of the token-level hit."""
    token_hits = infinite_cache_hits(block_trace(prompts, 1))
    lost = sum(h % page_size for h in token_hits)
    return lost, lost / len(prompts) if prompts else 0.0


def summarize(
    records: Sequence[RequestRecord],
    *,
    page_size: int,
    peak_pages_in_use: int | None = None,
    cost_model: Clock | None = None,
) -> dict[str, Any]:
    """The per-run numbers written to summary.json."""
    ran = _ran(records)
    ttft = [r.first_token_time - r.arrival_time for r in ran if r.first_token_time is not None]
    iso = isolated_ttft_s(
        [r.prompt_tokens for r in ran], [r.hit_tokens for r in ran], cost_model or CostModel.measured()
    )
    return {
        "requests": len(records),
        "rejected": len(records) - len(ran),
        "prompt_tokens": sum(r.prompt_tokens for r in ran),
        "output_tokens": sum(r.output_tokens for r in ran),
        "token_hit_rate": token_hit_rate(records),
        "request_hit_rate": request_hit_rate(records),
        "block_hit_rate": block_hit_rate(records, page_size),
        "prefill_tokens_computed": sum(r.computed_prefill_tokens for r in ran),
        "prefill_tokens_saved": sum(r.hit_tokens for r in ran),
        "evicted_tokens": sum(r.evicted_tokens for r in ran),
        "preemptions": sum(r.preemptions for r in ran),
        "peak_pages_in_use": peak_pages_in_use,
        "cache_op_us_per_request": float(np.mean([r.cache_op_ns for r in ran]) / 1e3) if ran else 0.0,
        "ttft_mean_s": float(np.mean(ttft)) if ttft else None,
        "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else None,
        "isolated_ttft_mean_s": float(np.mean(iso)) if ran else None,
    }


def index_memory(cache: PrefixCache) -> dict[str, float | None]:
    """Bytes held by the cache's bookkeeping (index, free lists, per-request state; the KV
    tensors themselves are not simulated), measured deeply with pympler, and per cached token
    (pages holding KV, evictable or pinned). vLLM's preallocated blocks count in full."""
    from pympler.asizeof import asizeof

    u = cache.usage()
    cached = (u.evictable + u.in_use) * cache.page_size
    total = asizeof(cache)
    return {"index_bytes": float(total), "index_bytes_per_cached_token": total / cached if cached else None}


def _ran(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.rejected]


# ------------------------------------------------------------------------------ conventions
CONVENTIONS = ("C1", "C2")


def block_id_trace(
    records: Sequence[TraceRecord], convention: str, block: int = MOONCAKE_BLOCK
) -> BlockTrace:
    """The block trace of a block-id trace under ``convention`` (see the module docstring)."""
    if convention == "C1":
        ids = [list(r.hash_ids) for r in records]
        return BlockTrace(ids, ids, block)
    if convention == "C2":
        lookups = [list(r.hash_ids[: (r.input_length - 1) // block]) for r in records]
        inserts = [list(r.hash_ids[: r.input_length // block]) for r in records]
        return BlockTrace(lookups, inserts, block)
    raise ValueError(f"unknown convention {convention!r}; valid: {', '.join(CONVENTIONS)}")


def block_id_hit_rates(
    records: Sequence[TraceRecord], hit_tokens: Sequence[int], block: int = MOONCAKE_BLOCK
) -> tuple[float, float]:
    """(token hit rate, block hit rate) of per-request hits from the ``bounds`` functions on a
    ``block_id_trace`` (whole blocks: a hit on a partial last block counts its real tokens)."""
    lengths = [r.input_length for r in records]
    tokens = sum(lengths)
    hit = sum(min(h, n) for h, n in zip(hit_tokens, lengths, strict=True))
    return (hit / tokens if tokens else 0.0), block_hit_rate_of(lengths, hit_tokens, block)


# ------------------------------------------------------------------------------ intervals
# Student's t, two-sided 95%, by degrees of freedom (beyond 30 the normal 1.96 is close enough).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% confidence interval) of independent samples (seeds), by
    Student's t; the half-width is nan for a single sample."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_ci95 of no values")
    if x.size == 1:
        return float(x[0]), float("nan")
    t = _T975[x.size - 2] if x.size - 1 <= len(_T975) else 1.96
    return float(x.mean()), float(t * x.std(ddof=1) / np.sqrt(x.size))


def group_resamples(num_groups: int, n: int = 1000, seed: int = 0) -> np.ndarray:
    """``n`` bootstrap resamples of ``num_groups`` groups drawn with replacement, as counts
    (n x num_groups float64): how often each group is drawn in each resample. Every grouped
    interval of the studies draws them this one way."""
    p = np.full(num_groups, 1.0 / num_groups)
    return np.random.default_rng(seed).multinomial(num_groups, p, size=n).astype(np.float64)


def grouped_ratio_ci95(num: np.ndarray, den: np.ndarray, groups: np.ndarray, seed: int = 0,
                       n: int = 1000) -> tuple[float, float]:
    """95% interval (2.5th and 97.5th percentiles) of sum(num) / sum(den) over ``n`` resamples
    of whole groups with replacement (requests of one conversation are not independent)."""
    _, index = np.unique(groups, return_inverse=True)  # the groups present, numbered densely
    k = int(index.max()) + 1
    num_g = np.bincount(index, np.asarray(num, dtype=float), k)
    den_g = np.bincount(index, np.asarray(den, dtype=float), k)
    weights = group_resamples(k, n, seed)
    lo, hi = np.percentile((weights @ num_g) / (weights @ den_g), [2.5, 97.5])
    return float(lo), float(hi)
