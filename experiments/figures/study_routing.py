"""Study: many replicas behind a cache-aware router (issue 17).

A Mooncake trace with its timestamps is served by N replicas, each an engine over its own
cache (hashchain B=16, or radix at page 16 so both emit the same KV-event blocks), behind
every router of ``prefixcache.cluster``: round-robin, SGLang's cache_aware (gateway and old
low-match rule), Dynamo (classic and current cost from routed history with its TTL, and from
KV events), llm-d (approximate and precise prefix scorers), production-stack prefixaware, Ray
Serve's prefix affinity, Preble E2, and the oracle that reads every replica's true cache.

The arrivals are the trace's, rescaled once per trace so that the offered work is ``LOAD`` of
what the replicas could serve without any cache (the same sample and the same rescale for
every router: only the router differs in a row of the table). Per cell: token hit rate (with a
95% bootstrap interval over conversations), the router's prediction error (predicted vs reused
tokens, split into its state and the queueing, ``analysis.routing``), time-weighted load
imbalance, TTFT p50/p90/p99 on the simulated clock: by default the GPU roofline of Llama-3-8B
on an H100 SXM (``CLOCK``), as in the TTFT and engine-trace studies; ``--clock cpu`` runs the
clock measured on this CPU instead (each cell records its clock's constants, so a clock change
reruns it). The arrival rescale is the clock's, so the trace's seconds differ between clocks
while the offered load (``LOAD``) stays the same.

Parts:
- routers x designs on each trace (every scale);
- event lag: the exact routers (Dynamo on events, llm-d precise) with their events delivered
  0 s to 10 s late;
- local vs global (Mooncake's Fig. 10): the oracle router over N caches of C tokens against
  one pooled cache of N x C tokens (a replay, the global hit rate Mooncake's pool aims at).

Scales: ``default`` serves the first ``limit`` requests of the conversation trace on 4
replicas x 1M tokens at load 0.7 (about 40 s a cell on 2 cores); ``full`` every request of both
traces on 4, 8 and 16 replicas x 1M and 3M tokens at loads 0.5, 0.8 and 1.0, every router (984
cells of about a minute each on this 2-core machine: ``make routing-full``, on Ray with
``--executor ray [--address ADDR]``, resumed from its committed table and run ``--max-cells`` at
a time across sessions).

Writes ``results/routing/summary`` (one row per cell); the full scale
``results/routing_full/summary.csv`` and ``meta.json``, committed.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import dataclass_frame, grouped_ratio_ci95
from prefixcache.experiments.analysis.routing import hit_rates, imbalance, prediction_error
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    SUMMARY_VERSION,
    cell_config,
    cell_name,
    check_scale,
    read_table,
    run_cells,
    save_study,
    trace_arrival_scale,
    trace_prompt_hashes,
    write_table,
)
from prefixcache.experiments.figures.study_engine_traces import conversations_by_id
from prefixcache.experiments.figures.study_whole_traces import machine

from prefixcache import CacheConfig, make_cache
from prefixcache.cluster import Cluster, make_router
from prefixcache.cost_model import clock_from_constants, named_clock

STUDY = "routing"
FULL = "routing_full"  # the committed result of --scale full: its summary, resumed cell by cell
CLOCK = "h100-llama3-8b"  # the default clock (cost_model.named_clock); "cpu" is the other
LOAD = 0.7  # offered work / what the replicas serve with no cache (the default scale's)
PAGE = 16
DESIGNS = {"hashchain": ("hashchain", PAGE), "radix": ("radix", PAGE)}
# (label, router, options, needs KV events)
ROUTERS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("round-robin", "round-robin", {}, False),
    ("sglang", "sglang", {"version": "gateway"}, False),
    ("sglang-old", "sglang", {"version": "old"}, False),
    ("dynamo", "dynamo", {"cost": "classic"}, False),
    ("dynamo-current", "dynamo", {"cost": "current"}, False),
    ("dynamo-events", "dynamo", {"cost": "classic", "use_kv_events": True}, True),
    ("dynamo-current-events", "dynamo", {"cost": "current", "use_kv_events": True}, True),
    ("llm-d", "llm-d", {"prefix": "approximate"}, False),
    ("llm-d-precise", "llm-d", {"prefix": "precise"}, True),
    ("production-stack", "production-stack", {}, False),
    ("ray-serve", "ray-serve", {}, False),
    ("preble", "preble", {}, False),
    ("oracle", "oracle", {}, False),
]
LAGS_S = [0.0, 1.0, 10.0, 100.0, 1000.0]  # the rescaled trace sends a request every ~2 s
SCALE: dict[str, dict[str, Any]] = {
    "tiny": dict(
        traces=["mooncake-conversation"],
        side_traces=["mooncake-conversation"],
        side_designs=["hashchain"],
        limit=40,
        replicas=[2],
        capacities=[1 << 16],
        routers=["round-robin", "dynamo-events", "oracle"],
        lags=[0.0, 1.0],
        global_replicas=[2],
        loads=[LOAD],
        side_load=LOAD,
    ),
    "default": dict(
        traces=["mooncake-conversation"],
        side_traces=["mooncake-conversation"],
        side_designs=["hashchain"],
        limit=1000,
        replicas=[4],
        capacities=[1_000_000],
        # the small default: every router but the one added with the full grid
        routers=[r[0] for r in ROUTERS if r[0] != "dynamo-current-events"],
        lags=LAGS_S,
        global_replicas=[2, 4, 8],
        loads=[LOAD],
        side_load=LOAD,
    ),
    "full": dict(
        traces=list(MOONCAKE_TRACES),
        side_traces=list(MOONCAKE_TRACES),
        side_designs=list(DESIGNS),
        limit=None,
        replicas=[4, 8, 16],
        capacities=[1_000_000, 3_000_000],
        routers=[r[0] for r in ROUTERS],
        lags=LAGS_S,
        global_replicas=[4, 8, 16],
        loads=[0.5, 0.8, 1.0],  # of the replicas' no-cache capacity
        side_load=0.8,
    ),
}


# ------------------------------------------------------------------------------ cells
def cluster_config(
    *,
    source: str,
    design: str,
    router: str,
    replicas: int,
    capacity: int,
    limit: int | None,
    lag_s: float = 0.0,
    part: str = "routers",
    clock: str = CLOCK,
    load: float = LOAD,
) -> dict[str, Any]:
    label, name, options, events = next(r for r in ROUTERS if r[0] == router)
    backend, page = DESIGNS[design]
    return dict(
        study=STUDY,
        part=part,
        mode="cluster",
        source=source,
        limit=limit,
        design=design,
        backend=backend,
        page_size=page,
        capacity_tokens=capacity,
        replicas=replicas,
        router=name,
        label=label,
        router_options=options,
        kv_events=events,
        event_lag_s=lag_s,
        load=load,
        token_budget=2048,
        seed=0,
        cost_model=named_clock(clock).constants(),
        clock=clock,
    )


def configs(scale: str, clock: str = CLOCK) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cluster cells, pooled-cache replay cells), cluster cells under ``clock``. The routers
    part runs at every load; the lag and local-vs-global parts on ``side_traces`` x
    ``side_designs`` only, at ``side_load``, the lags at the first (replicas, capacity) point."""
    s = SCALE[check_scale(scale)]
    limit = s["limit"]
    study = FULL if scale == "full" else STUDY
    exact = [label for label, *_, events in ROUTERS if events and label in s["routers"]]
    side_point = (s["replicas"][0], s["capacities"][0])
    out, pooled = [], []
    for source in s["traces"]:
        side = source in s["side_traces"]
        for n, cap, design, load in product(s["replicas"], s["capacities"], DESIGNS, s["loads"]):
            cell = partial(
                cluster_config, source=source, design=design, replicas=n, capacity=cap, limit=limit,
                clock=clock, load=load,
            )
            out += [cell(router=label) for label in s["routers"]]
            lags = side and design in s["side_designs"] and load == s["side_load"] and (n, cap) == side_point
            if lags:  # lag 0 is the routers part's cell
                out += [
                    cell(router=label, lag_s=lag, part="lag") for label in exact for lag in s["lags"] if lag
                ]
        if not side:
            continue
        cap = s["capacities"][0]
        for n, design in product(s["global_replicas"], s["side_designs"]):
            if n not in s["replicas"]:
                out.append(
                    cluster_config(
                        source=source,
                        design=design,
                        router="oracle",
                        replicas=n,
                        capacity=cap,
                        limit=limit,
                        part="local",
                        clock=clock,
                        load=s["side_load"],
                    )
                )
            backend, page = DESIGNS[design]
            c = cell_config(
                study,
                source=source,
                backend=backend,
                page_size=page,
                capacity_tokens=n * cap,
                mode="replay",
                label=f"pooled-{design}",
                limit=limit,
            )
            c.update(part="global", replicas=n, design=design)
            pooled.append(c)
    return out, pooled


