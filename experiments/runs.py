"""One run of a CLI or sweep config: its requests, its simulation, its folder.

``simulate`` runs a config touching no file (what a sweep's workers run); ``execute`` runs it
into its folder under --out (run_store.py names it from the config's content), or reads back
the finished run there.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.run_config import run_config
from prefixcache.experiments.run_store import check_writable_folder, finished_summary, run_name, write_run

from prefixcache.scheduler import OFFLINE_ORDERS

INDEX_MEMORY_KEYS = ("index_bytes", "index_bytes_per_cached_token")


def build_requests(cfg: dict[str, Any], records: Any = None) -> tuple[Any, int]:
    """The requests of a config (a lazy iterator for a trace, over ``records`` if the caller
    read them already) and how many there are, arrivals rescaled by ``arrival_scale``."""
    limit, scale = cfg["limit"], cfg.get("arrival_scale", 1.0)
    if cfg["trace"]:
        from prefixcache.experiments.inputs.traces import iter_requests, read_trace, scale_arrivals

        records = read_trace(cfg["trace"]) if records is None else records
        if not records:
            raise ValueError(f"trace {cfg['trace']} holds no requests")
        if scale != 1.0:
            records = scale_arrivals(records, scale)
        n = len(records) if limit is None else min(len(records), limit)
        reqs: Any = iter_requests(records, limit=limit, seed=cfg["seed"])
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        reqs = make_workload(cfg["workload"], seed=cfg["seed"], **cfg["params"]).generate()[:limit]
        if scale != 1.0 and reqs:
            first = reqs[0].arrival_time
            for r in reqs:
                r.arrival_time = first + (r.arrival_time - first) * scale
        n = len(reqs)
    if cfg["scheduler"] in OFFLINE_ORDERS:  # it reads them all up front: a list, as a workload's
        reqs = list(reqs)
    return reqs, n


def prompt_hash_store(cfg: dict[str, Any], records: Any) -> Any:
    """A hashchain trace run's store of prompt block hashes over the trace's ``records``
    (experiments/inputs/trace_hashes.py), shared by every cell and rerun over the same trace
    and hash settings; None otherwise."""
    if not cfg["trace"] or cfg["backend"] != "hashchain":
        return None
    from prefixcache.experiments.inputs.trace_hashes import TracePromptHashes

    return TracePromptHashes(records)


def execute(
    cfg: dict[str, Any],
    out_root: Path,
    *,
    force: bool = False,
    progress: bool = True,
    index_memory_bytes: bool = False,
) -> dict[str, Any]:
    """Run one config into its folder (or return the finished run's summary, ``skipped``).
    The folder is checked to be writable first, so no run is lost at the end; the summary's
    ``folder`` names where the run lies.

    index_memory_bytes: also measure the cache's bookkeeping deeply (pympler walks every
    object: minutes for a multi-million-token pool, so only on request)."""
    check_writable_folder(out_root)
    folder = out_root / run_name(cfg)
    if not force and (done := finished_summary(folder, cfg)) is not None:
        return dict(done, skipped=True, folder=str(folder))
    summary, df = simulate(cfg, progress=progress, index_memory_bytes=index_memory_bytes)
    folder = write_run(folder, cfg, summary, df, exist_ok=not force)
    return dict(summary, folder=str(folder))


def simulate(
    cfg: dict[str, Any], *, progress: bool = False, index_memory_bytes: bool = False
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One config's run, touching no file: (its summary, one row per request). What a sweep's
    workers run (a Ray worker may sit on another machine, so the driver writes the folder)."""
    from prefixcache.experiments.analysis.metrics import (
        granularity_loss,
        index_memory,
        records_frame,
        summarize,
    )

    run = run_config(cfg)
    if cfg["trace"]:  # read once: the requests and the hash store both come from it
        from prefixcache.experiments.inputs.traces import read_trace

        trace_records = read_trace(cfg["trace"])
    else:
        trace_records = None
    known_hashes = prompt_hash_store(cfg, trace_records)
    # the same hashes, read instead of computed: not a setting
    cache = run.make_cache(**({} if known_hashes is None else {"known_prompt_hashes": known_hashes}))
    requests, total = build_requests(cfg, trace_records)
    t0 = time.perf_counter()
    records, engine = run.run(cache, requests, progress=progress, total=total)
    wall = time.perf_counter() - t0
    if known_hashes is not None:
        known_hashes.save()
    summary = summarize(records, page_size=cfg["page_size"], peak_pages_in_use=engine.peak_pages_in_use)
    if summary["rejected"] == len(records):
        raise ValueError(
            f"{run_name(cfg)}: all {len(records)} requests are larger than the cache "
            f"({cache.config.usable_tokens} usable tokens); raise --capacity-tokens"
        )
    summary.update(over_all_requests(records))
    if not engine.time_cache_ops:  # not measured (Engine's time_cache_ops): no number, not 0
        summary["cache_op_us_per_request"] = None
    if summary["rejected"]:
        warnings.warn(
            f"{run_name(cfg)}: {summary['rejected']} of {len(records)} requests are larger than the "
            f"cache ({cache.config.usable_tokens} usable tokens) and never ran; token_hit_rate is over "
            f"the {summary['admitted']} admitted, token_hit_rate_all over all {len(records)}",
            stacklevel=2,
        )
    summary.update(
        config=run_name(cfg),
        wall_s=wall,
        prompt_tokens_per_s=summary["prompt_tokens"] / wall if wall else None,
        steps=engine.step_count,
        simulated_s=engine.clock,
        clock=engine.cost_model.source,
        cache_hit_rate=cache.stats.hit_rate,
    )
    if run.options.get("host_tier") is not None:
        st = cache.stats
        summary.update(host_hit_rate=st.host_hit_rate, loaded_tokens=st.loaded_tokens,
                       stored_tokens=st.stored_tokens, host_evicted_tokens=st.host_evicted_tokens,
                       load_wait_s=engine.load_wait_s, **cache.host_tier.metrics())
    summary.update(index_memory(cache) if index_memory_bytes else dict.fromkeys(INDEX_MEMORY_KEYS))
    if (
        isinstance(requests, list) and summary["prompt_tokens"] <= 200_000
    ):  # token-level trie: small runs only
        summary["granularity_loss_tokens"] = granularity_loss(
            [r.prompt_token_ids for r in requests], cfg["page_size"]
        )[0]
    return summary, records_frame(records, engine.cost_model)


