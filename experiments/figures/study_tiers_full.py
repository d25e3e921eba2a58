"""The tier study's full grid (``study_tiers --scale full``): its table and the committed
folder ``results/tiers_full/``.

``summary.csv`` has one row per cell: hit rates over every prompt token of the whole trace
(device, host, both: the engine study's ``token_hit_rate``), a 95% interval from a bootstrap
over conversations (``study_engine_traces.conversations``), and for each tier cell its two
bounds and the paired gaps to them (tier minus bound): the pooled rate (``pooled_hit_rate``,
``gap_to_pooled``, ``gap_lo``, ``gap_hi``) and the host-sized pool's (``host_pool_hit_rate``,
``host_pool_gap``, ``host_pool_gap_lo``, ``host_pool_gap_hi``). ``runtime.csv``: each cell's
wall time; ``meta.json``: the part of the grid it holds, the executor and the run's time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import grouped_ratio_ci95
from prefixcache.experiments.figures.common import cell_name, read_table
from prefixcache.experiments.figures.study_tiers import STUDY, UNBOUNDED, host_name

from prefixcache.cost_model import named_clock

FULL = "tiers_full"  # the committed result of --scale full


def full_table(cfgs: list[dict[str, Any]], cells: pd.DataFrame, out: Path) -> pd.DataFrame:
    """One row per cell (the module's ``summary.csv``; ``out`` holds the cells' folders)."""
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
    print(f"{STUDY}: {len(table)} cells -> {folder / 'summary.csv'}")
    return folder
