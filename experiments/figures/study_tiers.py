"""Study: a host-memory tier under the device pool, in both designs (issue 16).

One engine serves a Mooncake trace with its timestamps rescaled so that the offered work is
``LOAD`` of what it could serve with no cache (the same arrivals for every cell of a trace).
The device pool holds ``gpu`` tokens; the host tier ``host`` more (0: none). Designs:

- hashchain B=16 with vLLM 0.33's OffloadingConnector (chunks of one block, CPU LRU; ARC at
  one point): stored as prompt blocks fill, visible once the store is acknowledged, loaded
  asynchronously (the request computes from the step after its load);
- radix page 16 with SGLang 0.5.23's HiCache (write_through; write_through_selective and
  write_back at one point): host copies of tree nodes, loaded at admission in the same forward.

Per cell: device and host hit rates (``stats.hits`` / ``stats.host_hits`` over the prompt
tokens), TTFT p50/p90/p99 on the simulated clock (by default the GPU roofline of Llama-3-8B on
an H100 SXM, ``CLOCK``, as in the TTFT and engine-trace studies; ``--clock cpu`` the clock
measured on this CPU: each cell records its clock's constants, and its arrival rescale is that
clock's) with host loads on a PCIe Gen5 link
(``prefixcache.tiers.HostLink``: Llama-3-8B's 128 KiB a token at 50 GB/s), bytes moved per
host-hit token, host evictions. Beside them, one device pool of ``gpu + host`` tokens (a
replay): the pooled hit rate a local host tier could at most recover.

Scales: ``default`` the first ``limit`` requests of each trace, host 0 or 10M tokens, the
variants at one point (about 15 minutes on 2 cores; the small default, in ``make reproduce``);
``full`` every request of both traces, device 1M or 3M, host 0, 10M, 50M or unbounded, every
write policy of each design at every host point and the pooled replay at every point (host 0
included: the device pool alone, replayed), and one pool of the host's size alone, replayed (a
host that keeps a copy of everything on the device holds at most that much: the inclusive
bound). "Unbounded": there is no host tier without a size
(vLLM sizes its CPU blocks and SGLang its host pool from a byte count), so it is a host of
``trace_tokens`` tokens, every prompt and output token of the trace, page-aligned: more than any
run can store (vLLM stores prompt blocks only, SGLang a token once per tree path), so it never
evicts, which the full table checks. The default scale writes ``results/tiers/summary``;
``--scale full`` (``make tiers-full``, hours: ``--traces``/``--gpus`` run part of the grid, and a
rerun skips finished cells) writes the committed ``results/tiers_full/``: ``summary.csv`` (hit
rates over the prompt tokens of the whole trace, the engine study's denominator, with 95%
intervals over conversations, and each tier cell's paired gap to its pooled bound),
``runtime.csv`` (each cell's wall time) and ``meta.json`` (the part of the grid it holds, the
executor, the wall time).

The full table (``full_table``): one row per cell, hit rates over every prompt token of the
whole trace (device, host, both: the engine study's ``token_hit_rate``), a 95% interval from a
bootstrap over conversations (``study_engine_traces.conversations``), and for each tier cell its
two bounds and the paired gaps to them (tier minus bound): the pooled rate (``pooled_hit_rate``,
``gap_to_pooled``, ``gap_lo``, ``gap_hi``) and the host-sized pool's (``host_pool_hit_rate``,
``host_pool_gap``, ``host_pool_gap_lo``, ``host_pool_gap_hi``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import grouped_ratio_ci95
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    cell_name,
    check_scale,
    executor_options,
    read_table,
    run_cells,
    save_study,
    study_main,
    trace_arrival_scale,
)

from prefixcache.cost_model import Clock, named_clock

STUDY = "tiers"
FULL = "tiers_full"  # the committed result of --scale full
CLOCK = "h100-llama3-8b"  # the default clock (cost_model.named_clock); "cpu" is the other
LOAD = 0.7
PAGE = 16
# label -> (backend, host tier fields besides the size)
DESIGNS: dict[str, tuple[str, dict[str, Any]]] = {
    "hashchain": ("hashchain", {}),
    "radix": ("radix", {"write_policy": "write_through"}),
}
# Variants at one (gpu, host) point: the store trigger and the host policy.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "hashchain-arc": ("hashchain", {"eviction_policy": "arc"}),
    "radix-selective": ("radix", {"write_policy": "write_through_selective"}),
    "radix-write-back": ("radix", {"write_policy": "write_back"}),
}
POLICIES = {**DESIGNS, **VARIANTS}  # every write policy of each design
UNBOUNDED = "unbounded"  # a host size: every token of the trace (``trace_tokens``)
SCALE = {
    "tiny": dict(
        traces=["mooncake-synthetic"],
        limit=60,
        gpus=[1 << 17],
        hosts=[0, 1 << 19],
        variant_at=(1 << 17, 1 << 19),
    ),
    "default": dict(
        traces=list(MOONCAKE_TRACES),
        limit=1000,  # 13.7M prompt tokens (conversation): a 10M host tier already holds them
        gpus=[1_000_000, 3_000_000],
        hosts=[0, 10_000_000],
        variant_at=(1_000_000, 10_000_000),
    ),
    "full": dict(
        traces=list(MOONCAKE_TRACES),
        limit=None,
        gpus=[1_000_000, 3_000_000],
        hosts=[0, 10_000_000, 50_000_000, UNBOUNDED],
        variant_at=None,  # every policy at every host point
    ),
}


def trace_tokens(source: str, limit: int | None) -> int:
    """Every prompt and output token of the trace's first ``limit`` requests, rounded up to a
    page: the "unbounded" host tier, which can never fill."""
    from prefixcache.experiments.inputs.traces import read_mooncake

    records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
    tokens = sum(r.input_length + r.output_length for r in records)
    return -(-tokens // PAGE) * PAGE


def host_size(host: int | str, source: str, limit: int | None) -> int:
    return trace_tokens(source, limit) if host == UNBOUNDED else int(host)


def host_name(host: int, source: str, limit: int | None) -> str:
    """How the tables name a host size: "0", "10M", ..., or "unbounded"."""
    if host and host == trace_tokens(source, limit):
        return UNBOUNDED
    return f"{host / 1e6:g}M" if host else "0"


def tier_cell(
    source: str,
    limit: int | None,
    scale: float,
    label: str,
    backend: str,
    gpu: int,
    host: int,
    fields: dict[str, Any],
    clock: Clock,
) -> dict[str, Any]:
    options = {"host_tier": dict(fields, capacity_tokens=host)} if host else {}
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=gpu,
        options=options,
        label=label,
        limit=limit,
        clock=clock,
    )
    c.update(part="tiers", host_tokens=host, arrival_scale=scale)
    return c


def pooled_cell(
    source: str, limit: int | None, label: str, backend: str, gpu: int, host: int
) -> dict[str, Any]:
    """The pooled bound of a (device, host) point: one device pool as large as both, replayed."""
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=gpu + host,
        mode="replay",
        label=f"pooled-{label}",
        limit=limit,
    )
    c.update(part="pooled", gpu_tokens=gpu, host_tokens=host)
    return c


def host_pool_cell(source: str, limit: int | None, label: str, backend: str, host: int) -> dict[str, Any]:
    """The inclusive bound of a host size: one device pool of the host's size alone, replayed."""
    c = cell_config(
        STUDY,
        source=source,
        backend=backend,
        page_size=PAGE,
        capacity_tokens=host,
        mode="replay",
        label=f"host-pool-{label}",
        limit=limit,
    )
    c.update(part="host-pool", host_tokens=host)
    return c


