"""Study: where hashchain and radix differ under eviction, and why, by ablation.

Both designs serve the same workloads in the engine (the workloads' own arrivals, FCFS, the
roofline clock of ``study_engine_traces``) at pools that evict. The measured difference is
radix p1 (SGLang's default) minus hashchain B=16 (vLLM's), in token hit rate. Each cause is
one switch that gives one design one behaviour of the other:

* publication time: hashchain ``publish="commit"`` (blocks published at a prefill's commit and
  at release, as SGLang inserts, instead of at allocation);
* duplicates: hashchain ``dedupe=True`` (a recomputed block whose content is cached goes back
  at once, as SGLang's insert frees it, instead of staying cached beside the first copy);
* eviction order: hashchain ``eviction_policy="leaf-lru"`` (leaf blocks by last access, as
  SGLang's heap, instead of the free queue);
* eviction granularity: radix ``eviction_granularity="page"`` switched off (whole leaves for
  SGLang's over-estimated demand, instead of exactly the pages taken);
* page size: radix p16 -> p1;
* the n-1 cap: both designs cap a hit at n-1 tokens floored to pages (REFERENCE A4, B3;
  ``tests/test_decomposition_switches.py``), so at one page size it is no cause; its block
  floor is part of the page-size cause.

The chain switches them on one after another, vLLM -> +publication -> +duplicates -> +order
(= hashchain with all three) -> radix p16 at page granularity (the step no switch names: the
residual) -> radix p16 (granularity) -> radix p1 (page size); its steps sum to the measured
difference exactly, and the residual says how much no named cause explains. Each switch is
also run alone on vLLM's hashchain (page size alone: hashchain B=1). 95% intervals come from a
bootstrap over request groups (``prompt_groups``), pooled over workload seeds, every variant
resampled alike. Writes ``results/decomposition/summary`` (one row per run) and
``results/decomposition/causes.csv`` (one row per cell and cause).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import group_resamples
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    make_requests,
    read_table,
    run_cells,
    save_study,
    study_main,
    trace_arrival_scale,
)
from prefixcache.experiments.figures.study_engine_traces import conversations_by_id
from prefixcache.experiments.figures.study_whole_traces import TRACES

from prefixcache.cost_model import named_clock

STUDY = "decomposition"
CLOCK = "h100-llama3-8b"
SGLANG_ORDER = {"eviction_policy": "leaf-lru"}
# (label, backend, page size, options)
VARIANTS: list[tuple[str, str, int, dict[str, Any]]] = [
    ("vllm", "hashchain", 16, {}),
    ("publication", "hashchain", 16, {"publish": "commit"}),
    ("duplicates", "hashchain", 16, {"dedupe": True}),
    ("order", "hashchain", 16, SGLANG_ORDER),
    ("page-alone", "hashchain", 1, {}),
    ("publication+duplicates", "hashchain", 16, {"publish": "commit", "dedupe": True}),
    ("hashchain-all", "hashchain", 16, {"publish": "commit", "dedupe": True, **SGLANG_ORDER}),
    ("radix-page", "radix", 16, {"eviction_granularity": "page"}),
    ("radix16", "radix", 16, {}),
    ("radix1", "radix", 1, {}),
]
# cause -> (chain step: from, to), (alone: from, to)
CAUSES: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "publication time": (("vllm", "publication"), ("vllm", "publication")),
    "duplicates": (("publication", "publication+duplicates"), ("vllm", "duplicates")),
    "eviction order": (("publication+duplicates", "hashchain-all"), ("vllm", "order")),
    "residual (no switch)": (("hashchain-all", "radix-page"), ("hashchain-all", "radix-page")),
    "eviction granularity": (("radix-page", "radix16"), ("radix-page", "radix16")),
    "page size": (("radix16", "radix1"), ("vllm", "page-alone")),
}
MEASURED = ("vllm", "radix1")  # radix p1 minus hashchain B=16
SAME_PAGE = ("vllm", "radix16")  # radix p16 minus hashchain B=16
SOURCES: dict[str, dict[str, Any]] = {  # the eviction study's workloads
    "shared-doc-qa": dict(num_docs=64, doc_len=1000, num_requests=300, zipf_s=0.8),
    "multi-turn-chat": dict(conversations=48, turns=6, system_len=250),
    "react-agent": dict(agents=24, steps=8, system_len=500),
}
# The Mooncake traces as study_engine_traces serves them (their timestamps rescaled to LOAD of
# the no-cache capacity): (trace, requests (None: all), capacities). No "page-alone" run there:
# hashchain B=1 hashes 12k-token prompts token by token.
LOAD = 0.8
TRACE_VARIANTS = [v for v in VARIANTS if v[0] != "page-alone"]
SCALE = {
    "tiny": dict(sources=["multi-turn-chat"], seeds=1, capacities=[1 << 13], traces=[]),
    "default": dict(sources=list(SOURCES), seeds=3, capacities=[1 << 12, 1 << 13, 1 << 14], traces=[]),
    "full": dict(sources=list(SOURCES), seeds=10, capacities=[1 << 12, 1 << 13, 1 << 14],
                 traces=[("conversation", None, [1_000_000, 3_000_000]),
                         ("synthetic", None, [1_000_000, 3_000_000])]),
}
FULL = "decomposition_full"  # the committed result of --scale full (its whole traces)
# runs.csv: each run of the full grid by name with its integer counts, which a later
# default-scale run is checked against exactly
RUN_KEYS = ["cell", "label", "source", "capacity_tokens", "seed"]
RUN_COUNTS = ["hits", "queries", "evicted_tokens"]
BOOTSTRAP = 1000


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    clock = named_clock(CLOCK)
    out = []
    for source in s["sources"]:
        for seed in range(s["seeds"]):
            for cap in s["capacities"]:
                for label, backend, page, options in VARIANTS:
                    c = cell_config(STUDY, source=source, backend=backend, page_size=page,
                                    capacity_tokens=cap, options=options, params=SOURCES[source],
                                    label=label, seed=seed, clock=clock)
                    c["clock"] = CLOCK
                    out.append(c)
    for trace, limit, capacities in s["traces"]:
        source = TRACES[trace]
        factor = trace_arrival_scale(source, limit, clock, LOAD)
        for cap in capacities:
            for label, backend, page, options in TRACE_VARIANTS:
                c = cell_config(STUDY, source=source, backend=backend, page_size=page,
                                capacity_tokens=cap, options=options, label=label, limit=limit, clock=clock)
                c.update(trace=trace, load=LOAD, arrival_scale=factor, clock=CLOCK)
                out.append(c)
    return out


def panel(source: str, limit: Any) -> str:
    """A cell's workload as the figure names it: a trace prefix says how many requests."""
    if source in MOONCAKE_TRACES and isinstance(limit, (int, float)) and limit == limit:
        return f"{source} (first {int(limit)})"
    return source


