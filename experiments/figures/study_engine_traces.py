"""Study: hash or tree in a running server: whole Mooncake traces through the engine.

Each cell serves a whole trace (every request, none dropped) with the engine: chunked prefill
under a 2,048-token budget, decode, preemption, the waiting queue, under the GPU roofline
clock (Llama-3-8B on an H100 SXM, ``roofline.py``). Arrivals are the trace's own timestamps,
rescaled so that the trace's prefill and decode work is ``load`` of what the engine serves
with no cache (``common.trace_arrival_scale``: one factor per trace and load, so every cell of
a trace at one load sees the same arrival sample). Backends: hashchain B=16 (vLLM), radix p16
and radix p1 (SGLang). Schedulers: FCFS, and LPM as SGLang 0.5.23 runs it (FCFS whenever more
than 128 requests wait).

LPM without that fallback (``lpm-no-fallback``) makes the same decisions as LPM in every run
whose waiting queue never exceeded 128 (``peak_waiting``, recorded per cell), so it is not run
again there; where the queue grew past 128 it matches every waiting request at every step,
the cost SGLang's fallback exists to avoid, and whole traces of it are out of reach here.

Statistics: nothing in a cell is random (the trace fixes prompts and arrivals), so there are
no seeds; 95% confidence intervals come from a bootstrap over conversations: requests whose
512-token block-id chains agree up to one block past what every request shares (one root of
the trace's hash chains below the common system prompt) are resampled together,
``BOOTSTRAP`` times.

``--scale full`` (``make engine-traces-full``, about an hour on 2 cores) writes the committed
``results/engine_traces_full/``; the default scale (in ``make reproduce``) runs a few of its
cells on the synthetic trace.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import group_resamples
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    cell_name,
    check_scale,
    read_table,
    run_cells,
    study_main,
    trace_arrival_scale,
)
from prefixcache.experiments.figures.study_whole_traces import TRACES, machine
from prefixcache.experiments.inputs.traces import read_mooncake

from prefixcache.cost_model import named_clock
from prefixcache.scheduler import LPM_FALLBACK_QUEUE_LEN

STUDY = "engine_traces"
FULL = "engine_traces_full"  # the committed result of --scale full
CONFIGS = [("hashchain", 16), ("radix", 16), ("radix", 1)]
SCHEDULERS = ["fcfs", "lpm"]
CLOCK = "h100-llama3-8b"
OVERLOAD = 1.5  # past the no-cache capacity: the queue grows and LPM falls back
BOOTSTRAP = 1000
SCALE = {
    "tiny": dict(traces=["synthetic"], limit=150, capacities=[1_000_000], configs=CONFIGS[:2],
                 loads=[0.8], overload_capacities=[1_000_000]),
    "default": dict(traces=["synthetic"], limit=None, capacities=[3_000_000], configs=CONFIGS[:2],
                    loads=[0.8], overload_capacities=[3_000_000]),
    "full": dict(traces=list(TRACES), limit=None, capacities=[1_000_000, 3_000_000, 10_000_000],
                 configs=CONFIGS, loads=[0.5, 0.8, 1.0], overload_capacities=[3_000_000]),
}
QUEUE_POINTS = 200  # samples of each cell's queue length over time


def configs(scale: str) -> list[dict[str, Any]]:
    """Every (trace, capacity, backend, scheduler, load) cell; overload only at its capacities."""
    s = SCALE[check_scale(scale)]
    clock = named_clock(CLOCK)
    out = []
    for trace in s["traces"]:
        source = TRACES[trace]
        loads = {load: trace_arrival_scale(source, s["limit"], clock, load)
                 for load in [*s["loads"], OVERLOAD]}
        for cap in s["capacities"]:
            for load, factor in loads.items():
                if load == OVERLOAD and cap not in s["overload_capacities"]:
                    continue
                for backend, page in s["configs"]:
                    for sched in SCHEDULERS:
                        c = cell_config(STUDY, source=source, backend=backend, page_size=page,
                                        capacity_tokens=cap, scheduler=sched, limit=s["limit"], clock=clock)
                        c.update(trace=trace, load=load, arrival_scale=factor, clock=CLOCK)
                        out.append(c)
    return out


def conversations(source: str, limit: int | None) -> np.ndarray:
    """Each request's conversation (an index): requests whose block-id chains agree up to one
    block past the blocks every request of the trace shares (the conversation trace opens every
    prompt with one common block; the synthetic trace shares none)."""
    records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
    chains = [r.hash_ids for r in records]
    common = 0
    while all(len(c) > common and c[common] == chains[0][common] for c in chains):
        common += 1
    keys = [tuple(c[: common + 1]) if len(c) > common else ("own", i) for i, c in enumerate(chains)]
    index = {root: k for k, root in enumerate(sorted(set(keys), key=str))}
    return np.asarray([index[k] for k in keys], dtype=np.int64)


def conversations_by_id(source: str, limit: int | None) -> pd.Series:
    """``conversations`` indexed by the request ids ``make_requests`` gives the trace's requests."""
    group = conversations(source, limit)
    return pd.Series(group, index=[f"{source}-{i}" for i in range(len(group))])