def configs(
    scale: str, clock: str = CLOCK, traces: list[str] | None = None, gpus: list[int] | None = None
) -> list[dict[str, Any]]:
    """Every cell of ``scale``; engine cells under ``clock`` (a ``named_clock`` name); of the
    full grid, only ``traces`` and ``gpus`` if given (a part of it, run first)."""
    s = SCALE[check_scale(scale)]
    for name, asked, grid in (("trace", traces, s["traces"]), ("device size", gpus, s["gpus"])):
        stray = set(asked or ()) - set(grid)
        if stray:
            raise ValueError(f"{sorted(stray)}: not a {name} of the {scale} scale; valid: {grid}")
    cost = named_clock(clock)
    everywhere = s["variant_at"] is None
    out = []
    for source in s["traces"]:
        if traces is not None and source not in traces:
            continue
        factor = trace_arrival_scale(source, s["limit"], cost, LOAD)
        for label, (backend, fields) in (POLICIES if everywhere else DESIGNS).items():
            for gpu in s["gpus"]:
                if gpus is not None and gpu not in gpus:
                    continue
                for name in s["hosts"]:
                    host = host_size(name, source, s["limit"])
                    if host == 0 and label not in DESIGNS:
                        continue  # no host tier: no write policy
                    out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
                    if label in DESIGNS and (host or everywhere):
                        out.append(pooled_cell(source, s["limit"], label, backend, gpu, host))
        if everywhere:  # the inclusive bound, one a host size (it has no device part)
            for label, (backend, _) in DESIGNS.items():
                for name in s["hosts"]:
                    if host := host_size(name, source, s["limit"]):
                        out.append(host_pool_cell(source, s["limit"], label, backend, host))
        else:
            gpu, host = s["variant_at"]
            for label, (backend, fields) in VARIANTS.items():
                out.append(tier_cell(source, s["limit"], factor, label, backend, gpu, host, fields, cost))
    return out