def groups_of(source: str, limit: Any, config: dict[str, Any]) -> pd.Series:
    """The bootstrap's unit of each request of a run, by request id: a trace's conversations
    (``study_engine_traces.conversations``), else ``prompt_groups`` of the workload's prompts."""
    if source in MOONCAKE_TRACES:
        return conversations_by_id(source, None if limit is None or limit != limit else int(limit))
    reqs = make_requests(config)
    return pd.Series(prompt_groups([r.prompt_array for r in reqs]), index=[r.request_id for r in reqs])


def prompt_groups(prompts: list[np.ndarray]) -> np.ndarray:
    """Each request's group (an index): requests whose prompts agree up to 16 tokens past what
    every prompt shares (a document, a conversation, an agent's task), the unit the bootstrap
    resamples, as ``study_engine_traces.conversations`` groups a trace's chains."""
    first = prompts[0]
    common = min(len(p) for p in prompts)
    for p in prompts[1:]:
        diff = np.flatnonzero(p[:common] != first[:common])
        if len(diff):
            common = int(diff[0])
    keys = [p[: common + 16].tobytes() for p in prompts]
    index = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.asarray([index[k] for k in keys], dtype=np.int64)


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def cell_arrays(cell: pd.DataFrame, labels: list[str], out: Path, study: str = STUDY) -> Arrays:
    """(hits: variants x groups, prompt tokens per group, resampled group weights) of one cell of
    ``study``'s runs (their ``labels``, the first giving the request order), every seed's
    requests in their own groups, each seed's grouped as its runs' own config says."""
    hits, prompts, groups, offset = [], [], [], 0
    for _, runs in cell.groupby("seed", sort=True):
        tables = {r.label: read_table(out / study / r.cell / "requests").set_index("request_id")
                  for r in runs.itertuples()}
        ids = tables[labels[0]].index  # every table read in this order
        config = json.loads((out / study / runs.iloc[0]["cell"] / "config.json").read_text())
        g = groups_of(config["source"], config["limit"], config).loc[ids].to_numpy() + offset
        offset = int(g.max()) + 1  # the next seed's groups are its own
        groups.append(g)
        hits.append(np.stack([tables[label]["hit_tokens"].loc[ids].to_numpy(np.float64) for label in labels]))
        prompts.append(tables[labels[0]]["prompt_tokens"].to_numpy(np.float64))
    group, hit, prompt = np.concatenate(groups), np.concatenate(hits, axis=1), np.concatenate(prompts)
    return (np.stack([np.bincount(group, h, offset) for h in hit]), np.bincount(group, prompt, offset),
            group_resamples(offset, BOOTSTRAP))