def over_all_requests(records: Sequence[Any]) -> dict[str, Any]:
    """The summary's numbers over every request, a rejected one counting as a miss (the
    study's request set is then the same in every cell whatever the capacity), beside the
    usual rates over the admitted ones; and the TTFT median."""
    prompt = sum(r.prompt_tokens for r in records)
    ran = [r for r in records if not r.rejected]
    ttft = [r.first_token_time - r.arrival_time for r in ran if r.first_token_time is not None]
    return {
        "admitted": len(ran),
        "token_hit_rate_all": sum(r.hit_tokens for r in ran) / prompt if prompt else 0.0,
        "request_hit_rate_all": sum(r.hit_tokens > 0 for r in ran) / len(records) if records else 0.0,
        "ttft_p50_s": float(np.median(ttft)) if ttft else None,
    }


def summary_line(s: dict[str, Any]) -> str:
    ran = s["requests"] - s["rejected"]
    line = (
        f"token hit rate {s['token_hit_rate']:.1%}, request hit rate {s['request_hit_rate']:.1%} "
        f"of {ran} requests, prefill computed {s['prefill_tokens_computed']}, preemptions {s['preemptions']}"
    )
    if s.get("ttft_p50_s") is not None:
        line += f", TTFT p50 {s['ttft_p50_s']:.3g} s p99 {s['ttft_p99_s']:.3g} s"
    if s["rejected"]:
        line += (f"; {s['rejected']} rejected (larger than the cache): token hit rate over all "
                 f"{s['requests']} requests {s['token_hit_rate_all']:.1%}")
    return line
