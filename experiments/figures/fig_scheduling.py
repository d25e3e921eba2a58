"""Figure: hit rate of each waiting-queue order as a share of the optimum (DFS order, infinite
cache), per workload, backend and capacity; SGLang reports 96% for its cache-aware policy.
Reads ``results/scheduling``; writes ``figures/scheduling`` and ``generated/scheduling.tex``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, save, write_macros

STUDY = "scheduling"
ORDER = ["fcfs", "lpm", "dfs-weight", "dfs-offline"]
SHORT = {"generated-shared-prefix": "GSP", "few-shot": "few-shot", "shared-doc-qa": "doc-QA",
         "rag": "RAG", "prefix-repetition": "prefix-rep."}


def with_ratio(df: pd.DataFrame) -> pd.DataFrame:
    opt = df[df["scheduler"] == "optimal"].set_index(["source", "seed", "backend"])["hit_rate"]
    runs = df[df["scheduler"] != "optimal"].copy()
    keys = zip(runs["source"], runs["seed"], runs["backend"], strict=True)
    runs["optimal"] = [opt[(s, int(seed), b)] for s, seed, b in keys]
    runs["pct_optimal"] = 100 * runs["hit_rate"] / runs["optimal"]
    runs["workload"] = runs["source"].map(lambda s: SHORT.get(s, s))
    return runs


def make(results: Path, paper: Path) -> list[Path]:
    runs = with_ratio(load(results, STUDY))
    g = sns.catplot(data=runs, x="workload", y="pct_optimal", hue="scheduler", hue_order=ORDER,
                    col="capacity_name", row="backend", kind="bar", errorbar=None, height=1.9, aspect=2.0,
                    legend_out=True)
    for ax in g.axes.flat:
        ax.axhline(96, color="black", lw=0.8, ls=":")
        ax.tick_params(axis="x", labelsize=7)
    g.set_axis_labels("", "% of optimal hit rate")
    out = [save(g.figure, "scheduling", paper)]

    def mean_pct(backend: str, cap: str, sched: str) -> float:
        sel = runs[(runs["backend"] == backend) & (runs["capacity_name"] == cap)
                   & (runs["scheduler"] == sched)]
        return float(sel["pct_optimal"].mean())

    values: dict[str, str] = {}
    names = {"fcfs": "Fcfs", "lpm": "Lpm", "dfs-weight": "DfsWeight", "dfs-offline": "DfsOffline"}
    for backend, bname in (("radix", "Radix"), ("hashchain", "Hash")):
        for cap, cname in (("ample", "Ample"), ("tight", "Tight")):
            for sched, sname in names.items():
                values[f"sched{sname}{bname}{cname}"] = fmt(mean_pct(backend, cap, sched))
    opt = runs.drop_duplicates(["source", "seed", "backend"])
    lpm = runs[runs["scheduler"] == "lpm"]
    values.update(
        schedOptMin=fmt(float(opt["optimal"].min()) * 100),
        schedOptMax=fmt(float(opt["optimal"].max()) * 100),
        schedLpmMin=fmt(float(lpm["hit_rate"].min()) * 100),
        schedLpmMax=fmt(float(lpm["hit_rate"].max()) * 100),
        schedWorkloads=str(runs["source"].nunique()),
        schedRequests=str(int(runs["requests"].max())),
    )
    out.append(write_macros(paper, "scheduling", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
