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
replicas x 1M tokens (about 40 s a cell on 2 cores); ``full`` every request of both traces on
4, 8 and 16 replicas x 1M and 3M tokens (432 cells of minutes each: run it on Ray with
``--executor ray [--address ADDR]``).

Writes ``results/routing/summary`` (one row per cell).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from functools import partial
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import grouped_ratio_ci95
from prefixcache.experiments.analysis.routing import hit_rates, imbalance, prediction_error
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    SUMMARY_VERSION,
    cell_config,
    cell_name,
    check_scale,
    run_cells,
    save_study,
    trace_arrival_scale,
    write_table,
)
from prefixcache.experiments.figures.study_engine_traces import conversations_by_id

from prefixcache import CacheConfig, make_cache
from prefixcache.cluster import Cluster, make_router
from prefixcache.cost_model import clock_from_constants, named_clock

STUDY = "routing"
CLOCK = "h100-llama3-8b"  # the default clock (cost_model.named_clock); "cpu" is the other
LOAD = 0.7  # offered work / what the replicas serve with no cache
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
    ("llm-d", "llm-d", {"prefix": "approximate"}, False),
    ("llm-d-precise", "llm-d", {"prefix": "precise"}, True),
    ("production-stack", "production-stack", {}, False),
    ("ray-serve", "ray-serve", {}, False),
    ("preble", "preble", {}, False),
    ("oracle", "oracle", {}, False),
]
LAGS_S = [0.0, 1.0, 10.0, 100.0, 1000.0]  # the rescaled trace sends a request every ~2 s
SCALE = {
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
    ),
    "default": dict(
        traces=["mooncake-conversation"],
        side_traces=["mooncake-conversation"],
        side_designs=["hashchain"],
        limit=1000,
        replicas=[4],
        capacities=[1_000_000],
        routers=[r[0] for r in ROUTERS],
        lags=LAGS_S,
        global_replicas=[2, 4, 8],
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
        load=LOAD,
        token_budget=2048,
        seed=0,
        cost_model=named_clock(clock).constants(),
        clock=clock,
    )


def configs(scale: str, clock: str = CLOCK) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cluster cells, pooled-cache replay cells), cluster cells under ``clock``. The lag and
    local-vs-global parts run on ``side_traces`` x ``side_designs`` only."""
    s = SCALE[check_scale(scale)]
    limit = s["limit"]
    exact = [label for label, *_, events in ROUTERS if events and label in s["routers"]]
    out, pooled = [], []
    for source in s["traces"]:
        side = source in s["side_traces"]
        for n, cap, design in product(s["replicas"], s["capacities"], DESIGNS):
            cell = partial(
                cluster_config, source=source, design=design, replicas=n, capacity=cap, limit=limit,
                clock=clock,
            )
            out += [cell(router=label) for label in s["routers"]]
            if side and design in s["side_designs"]:  # lag 0 is the routers part's cell
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
                    )
                )
            backend, page = DESIGNS[design]
            c = cell_config(
                STUDY,
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


def run_cluster_cell(config: dict[str, Any], out_root: Path, force: bool = False) -> dict[str, Any]:
    """Run (or read back) one cluster cell; returns its summary row."""
    folder = out_root / STUDY / cell_name(config)
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
    reqs = rescaled_requests(config)
    n = config["replicas"]
    options = {"kv_events": True} if config["kv_events"] else {}
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
    routes = cluster.run(reqs)
    for cache in caches:  # every usable page accounted for in every replica
        if sum(cache.usage()) != cache.num_usable_pages():
            raise RuntimeError(f"{cell_name(config)}: page accounting broken: {cache.usage()}")
    df = pd.DataFrame([asdict(r) for r in routes])
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
    todo: Sequence[dict[str, Any]], out: Path, force: bool, jobs: int, executor: str, address: str | None
) -> Iterator[dict[str, Any]]:
    if executor == "ray":
        from prefixcache.experiments.sweep import ray_session

        with ray_session(address, num_cpus=jobs) as ray:
            task = ray.remote(run_cluster_cell)
            pending = [task.remote(c, out.resolve(), force) for c in todo]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        return
    from joblib import Parallel, delayed

    yield from Parallel(n_jobs=jobs, return_as="generator")(
        delayed(run_cluster_cell)(c, out, force) for c in todo
    )


def run(
    out: Path,
    scale: str = "default",
    force: bool = False,
    jobs: int = 2,
    executor: str = "joblib",
    address: str | None = None,
    clock: str = CLOCK,
) -> Path:
    cells, pooled = configs(scale, clock)
    rows = []
    t0 = time.perf_counter()
    for i, row in enumerate(_cells(cells, out, force, jobs, executor, address), 1):
        rows.append(row)
        print(
            f"  routing {i}/{len(cells)}: {row['source']} {row['design']} {row['label']} "
            f"lag {row['event_lag_s']} s  hit {row['token_hit_rate']:.3f}  "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    replays = run_cells(pooled, out, force=force, jobs=jobs)
    df = pd.concat(
        [pd.DataFrame(rows), replays.rename(columns={"hit_rate": "token_hit_rate"})], ignore_index=True
    )
    df = df.sort_values(
        ["part", "source", "design", "replicas", "capacity_tokens", "label", "event_lag_s"],
        na_position="first",
        kind="stable",
    ).reset_index(drop=True)
    s = SCALE[scale]
    save_study(
        df,
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
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--scale", default="default", choices=list(SCALE))
    ap.add_argument("--out", default="results")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--executor", choices=["joblib", "ray"], default="joblib")
    ap.add_argument("--address", default=None, help="a Ray cluster (with --executor ray)")
    ap.add_argument("--clock", default=CLOCK, help=f"cost_model.named_clock name (default {CLOCK}; cpu)")
    a = ap.parse_args(argv)
    if a.address and a.executor != "ray":
        ap.error("--address names a Ray cluster: it needs --executor ray")
    named_clock(a.clock)  # an unknown name fails here, listing the valid ones
    run(Path(a.out), a.scale, a.force, a.jobs, a.executor, a.address, a.clock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