def full_table(cfgs: list[dict[str, Any]], cells: pd.DataFrame, out: Path) -> pd.DataFrame:
    """One row per cell (``results/tiers_full/summary.csv``; ``out`` holds the cells' folders)."""
    from prefixcache.experiments.figures.study_engine_traces import conversations

    groups: dict[str, np.ndarray] = {}
    hits: dict[str, np.ndarray] = {}  # cell -> hit tokens of each request, in trace order
    rows = []
    for c, row in zip(cfgs, cells.to_dict("records"), strict=True):
        df = read_table(out / STUDY / cell_name(c) / "requests")
        if df["rejected"].any():
            raise RuntimeError(f"{cell_name(c)}: {int(df['rejected'].sum())} requests larger than the pool")
        source = c["source"]
        if source not in groups:
            groups[source] = conversations(source, c["limit"])
        index = df["request_id"].str.rsplit("-", n=1).str[1].astype(int).to_numpy()  # "<source>-<i>"
        hit = np.zeros(len(groups[source]))
        hit[index] = df["hit_tokens"].to_numpy()
        prompt = np.zeros(len(groups[source]))
        prompt[index] = df["prompt_tokens"].to_numpy()
        hits[row["cell"]] = hit
        tier = c["part"] == "tiers"
        host_hits = tier_count(row, "host_hits")
        device_hits = int(row["hits"]) if tier else int(row["hit_tokens"])
        if device_hits + host_hits != int(row["hit_tokens"]):
            raise RuntimeError(
                f"{row['cell']}: device {device_hits} + host {host_hits} hits != {row['hit_tokens']}"
            )
        total = float(prompt.sum())
        lo, hi = grouped_ratio_ci95(hit, prompt, groups[source])
        host = int(c["host_tokens"])
        rows.append(
            dict(
                trace=source.removeprefix("mooncake-"),
                part=c["part"],
                design=c["backend"],
                label=c["label"],
                device_tokens=int(c["capacity_tokens"] if tier else c.get("gpu_tokens", 0)),
                host=host_name(host, source, c["limit"]),
                host_tokens=host,
                requests=int(row["requests"]),
                prompt_tokens=int(total),
                device_hit_tokens=device_hits,
                host_hit_tokens=host_hits,
                hit_tokens=int(row["hit_tokens"]),
                device_hit_rate=device_hits / total,
                host_hit_rate=host_hits / total,
                token_hit_rate=float(hit.sum()) / total,
                token_hit_rate_lo=lo,
                token_hit_rate_hi=hi,
                stored_tokens=tier_count(row, "stored_tokens"),
                loaded_tokens=tier_count(row, "loaded_tokens"),
                host_evicted_tokens=tier_count(row, "host_evicted_tokens"),
                device_evicted_tokens=int(row["evicted_tokens"]),
                ttft_p50_s=row.get("ttft_p50_s") if tier else None,
                ttft_p90_s=row.get("ttft_p90_s") if tier else None,
                ttft_p99_s=row.get("ttft_p99_s") if tier else None,
                preemptions=row.get("preemptions") if tier else None,
                cell=row["cell"],
                prompt=prompt,
            )
        )
    table = pd.DataFrame(rows)
    tiers = table["part"] == "tiers"
    for part, prefix, key in (
        ("pooled", "", ["trace", "design", "device_tokens", "host_tokens"]),
        ("host-pool", "host_pool_", ["trace", "design", "host_tokens"]),
    ):
        bounds = table[table["part"] == part].set_index(key)["cell"]
        columns = [f"{prefix}{c}" for c in ("bound_hit_rate", "gap", "gap_lo", "gap_hi")]
        table[columns] = np.nan
        for i, r in table[tiers].iterrows():
            bound = bounds.get(tuple(r[k] for k in key))
            if bound is None:
                continue
            gap = hits[r["cell"]] - hits[bound]  # paired: the same resamples of conversations
            lo, hi = grouped_ratio_ci95(gap, r["prompt"], groups["mooncake-" + r["trace"]])
            table.loc[i, columns] = [
                float(hits[bound].sum()) / r["prompt_tokens"],
                float(gap.sum()) / r["prompt_tokens"],
                lo,
                hi,
            ]
    names = {
        "bound_hit_rate": "pooled_hit_rate",
        "gap": "gap_to_pooled",
        "host_pool_bound_hit_rate": "host_pool_hit_rate",
    }
    table = table.rename(columns=names)
    unbounded = table[(table["host"] == UNBOUNDED) & (table["host_evicted_tokens"] > 0)]
    if not unbounded.empty:
        raise RuntimeError(f"an unbounded host tier evicted: {unbounded['cell'].tolist()}")
    return table.drop(columns=["prompt"])