class Effects:
    """Differences of token hit rate between variants of one cell, in points, with 95%
    intervals from the same resamples for every variant."""

    def __init__(self, labels: list[str], hit_g: np.ndarray, prompt_g: np.ndarray,
                 weights: np.ndarray) -> None:
        self.col = {label: i for i, label in enumerate(labels)}
        self.rate = 100 * hit_g.sum(axis=1) / prompt_g.sum()
        self.boot = 100 * (weights @ hit_g.T) / (weights @ prompt_g)[:, None]  # resamples x variants

    def __call__(self, pair: tuple[str, str]) -> tuple[float, float, float]:
        """(b - a, low, high) for pair (a, b); NaN where a variant did not run."""
        if pair[0] not in self.col or pair[1] not in self.col:
            return np.nan, np.nan, np.nan
        a, b = self.col[pair[0]], self.col[pair[1]]
        lo, hi = np.percentile(self.boot[:, b] - self.boot[:, a], [2.5, 97.5])
        return float(self.rate[b] - self.rate[a]), float(lo), float(hi)


def named(prefix: str, values: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip([f"{prefix}_pt", f"{prefix}_lo", f"{prefix}_hi"], values, strict=True))


def causes(df: pd.DataFrame, out: Path) -> pd.DataFrame:
    """One row per (workload, capacity) and cause: its chain step and its effect alone, with
    95% intervals, beside the measured difference, all in points of token hit rate."""
    df = df.assign(panel=[panel(s, lim) for s, lim in zip(df["source"], df["limit"], strict=True)])
    rows = []
    for (name, cap), cell in df.groupby(["panel", "capacity_tokens"], sort=True):
        labels = [label for label, *_ in VARIANTS if label in set(cell["label"])]
        hit_g, prompt_g, weights = cell_arrays(cell, labels, out)
        effect = Effects(labels, hit_g, prompt_g, weights)
        common = dict(**named("measured", effect(MEASURED)), **named("same_page", effect(SAME_PAGE)),
                      vllm_hit_rate=float(effect.rate[effect.col["vllm"]]),
                      radix1_hit_rate=float(effect.rate[effect.col["radix1"]]),
                      seeds=int(cell["seed"].nunique()), groups=len(prompt_g))
        for cause, (step, alone) in CAUSES.items():
            rows.append(dict(source=name, capacity_tokens=int(cap), cause=cause,
                             **named("chain", effect(step)), **named("alone", effect(alone)), **common))
    return pd.DataFrame(rows)


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    df = run_cells(configs(scale), out, force=force, jobs=jobs)
    if not (df["evicted_tokens"] > 0).groupby([df["source"], df["capacity_tokens"]]).any().all():
        raise RuntimeError("decomposition: a capacity evicted nothing in any run; "
                           "the study is about eviction")
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "clock": CLOCK, "sources": SOURCES,
                                "variants": [v[0] for v in VARIANTS]})
    table = causes(df, out)
    # simulated hits only (no wall clock): the same on every machine
    table.to_csv(out / STUDY / "causes.csv", index=False, float_format="%.6g")
    if scale == "full":
        (out / FULL).mkdir(parents=True, exist_ok=True)
        table.to_csv(out / FULL / "causes.csv", index=False, float_format="%.6g")
        df[RUN_KEYS + RUN_COUNTS].to_csv(out / FULL / "runs.csv", index=False)
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
