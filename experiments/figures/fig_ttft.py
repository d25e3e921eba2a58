"""Figure: mean time to first token against the achieved hit rate (SGLang Fig. 8a/b analogue)
at one load, and against load at the highest sharing, with the no-queue estimate; one row per
clock (the GPU roofline first, the CPU-measured clock below); means over seeds with 95%
confidence intervals. Reads ``results/ttft``;
writes ``figures/ttft`` and ``generated/ttft.tex``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.plotting import PALETTE, figure_main, fmt, load, save, write_macros
from prefixcache.experiments.figures.study_ttft import CLOCKS, no_cache_capacity_rps

from prefixcache import CostModel, RooflineClock
from prefixcache.cost_model import clock_from_constants, named_clock

STUDY = "ttft"


MARKERS = {"radix": ("o", "-"), "hashchain": ("s", "--"), "none": ("x", ":")}


def per_point(df: pd.DataFrame, by: list[str], column: str) -> pd.DataFrame:
    """Mean of ``column`` over seeds and its 95% CI half-width, per (backend, *by)."""
    rows = []
    for key, g in df.groupby(["backend", *by]):
        mean, half = mean_ci95(g.groupby("seed")[column].mean().tolist())
        rows.append(dict(zip(["backend", *by], key, strict=True), mean=mean, ci=half,
                         hit_rate=float(g["hit_rate"].mean())))
    return pd.DataFrame(rows)


CLOCK_TITLES = {"h100-llama3-8b": "H100 roofline (Llama-3-8B)", "cpu": "CPU-measured clock"}


def draw_row(df: pd.DataFrame, axes: Any, title: str) -> dict[str, Any]:
    """One clock's two panels (TTFT against the hit rate at the middle load; against load at
    the highest sharing); returns what the macros read."""
    mid = sorted(df["utilisation"].unique())[len(df["utilisation"].unique()) // 2]
    high = float(df["shared_fraction"].max())
    at_mid = per_point(df[df["utilisation"] == mid], ["shared_fraction"], "ttft_mean_s")
    iso = per_point(df[df["utilisation"] == mid], ["shared_fraction"], "isolated_ttft_mean_s")
    sweep = per_point(df[df["shared_fraction"] == high], ["utilisation"], "ttft_mean_s")
    for backend, (marker, ls) in MARKERS.items():
        c = PALETTE.get(backend, "0.3")
        g = at_mid[at_mid["backend"] == backend].sort_values("shared_fraction")
        axes[0].errorbar(g["hit_rate"] * 100, g["mean"] * 1e3, yerr=g["ci"] * 1e3, marker=marker, ls=ls,
                         color=c, ms=4, lw=1, capsize=2, label=f"{backend} (queued)")
        h = iso[iso["backend"] == backend].sort_values("shared_fraction")
        axes[0].plot(h["hit_rate"] * 100, h["mean"] * 1e3, ls=":", color=c, lw=0.8,
                     label=f"{backend} (no queue)")
        u = sweep[sweep["backend"] == backend].sort_values("utilisation")
        axes[1].errorbar(u["utilisation"] * 100, u["mean"] * 1e3, yerr=u["ci"] * 1e3, marker=marker, ls=ls,
                         color=c, ms=4, lw=1, capsize=2, label=backend)
    axes[0].set_xlabel("achieved token hit rate (%)")
    axes[0].set_ylabel("mean TTFT (ms, simulated)")
    axes[0].set_title(f"{title}: load {mid:.0%}", fontsize=7)
    axes[0].legend(fontsize=5)
    axes[1].set_xlabel("load (% of the no-cache capacity,\nprefill and decode)")
    axes[1].set_ylabel("mean TTFT (ms, simulated)")
    axes[1].set_title(f"{title}: {high:.1%} of each prompt shared", fontsize=7)
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=6)
    return dict(mid=mid, high=high, at_mid=at_mid, sweep=sweep)


def clock_values(df: pd.DataFrame, row: dict[str, Any], prefix: str) -> dict[str, str]:
    """The macros of one clock's row, named ``<prefix>LowHit`` and so on."""
    at_mid, sweep = row["at_mid"], row["sweep"]
    cached = at_mid[at_mid["backend"] != "none"]
    lo = cached[cached["shared_fraction"] == cached["shared_fraction"].min()]
    hi = cached[cached["shared_fraction"] == cached["shared_fraction"].max()]
    diff = cached.pivot_table(index="shared_fraction", columns="backend", values="mean")
    none_hi = sweep[(sweep["backend"] == "none")]["mean"]
    radix_hi = sweep[(sweep["backend"] == "radix")]["mean"]
    cost = clock_from_constants(json.loads(df["cost_model"].iloc[0]))  # the clock the cells ran under
    values = {
        "LowHit": fmt(float(lo["hit_rate"].mean()) * 100),
        "HighHit": fmt(float(hi["hit_rate"].mean()) * 100),
        "LowMs": fmt(float(lo["mean"].mean()) * 1e3),
        "HighMs": fmt(float(hi["mean"].mean()) * 1e3),
        "HighCIMs": fmt(float(hi["ci"].max()) * 1e3),
        "Speedup": fmt(float(lo["mean"].mean() / hi["mean"].mean())),
        "MaxBackendDiffMs": fmt(float((diff.max(axis=1) - diff.min(axis=1)).max()) * 1e3, 2),
        "UtilMid": fmt(row["mid"] * 100, 0),
        "UtilMin": fmt(float(df["utilisation"].min()) * 100, 0),
        "UtilMax": fmt(float(df["utilisation"].max()) * 100, 0),
        "SharedHigh": fmt(row["high"] * 100),
        "NoneAtMaxMs": fmt(float(none_hi.iloc[-1]) * 1e3),
        "RadixAtMaxMs": fmt(float(radix_hi.iloc[-1]) * 1e3),
        "Seeds": str(df["seed"].nunique()),
        "CapacityRps": fmt(no_cache_capacity_rps(cost)),
        "StepOverheadMs": fmt(cost.step_overhead_s * 1e3),
    }
    return {prefix + k: v for k, v in values.items()}


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    clocks = [c for c in CLOCKS if c in set(df["clock"])]
    fig, axes = plt.subplots(len(clocks), 2, figsize=(7.0, 2.6 * len(clocks)), squeeze=False)
    values: dict[str, str] = {}
    for axes_row, clock in zip(axes, clocks, strict=True):
        part = df[df["clock"] == clock]
        row = draw_row(part, axes_row, CLOCK_TITLES[clock])
        values |= clock_values(part, row, "ttftGpu" if clock != "cpu" else "ttft")
    fig.tight_layout()
    out = [save(fig, "ttft", paper)]
    cpu = clock_from_constants(json.loads(df[df["clock"] == "cpu"]["cost_model"].iloc[0]))
    assert isinstance(cpu, CostModel)
    values |= {"ttftPrefillUs": fmt(cpu.prefill_token_s * 1e6, 0),
               "ttftDecodeUs": fmt(cpu.decode_token_s * 1e6, 0)}
    gpu = named_clock(CLOCKS[0])
    assert isinstance(gpu, RooflineClock)
    weights_s = gpu.work(1, 1, 1, 0).weight_bytes / gpu.gpu.hbm_bytes_per_s  # every step's floor
    values |= {"ttftGpuPeakTflops": fmt(gpu.gpu.peak_flops / 1e12),
               "ttftGpuHbmTBs": fmt(gpu.gpu.hbm_bytes_per_s / 1e12, 2),
               "ttftGpuWeightsMs": fmt(weights_s * 1e3)}
    out.append(write_macros(paper, "ttft", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