def rescaled_requests(config: dict[str, Any]) -> list[Any]:
    """The trace's first ``limit`` requests with arrivals stretched (or squeezed) so that the
    prefill and decode work they bring is ``load`` of ``replicas`` engines' capacity."""
    from prefixcache.experiments.inputs.traces import read_mooncake, to_requests

    source, limit = config["source"], config["limit"]
    reqs = to_requests(read_mooncake(MOONCAKE_TRACES[source]), limit=limit, prefix=source)
    factor = trace_arrival_scale(source, limit, clock_from_constants(config["cost_model"]), config["load"],
                                 config["replicas"])
    for r in reqs:
        r.arrival_time = (r.arrival_time - reqs[0].arrival_time) * factor
    return reqs


CI_UNIT = "conversation"  # what the hit rate's bootstrap resamples (stored cells say theirs)


def run_cluster_cell(
    config: dict[str, Any], out_root: Path, force: bool = False, study: str = STUDY
) -> dict[str, Any]:
    """Run (or read back) one cluster cell under ``out_root / study``; returns its summary row."""
    folder = out_root / study / cell_name(config)
    summary_path = folder / "summary.json"
    if not force and summary_path.exists():
        stored = json.loads((folder / "config.json").read_text())
        row = json.loads(summary_path.read_text())
        if (
            stored == json.loads(json.dumps(config, default=str))
            and row.get("summary_version") == SUMMARY_VERSION
            and row.get("ci_unit") == CI_UNIT
        ):
            return dict(row)
    row, rows = simulate_cluster(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    write_table(rows, folder / "requests")
    row.update(cell=folder.name, summary_version=SUMMARY_VERSION)
    summary_path.write_text(json.dumps(row, indent=2, default=str))
    return row


def simulate_cluster(config: dict[str, Any]) -> tuple[dict[str, Any], pd.DataFrame]:
    """One cluster cell, touching no file: (its summary, one row per request)."""
    t0 = time.perf_counter()
    n = config["replicas"]
    options: dict[str, Any] = {"kv_events": True} if config["kv_events"] else {}
    if config["backend"] == "hashchain":  # the trace's hashes, read instead of computed in every replica
        options["known_prompt_hashes"] = trace_prompt_hashes(config["source"])
    caches = [
        make_cache(config["backend"], CacheConfig(config["capacity_tokens"], config["page_size"]), **options)
        for _ in range(n)
    ]
    router = make_router(config["router"], n, seed=config["seed"], **config["router_options"])
    cluster = Cluster(
        caches,
        router,
        token_budget=config["token_budget"],
        seed=config["seed"],
        cost_model=clock_from_constants(config["cost_model"]),
        kv_events=config["kv_events"],
        event_lag_s=config["event_lag_s"],
    )
    routes = cluster.run(rescaled_requests(config))  # not kept here: a finished request's tokens go
    for cache in caches:  # every usable page accounted for in every replica
        if sum(cache.usage()) != cache.num_usable_pages():
            raise RuntimeError(f"{cell_name(config)}: page accounting broken: {cache.usage()}")
    df = dataclass_frame(routes)
    ok = df[~df["rejected"]]
    hits = ok["hit_tokens"].to_numpy(dtype=float)
    prompts = ok["prompt_tokens"].to_numpy(dtype=float)
    groups = conversations_by_id(config["source"], config["limit"]).loc[ok["request_id"]].to_numpy()
    lo, hi = grouped_ratio_ci95(hits, prompts, groups)
    rates = hit_rates(routes, n)
    per = np.array(rates["per_replica_hit_rate"], dtype=float)
    ttft = ok["ttft_s"]
    clock = clock_from_constants(config["cost_model"])
    # each hit's prefill saved, alone in its step: the same measure under either clock
    saved = clock.isolated_prefill_s(prompts, 0) - clock.isolated_prefill_s(prompts, hits)
    row = {k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for k, v in config.items()}
    row.update(
        requests=len(df),
        rejected=int(df["rejected"].sum()),
        token_hit_rate=rates["token_hit_rate"],
        hit_rate_lo=lo,
        hit_rate_hi=hi,
        ci_unit=CI_UNIT,
        request_hit_rate=rates["request_hit_rate"],
        per_replica_hit_min=float(np.nanmin(per)),
        per_replica_hit_max=float(np.nanmax(per)),
        **{f"pred_{k}": v for k, v in prediction_error(routes).items()},
        **{f"imbalance_{k}": v for k, v in imbalance(cluster.load_events, n).items()},
        ttft_p50_s=float(ttft.quantile(0.5)),
        ttft_p90_s=float(ttft.quantile(0.9)),
        ttft_p99_s=float(ttft.quantile(0.99)),
        prefill_saved_s=float(np.sum(saved)),
        events_lost=cluster.events_lost,
        wall_s=time.perf_counter() - t0,
    )
    return row, df


# ------------------------------------------------------------------------------ executors
def _cells(
    todo: Sequence[dict[str, Any]], out: Path, force: bool, jobs: int, executor: str, address: str | None,
    study: str,
) -> Iterator[dict[str, Any]]:
    if executor == "ray":
        from prefixcache.experiments.sweep import ray_as_completed

        argsets = [(c, out.resolve(), force, study) for c in todo]
        for _, row in ray_as_completed(run_cluster_cell, argsets, jobs, address):
            yield row
        return
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=jobs, return_as="generator")(
        delayed(run_cluster_cell)(c, out, force, study) for c in todo
    )


