"""Figure: mean time to first token against the achieved hit rate (SGLang Fig. 8a/b analogue)
at one load, and against load at the highest sharing, under the engine's cost model, with the
no-queue estimate; means over seeds with 95% confidence intervals. Reads ``results/ttft``;
writes ``figures/ttft`` and ``generated/ttft.tex``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.plotting import PALETTE, figure_main, fmt, load, save, write_macros
from prefixcache.experiments.figures.study_ttft import no_cache_capacity_rps

from prefixcache import CostModel

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


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    mid = sorted(df["utilisation"].unique())[len(df["utilisation"].unique()) // 2]
    high = float(df["shared_fraction"].max())
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 2.6))
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
    axes[0].set_title(f"utilisation {mid:.0%}", fontsize=8)
    axes[0].legend(fontsize=5)
    axes[1].set_xlabel("load (% of the no-cache prefill capacity)")
    axes[1].set_ylabel("mean TTFT (ms, simulated)")
    axes[1].set_title(f"shared prefix {high:.1%} of each prompt", fontsize=8)
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    out = [save(fig, "ttft", paper)]

    cached = at_mid[at_mid["backend"] != "none"]
    lo = cached[cached["shared_fraction"] == cached["shared_fraction"].min()]
    hi = cached[cached["shared_fraction"] == cached["shared_fraction"].max()]
    diff = cached.pivot_table(index="shared_fraction", columns="backend", values="mean")
    none_hi = sweep[(sweep["backend"] == "none")]["mean"]
    radix_hi = sweep[(sweep["backend"] == "radix")]["mean"]
    cost = CostModel(**json.loads(df["cost_model"].iloc[0]))  # the clock the cells ran under
    values = {
        "ttftLowHit": fmt(float(lo["hit_rate"].mean()) * 100),
        "ttftHighHit": fmt(float(hi["hit_rate"].mean()) * 100),
        "ttftLowMs": fmt(float(lo["mean"].mean()) * 1e3),
        "ttftHighMs": fmt(float(hi["mean"].mean()) * 1e3),
        "ttftHighCIMs": fmt(float(hi["ci"].max()) * 1e3),
        "ttftSpeedup": fmt(float(lo["mean"].mean() / hi["mean"].mean())),
        "ttftMaxBackendDiffMs": fmt(float((diff.max(axis=1) - diff.min(axis=1)).max()) * 1e3, 2),
        "ttftUtilMid": fmt(mid * 100, 0),
        "ttftUtilMin": fmt(float(df["utilisation"].min()) * 100, 0),
        "ttftUtilMax": fmt(float(df["utilisation"].max()) * 100, 0),
        "ttftSharedHigh": fmt(high * 100),
        "ttftNoneAtMaxMs": fmt(float(none_hi.iloc[-1]) * 1e3),
        "ttftRadixAtMaxMs": fmt(float(radix_hi.iloc[-1]) * 1e3),
        "ttftSeeds": str(df["seed"].nunique()),
        "ttftStepOverheadMs": fmt(cost.step_overhead_s * 1e3),
        "ttftPrefillUs": fmt(cost.prefill_token_s * 1e6, 0),
        "ttftDecodeUs": fmt(cost.decode_token_s * 1e6, 0),
        "ttftCapacityRps": fmt(no_cache_capacity_rps(cost)),
    }
    out.append(write_macros(paper, "ttft", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
