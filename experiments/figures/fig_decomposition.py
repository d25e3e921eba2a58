"""Figure: the hashchain-vs-radix difference under eviction, decomposed into named causes.
Reads ``results/decomposition/causes.csv`` (the workloads, at the scale just run) and the
committed ``results/decomposition_full/causes.csv`` (its whole traces); writes
``figures/decomposition`` and ``generated/decomposition.tex``."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.figures.common import MOONCAKE_TRACES, refuse_stale_grid
from prefixcache.experiments.figures.plotting import figure_main, fmt, save, write_macros
from prefixcache.experiments.figures.study_decomposition import CAUSES, FULL, RUN_COUNTS, STUDY

RESIDUAL = "residual (no switch)"
COLORS = dict(zip(CAUSES, ["tab:blue", "tab:orange", "tab:green", "0.4", "tab:red", "tab:purple"],
                  strict=True))


def explained(causes: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the measured difference with its interval, the named causes' chain sum and
    whether it lies in that interval (the residual is what no switch names)."""
    named = causes[causes["cause"] != RESIDUAL].groupby(["source", "capacity_tokens"])["chain_pt"].sum()
    first = causes.groupby(["source", "capacity_tokens"]).first()
    out = first[["measured_pt", "measured_lo", "measured_hi", "same_page_pt"]].copy()
    out["named_sum_pt"] = named
    residual = causes[causes["cause"] == RESIDUAL]
    out["residual_pt"] = residual.set_index(["source", "capacity_tokens"])["chain_pt"]
    out["inside"] = (out["named_sum_pt"] >= out["measured_lo"]) & (out["named_sum_pt"] <= out["measured_hi"])
    return out


def is_trace(source: pd.Series) -> pd.Series:
    return source.str.startswith(tuple(MOONCAKE_TRACES))


def load_causes(results: Path) -> pd.DataFrame:
    """The workloads' rows of this run beside the committed full grid's whole-trace rows. The
    full grid must hold this run's cells with the same hits: a stale grid is refused."""
    causes = pd.read_csv(results / STUDY / "causes.csv")
    full = results / FULL / "causes.csv"
    if not full.exists():
        return causes
    refuse_stale_grid(results, STUDY, FULL, RUN_COUNTS, "decomposition-full")
    traces = pd.read_csv(full)
    workloads = causes[~is_trace(causes["source"])]
    return pd.concat([workloads, traces[is_trace(traces["source"])]], ignore_index=True)


def make(results: Path, paper: Path) -> list[Path]:
    causes = load_causes(results)
    cells = explained(causes)
    sources = list(dict.fromkeys(causes["source"]))
    fig, axes = plt.subplots(1, len(sources), figsize=(2.6 * len(sources), 2.8), squeeze=False)
    for ax, source in zip(axes[0], sources, strict=True):
        part = causes[causes["source"] == source]
        caps = sorted(part["capacity_tokens"].unique())
        x = np.arange(len(caps))
        up, down = np.zeros(len(caps)), np.zeros(len(caps))
        for cause in CAUSES:
            v = part[part["cause"] == cause].set_index("capacity_tokens").loc[caps, "chain_pt"].to_numpy()
            bottom = np.where(v >= 0, up, down)
            ax.bar(x, v, 0.6, bottom=bottom, color=COLORS[cause], label=cause)
            up, down = up + np.maximum(v, 0), down + np.minimum(v, 0)
        c = cells.loc[source].loc[caps]
        err = [c["measured_pt"] - c["measured_lo"], c["measured_hi"] - c["measured_pt"]]
        ax.errorbar(x + 0.38, c["measured_pt"], yerr=err, fmt="o", color="black", ms=3, lw=1,
                    capsize=2, label="measured (95% CI)")
        ax.plot(x, c["named_sum_pt"], "D", mfc="white", mec="black", ms=3, lw=0, label="named causes' sum")
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x, [f"{cap / 1e6:g}M" if cap >= 1e6 else f"{cap // 1024}k" for cap in caps])
        ax.set_title(source if source not in MOONCAKE_TRACES else f"{source} (whole)", fontsize=7)
        ax.set_xlabel("capacity (tokens)")
    axes[0][0].set_ylabel("radix p1 minus hashchain B=16\n(points of token hit rate)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=6, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = [save(fig, "decomposition", paper)]

    # The workloads' numbers and the whole traces' apart (the text gives them apart)
    work = causes[~is_trace(causes["source"])].set_index(["source", "capacity_tokens"])
    on_trace = is_trace(pd.Series(cells.index.get_level_values(0))).to_numpy()
    workload, trace = cells[~on_trace], cells[on_trace]

    def cause(name: str, column: str = "chain_pt") -> pd.Series:
        return work[work["cause"] == name][column]

    granularity = cause("eviction granularity")
    names = set(work.index.get_level_values(0))
    doc = granularity.xs("shared-doc-qa") if "shared-doc-qa" in names else None  # (tiny: absent)
    others = granularity.drop("shared-doc-qa", level=0, errors="ignore")
    values = {
        "decCells": str(len(workload)),
        "decInside": str(int(workload["inside"].sum())),
        "decMaxResidual": fmt(float(workload["residual_pt"].abs().max()), 2),
        "decMeasuredMin": fmt(float(workload["measured_pt"].min()), 2),
        "decMeasuredMax": fmt(float(workload["measured_pt"].max()), 2),
        "decSamePageMin": fmt(float(workload["same_page_pt"].min()), 2),
        "decPublicationMin": fmt(float(-cause("publication time").max()), 2),
        "decPublicationMax": fmt(float(-cause("publication time").min()), 2),
        "decOrderMax": fmt(float(cause("eviction order").abs().max()), 2),
        "decDuplicatesAloneMax": fmt(float(cause("duplicates", "alone_pt").abs().max()), 2),
        "decDuplicatesChainMax": fmt(float(cause("duplicates").abs().max()), 2),
        "decGranularityDocMax": fmt(float(-doc.min()), 2) if doc is not None else "n/a",
        "decGranularityDocCap": str(int(doc.idxmin()) // 1024) if doc is not None else "n/a",
        "decGranularityOtherMax": fmt(float(-others.min()), 2),
        "decPageMin": fmt(float(cause("page size").min()), 2),
        "decPageMax": fmt(float(cause("page size").max()), 2),
        "decSeeds": str(int(work["seeds"].max())),
        "decTraceCells": str(len(trace)),
        "decTraceInside": str(int(trace["inside"].sum())) if len(trace) else "n/a",
        "decTraceMeasuredMax": fmt(float(trace["measured_pt"].abs().max()), 2) if len(trace) else "n/a",
        "decTraceResidualMax": fmt(float(trace["residual_pt"].abs().max()), 2) if len(trace) else "n/a",
    }
    out.append(write_macros(paper, "decomposition", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