def bootstrap_by_conversation(df: pd.DataFrame, group: np.ndarray, seed: int = 0) -> dict[str, float]:
    """95% intervals (2.5th and 97.5th percentiles of ``BOOTSTRAP`` resamples of whole
    conversations) of the token hit rate and of TTFT's p50, p90 and p99, with the point values.
    ``df`` is a cell's per-request table in request order, ``group`` each request's
    conversation."""
    hit = df["hit_tokens"].to_numpy(dtype=np.float64)
    prompt = df["prompt_tokens"].to_numpy(dtype=np.float64)
    ttft = df["ttft_s"].to_numpy(dtype=np.float64)
    n_groups = int(group.max()) + 1
    hit_g = np.bincount(group, hit, n_groups)
    prompt_g = np.bincount(group, prompt, n_groups)
    order = np.argsort(ttft, kind="stable")
    sorted_ttft, sorted_group = ttft[order], group[order]
    counts = group_resamples(n_groups, BOOTSTRAP, seed)
    rates = counts @ hit_g / (counts @ prompt_g)
    weights = np.cumsum(counts[:, sorted_group], axis=1)  # each resample's weight up to each request
    out = {"token_hit_rate": float(hit.sum() / prompt.sum())}
    out["token_hit_rate_lo"], out["token_hit_rate_hi"] = (float(v) for v in np.percentile(rates, [2.5, 97.5]))
    last = len(sorted_ttft) - 1
    for q in (50, 90, 99):
        # one quantile rule for the point and the resamples: the first request whose
        # cumulative weight reaches q% (the point: every request weighs 1)
        at = np.array([np.searchsorted(w, w[-1] * q / 100) for w in weights])
        values = sorted_ttft[np.minimum(at, last)]
        point = sorted_ttft[min(int(np.searchsorted(np.arange(1, last + 2), (last + 1) * q / 100)), last)]
        out[f"ttft_p{q}_s"] = float(point)
        out[f"ttft_p{q}_lo"], out[f"ttft_p{q}_hi"] = (float(v) for v in np.percentile(values, [2.5, 97.5]))
    return out


def queue_over_time(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, float]:
    """Requests arrived but not yet admitted, sampled at ``QUEUE_POINTS`` times across the run,
    and the time average (a request preempted and readmitted counts from its first admission)."""
    arrive = np.sort(df["arrival_time"].to_numpy())
    admit = np.sort(df["admission_time"].to_numpy())

    def waiting_at(t: np.ndarray) -> np.ndarray:
        return np.searchsorted(arrive, t, side="right") - np.searchsorted(admit, t, side="right")

    times = np.linspace(arrive[0], admit[-1], QUEUE_POINTS)
    waiting = waiting_at(times)
    events = np.union1d(arrive, admit)
    level = waiting_at(events)
    span = events[-1] - events[0]
    mean = float((level[:-1] * np.diff(events)).sum() / span) if span > 0 else 0.0
    return times - arrive[0], waiting, mean


def analyse(cells: pd.DataFrame, cfgs: list[dict[str, Any]], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy table (one row per cell, bootstrap intervals added, lpm-no-fallback rows where
    they equal lpm's) and the queue series (one row per cell and sample)."""
    groups: dict[tuple[str, int | None], np.ndarray] = {}
    rows, series = [], []
    for c, row in zip(cfgs, cells.to_dict("records"), strict=True):
        df = read_table(out / STUDY / cell_name(c) / "requests")
        if df["rejected"].any():
            raise RuntimeError(f"{cell_name(c)}: {int(df['rejected'].sum())} requests larger than the pool")
        key = (c["source"], c["limit"])
        if key not in groups:
            groups[key] = conversations(*key)
        times, waiting, mean = queue_over_time(df)
        row = {k: row[k] for k in ("trace", "capacity_tokens", "backend", "page_size", "scheduler", "load",
                                   "requests", "prompt_tokens", "hit_tokens", "throughput_tok_s",
                                   "peak_waiting", "preemptions", "sim_seconds", "steps", "wall_s")}
        index = df["request_id"].str.rsplit("-", n=1).str[1].astype(int).to_numpy()  # "<source>-<i>"
        row.update(bootstrap_by_conversation(df, groups[key][index]), mean_waiting=mean,
                   conversations=int(groups[key].max()) + 1)
        rows.append(row)
        series += [dict(trace=c["trace"], capacity_tokens=c["capacity_tokens"], backend=c["backend"],
                        page_size=c["page_size"], scheduler=c["scheduler"], load=c["load"], time_s=float(t),
                        waiting=int(w)) for t, w in zip(times, waiting, strict=True)]
    table = pd.DataFrame(rows)
    same = table[(table["scheduler"] == "lpm") & (table["peak_waiting"] <= LPM_FALLBACK_QUEUE_LEN)]
    table = pd.concat([table, same.assign(scheduler="lpm-no-fallback")], ignore_index=True)
    return table, pd.DataFrame(series)


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    t0 = time.perf_counter()
    cfgs = configs(scale)
    cells = run_cells(cfgs, out, force=force, jobs=jobs)
    table, series = analyse(cells, cfgs, out)
    folder = out / (FULL if scale == "full" else STUDY)
    folder.mkdir(parents=True, exist_ok=True)
    table.drop(columns=["wall_s"]).to_csv(folder / "summary.csv", index=False)  # no wall clock: reproducible
    series.to_csv(folder / "queue.csv", index=False)
    if scale == "full":
        meta = dict(command=" ".join(sys.argv), date=time.strftime("%Y-%m-%d"), machine=machine(),
                    wall_s=round(time.perf_counter() - t0, 1),
                    cell_wall_s=round(float(table["wall_s"].sum()), 1),
                    clock=str(named_clock(CLOCK)))
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{STUDY}: {len(table)} rows -> {folder / 'summary.csv'}")
    return folder


def load_summary(results: Path) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """The committed full grid when there is one, else the default scale's: (table, queue
    series, whether it is the full grid)."""
    full = results / FULL / "summary.csv"
    folder = results / (FULL if full.exists() else STUDY)
    return pd.read_csv(folder / "summary.csv"), pd.read_csv(folder / "queue.csv"), full.exists()


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
