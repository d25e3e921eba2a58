"""Figure: hit rate against cache capacity (trace prefixes and synthetic workloads; four
caches and three ceilings), and the whole-trace block-LRU model at Mooncake's Fig. 9
capacities. Reads ``results/capacity``; writes ``figures/capacity`` and
``generated/capacity.tex``."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, save, write_macros

STUDY = "capacity"
STYLE = {
    "hashchain-lru": dict(color="#1f77b4", marker="o", ls="-"),
    "radix-lru": dict(color="#d62728", marker="x", ls="-"),
    "radix-lfu": dict(color="#ff7f0e", marker="^", ls="-"),
    "radix-slru": dict(color="#9467bd", marker="v", ls="-"),
    "belady": dict(color="#2ca02c", marker=None, ls="--"),
    "lru-model": dict(color="0.4", marker=None, ls=":"),
    "infinite": dict(color="black", marker=None, ls="-."),
}


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    df["hr"] = df["hit_tokens"] / df["prompt_tokens"]
    whole = load(results, STUDY, "whole_traces")
    sources = list(dict.fromkeys(df["source"]))
    ncols = 3
    nrows = -(-(len(sources) + 1) // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(7.2, 2.4 * nrows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(sources) + 1:]:
        ax.axis("off")
    axes = axes[: len(sources) + 1]
    for ax, source in zip(axes, sources, strict=False):
        d = df[df["source"] == source]
        for label, st in STYLE.items():
            g = d[d["label"] == label].sort_values("capacity_tokens")
            if len(g):
                ax.plot(g["capacity_tokens"], g["hr"], label=label, ms=4, lw=1, **st)
        n = int(d["requests"].max())
        ax.set_title(f"{source} ({n} req.)", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("capacity (tokens)")
    for ax in axes[: len(sources)]:
        ax.set_ylabel("token hit rate")
    axes[0].legend(fontsize=5)
    ax = axes[-1]
    for source, g in whole.groupby("source"):
        g = g.sort_values("capacity_tokens")
        ax.plot(g["capacity_tokens"], g["lru_fraction_of_infinite"], "o-", ms=3, label=source)
    for cap in (3_000_000, 50_000_000):
        ax.axvline(cap, color="0.5", lw=0.8, ls=":")
    ax.axhline(0.5, color="0.7", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("capacity (tokens)")
    ax.set_ylabel("block-LRU / infinite cache")
    ax.set_title("whole traces (512-token blocks)", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    out = [save(fig, "capacity", paper)]

    def frac(source: str, cap: int) -> float:
        row = whole[(whole["source"] == source) & (whole["capacity_tokens"] == cap)]
        return float(row["lru_fraction_of_infinite"].iloc[0]) * 100

    def block_inf(source: str) -> float:
        return float(whole[whole["source"] == source]["infinite_block_hit_rate"].iloc[0]) * 100

    conv, syn = "mooncake-conversation", "mooncake-synthetic"
    piv = df.pivot_table(index=["source", "capacity_tokens"], columns="label", values="hr")
    radix_best = piv[["radix-lru", "radix-lfu", "radix-slru"]].max(axis=1)
    values = {
        "capConvInfBlock": fmt(block_inf(conv)),
        "capSynInfBlock": fmt(block_inf(syn)),
        "capConvFracThreeM": fmt(frac(conv, 3_000_000)),
        "capConvFracFiftyM": fmt(frac(conv, 50_000_000)),
        "capSynFracThreeM": fmt(frac(syn, 3_000_000)),
        "capSynFracFiftyM": fmt(frac(syn, 50_000_000)),
        "capConvRequests": str(int(whole[whole["source"] == conv]["requests"].iloc[0])),
        "capSynRequests": str(int(whole[whole["source"] == syn]["requests"].iloc[0])),
        "capPrefixRequests": str(int(df[df["source"] == conv]["requests"].max())),
        "capPrefixConvInf": fmt(float(piv.loc[conv]["infinite"].max()) * 100),
        "capPrefixSynInf": fmt(float(piv.loc[syn]["infinite"].max()) * 100),
        "capHashVsModel": fmt(float((piv["hashchain-lru"] - piv["lru-model"]).abs().max()) * 100, 2),
        "capHashVsRadixLru": fmt(float((piv["hashchain-lru"] - piv["radix-lru"]).abs().max()) * 100, 2),
        "capRadixPolicyGain": fmt(float((radix_best - piv["hashchain-lru"]).max()) * 100),
        "capBeladyGap": fmt(float((piv["belady"] - piv[["hashchain-lru", "radix-lru", "radix-lfu",
                                                          "radix-slru"]].max(axis=1)).max()) * 100),
    }
    out.append(write_macros(paper, "capacity", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