def finished_rows(summary: Path, cells: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows of ``summary`` (a study table, if there is one) that are cells of ``cells``, by
    cell name, computed under this summary version and bootstrap unit: what a rerun need not
    run again. A cell's name is a digest of its whole config, so a changed cell is not found."""
    try:
        table = read_table(summary)
    except FileNotFoundError:
        return {}
    names = {cell_name(c) for c in cells}
    return {
        row["cell"]: row
        for row in table.to_dict("records")
        if row.get("cell") in names
        and row.get("summary_version") == SUMMARY_VERSION
        and row.get("ci_unit") == CI_UNIT
    }


def full_grid_order(config: dict[str, Any]) -> tuple[Any, ...]:
    """The order the full grid runs in, so that a partial run holds whole slices: the
    conversation trace first, load 0.8, then the smallest cluster, each slice every design
    and router."""
    return (
        config["source"] != "mooncake-conversation",
        config["part"] != "routers",
        config["load"] != 0.8,
        config["replicas"],
        config["capacity_tokens"],
        config["load"],
    )


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(
        ["part", "source", "design", "replicas", "capacity_tokens", "load", "label", "event_lag_s"],
        na_position="first",
        kind="stable",
    ).reset_index(drop=True)


def _save_full(
    df: pd.DataFrame, out: Path, cells: Sequence[dict[str, Any]], executor: str, jobs: int, ran: int,
    t0: float,
) -> None:
    """The full grid's committed table (``results/routing_full/summary.csv``: the cells done so
    far, each with its wall time) and ``meta.json`` (how many of how many, by which executor)."""
    folder = out / FULL
    folder.mkdir(parents=True, exist_ok=True)
    _sorted(df).to_csv(folder / "summary.csv", index=False)
    done = int((df["part"] != "global").sum())
    meta = dict(scale="full", cells_total=len(cells), cells_done=done, executor=executor, jobs=jobs,
                last_run_cells=ran, last_run_wall_s=round(time.perf_counter() - t0, 1),
                cell_wall_s=round(float(df.loc[df["part"] != "global", "wall_s"].sum()), 1),
                date=time.strftime("%Y-%m-%d"), machine=machine(), loads=SCALE["full"]["loads"],
                routers=SCALE["full"]["routers"], clock=CLOCK)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def run(
    out: Path,
    scale: str = "default",
    force: bool = False,
    jobs: int = 2,
    executor: str = "joblib",
    address: str | None = None,
    clock: str = CLOCK,
    max_cells: int | None = None,
) -> Path:
    """Run ``scale``'s cells (the full scale under ``results/routing_full``, resumed from its
    summary: a cell it holds is not run again); ``max_cells`` runs only that many of the cells
    still missing (the table then holds those done so far, and says how many are)."""
    study = FULL if scale == "full" else STUDY
    cells, pooled = configs(scale, clock)
    done = {} if force else finished_rows(out / study / "summary", cells)
    todo = sorted((c for c in cells if cell_name(c) not in done), key=full_grid_order)
    if max_cells is not None:
        todo = todo[:max_cells]
    rows = list(done.values())
    missing = len(cells) - len(done)
    t0 = time.perf_counter()
    try:
        for i, row in enumerate(_cells(todo, out, force, jobs, executor, address, study), 1):
            rows.append(row)
            print(
                f"  routing {i}/{len(todo)} ({len(done)} done before): {row['source']} {row['design']} "
                f"{row['label']} x{row['replicas']} load {row['load']} lag {row['event_lag_s']} s  "
                f"hit {row['token_hit_rate']:.3f}  ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    finally:
        if scale == "full" and rows and len(rows) < len(cells):  # stopped or cut short: keep what it did
            _save_full(pd.DataFrame(rows), out, cells, executor, jobs, len(rows) - len(done), t0)
    if scale == "full" and len(todo) < missing:  # a part of the grid: its pooled bounds come last
        return out / FULL
    replays = run_cells(pooled, out, force=force, jobs=jobs)
    df = pd.concat(
        [pd.DataFrame(rows), replays.rename(columns={"hit_rate": "token_hit_rate"})], ignore_index=True
    )
    if scale == "full":
        _save_full(df, out, cells, executor, jobs, len(rows) - len(done), t0)
        return out / FULL
    s = SCALE[scale]
    save_study(
        _sorted(df),
        out,
        STUDY,
        {
            "scale": scale,
            "load": LOAD,
            "page_size": PAGE,
            "limit": s["limit"],
            "routers": s["routers"],
            "lags": s["lags"],
            "clock": clock,
            "clock_source": str(named_clock(clock)),
        },
    )
    return out / study


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--scale", default="default", choices=list(SCALE))
    ap.add_argument("--out", default="results")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--executor", choices=["joblib", "ray"], default="joblib")
    ap.add_argument("--address", default=None, help="a Ray cluster (with --executor ray)")
    ap.add_argument("--clock", default=CLOCK, help=f"cost_model.named_clock name (default {CLOCK}; cpu)")
    ap.add_argument("--max-cells", type=int, default=None,
                    help="run at most this many of the cells not done yet (the full grid spans sessions)")
    a = ap.parse_args(argv)
    if a.address and a.executor != "ray":
        ap.error("--address names a Ray cluster: it needs --executor ray")
    named_clock(a.clock)  # an unknown name fails here, listing the valid ones
    if a.max_cells is not None and a.max_cells < 0:
        ap.error("--max-cells must be >= 0")
    run(Path(a.out), a.scale, a.force, a.jobs, a.executor, a.address, a.clock, a.max_cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