def tier_count(row: dict[str, Any], name: str) -> int:
    """A host tier counter of a cell's summary row: 0 in a cell without a tier (no such column,
    or NaN where the table holds other cells' columns)."""
    value = row.get(name)
    return 0 if value is None or pd.isna(value) else int(value)


def write_full(
    out: Path, cfgs: list[dict[str, Any]], cells: pd.DataFrame, meta: dict[str, Any], wall_s: float
) -> Path:
    """``results/tiers_full/``: the table (no wall clock: reproducible), each cell's wall time
    and the run's meta (the part of the grid, the executor, this run's and the cells' time)."""
    table = full_table(cfgs, cells, out)
    folder = out / FULL
    folder.mkdir(parents=True, exist_ok=True)
    table.to_csv(folder / "summary.csv", index=False)
    runtime = cells[["cell", "wall_s"]].round({"wall_s": 1})
    runtime.to_csv(folder / "runtime.csv", index=False)
    from prefixcache.experiments.figures.study_whole_traces import machine

    meta.update(
        machine=machine(),
        wall_s=round(wall_s, 1),
        cell_wall_s=round(float(cells["wall_s"].sum()), 1),
        clock_source=str(named_clock(meta["clock"])),
    )
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{FULL}: {len(table)} cells -> {folder / 'summary.csv'}")
    return folder


def run(
    out: Path,
    scale: str = "default",
    force: bool = False,
    jobs: int = 2,
    clock: str = CLOCK,
    executor: str = "joblib",
    address: str | None = None,
    traces: list[str] | None = None,
    gpus: list[int] | None = None,
) -> Path:
    s = SCALE[check_scale(scale)]
    if scale != "full" and (traces or gpus):
        raise ValueError("--traces and --gpus pick a part of the full grid: they need --scale full")
    t0 = time.perf_counter()
    cfgs = configs(scale, clock, traces, gpus)
    df = run_cells(cfgs, out, force=force, jobs=jobs, executor=executor, address=address)
    if scale == "full":
        part = dict(traces=traces or s["traces"], gpus=gpus or s["gpus"])
        meta = dict(
            command=" ".join(sys.argv),
            date=time.strftime("%Y-%m-%d"),
            executor=executor,
            jobs=jobs,
            clock=clock,
            **part,
            cells=len(cfgs),
            grid_cells=len(configs(scale, clock)),
        )
        return write_full(out, cfgs, df, meta, time.perf_counter() - t0)
    save_study(
        df,
        out,
        STUDY,
        {
            "scale": scale,
            "load": LOAD,
            "page_size": PAGE,
            "limit": s["limit"],
            "designs": list(DESIGNS),
            "variants": list(VARIANTS),
            "clock": clock,
            "clock_source": str(named_clock(clock)),
        },
    )
    return out / STUDY


def full_options(ap: argparse.ArgumentParser) -> None:
    executor_options(ap)
    ap.add_argument(
        "--traces", nargs="+", choices=list(MOONCAKE_TRACES), help="full scale: only these traces"
    )
    ap.add_argument("--gpus", nargs="+", type=int, help="full scale: only these device sizes (tokens)")


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv, CLOCK, more=full_options)


if __name__ == "__main__":
    raise SystemExit(main())
