"""Figure: hit rate of each waiting-queue order as a share of the optimum (DFS order, infinite
cache), per workload, backend and capacity; SGLang reports 96% for its cache-aware policy.
Reads ``results/scheduling``; writes ``figures/scheduling`` and ``generated/scheduling.tex``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, save, write_macros

STUDY = "scheduling"
ORDER = ["fcfs", "lpm", "dfs-weight", "dfs-offline"]
SHORT = {"generated-shared-prefix": "shared-prefix", "few-shot": "few-shot", "shared-doc-qa": "doc-QA",
         "rag": "RAG", "prefix-repetition": "prefix-rep.", "multi-turn-chat": "chat",
         "tree-of-thought": "ToT", "react-agent": "agent"}


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
    runs["backend"] = runs["backend"].map({"radix": "radix (page 1)", "hashchain": "hashchain (B=16)"})
    seeds = runs["seed"].nunique()
    g = sns.catplot(data=runs, x="workload", y="pct_optimal", hue="scheduler", hue_order=ORDER,
                    col="capacity_name", row="backend", kind="bar", errorbar=("ci", 95), height=1.9,
                    aspect=2.0, legend_out=True, err_kws={"linewidth": 0.8}, seed=0)  # bootstrap CIs: fixed
    g.set_titles(row_template="{row_name}", col_template="{col_name} cache")
    for ax in g.axes.flat:
        ax.axhline(96, color="black", lw=0.8, ls=":")
        ax.tick_params(axis="x", labelsize=6, rotation=20)
    g.set_axis_labels("", "% of optimal hit rate")
    out = [save(g.figure, "scheduling", paper)]
    runs["backend"] = runs["backend"].str.split().str[0]
    values = headline_values(runs)
    values.update(wait_values(runs))
    opt = runs.drop_duplicates(["source", "seed", "backend"])
    lpm = runs[runs["scheduler"] == "lpm"]
    values.update(
        schedOptMin=fmt(float(opt["optimal"].min()) * 100),
        schedOptMax=fmt(float(opt["optimal"].max()) * 100),
        schedLpmMin=fmt(float(lpm["hit_rate"].min()) * 100),
        schedLpmMax=fmt(float(lpm["hit_rate"].max()) * 100),
        schedWorkloads=str(runs["source"].nunique()),
        schedRequests=str(int(runs["requests"].max())),
        schedSeeds=str(seeds),
    )
    out.append(write_macros(paper, "scheduling", values))
    return out


NAMES = {"fcfs": "Fcfs", "lpm": "Lpm", "dfs-weight": "DfsWeight", "dfs-offline": "DfsOffline"}
BACKENDS = (("radix", "Radix"), ("hashchain", "Hash"))
CAPS = (("ample", "Ample"), ("tight", "Tight"))


def headline_values(runs: pd.DataFrame) -> dict[str, str]:
    """Each scheduler's share of optimal, mean over workloads, with its 95% CI over seeds (the
    mean over workloads per seed is one sample); and where LPM helps over FCFS."""
    values: dict[str, str] = {}
    for backend, bname in BACKENDS:
        for cap, cname in CAPS:
            sel = runs[(runs["backend"] == backend) & (runs["capacity_name"] == cap)]
            for sched, sname in NAMES.items():
                per_seed = sel[sel["scheduler"] == sched].groupby("seed")["pct_optimal"].mean()
                mean, half = mean_ci95(per_seed.tolist())
                values[f"sched{sname}{bname}{cname}"] = fmt(mean)
                values[f"sched{sname}{bname}{cname}CI"] = fmt(half)
            gain = (sel[sel["scheduler"] == "lpm"].groupby("workload")["pct_optimal"].mean()
                    - sel[sel["scheduler"] == "fcfs"].groupby("workload")["pct_optimal"].mean())
            helps = sorted(w for w, d in gain.items() if d > 1.0)
            values[f"schedLpmHelps{bname}{cname}"] = ", ".join(helps) if helps else "none"
            rest = sorted(w for w in gain.index if w not in helps)
            values[f"schedLpmNoGain{bname}{cname}"] = ", ".join(rest) if rest else "none"
            values[f"schedLpmGainMax{bname}{cname}"] = fmt(float(gain.max()))
    return values


def wait_values(runs: pd.DataFrame) -> dict[str, str]:
    """Starvation: p50 and p99 of queueing wait and TTFT under LPM and FCFS (radix, tight cache),
    simulated seconds, mean over workloads and seeds."""
    sel = runs[(runs["backend"] == "radix") & (runs["capacity_name"] == "tight")]
    values = {}
    for sched in ("lpm", "fcfs"):
        d = sel[sel["scheduler"] == sched]
        for col, name in (("wait_p50_s", "WaitFifty"), ("wait_p99_s", "WaitNinetyNine"),
                          ("ttft_p50_s", "TtftFifty"), ("ttft_p99_s", "TtftNinetyNine")):
            values[f"sched{NAMES[sched]}{name}"] = fmt(float(d[col].mean()), 2)
    return values


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
