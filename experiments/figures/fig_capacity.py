"""Figure: hit rate against cache capacity (trace prefixes and synthetic workloads; four
caches and three ceilings), and the whole traces' block model (LRU, Belady, infinite; C2).
Reads ``results/capacity`` and ``results/whole_traces/hit_rates.csv``; writes
``figures/capacity`` and ``generated/capacity.tex``."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, save, write_macros
from prefixcache.experiments.figures.study_whole_traces import fraction_of_infinite, hit_rate, load_hit_rates

TRACE_SOURCES = ("mooncake-conversation", "mooncake-synthetic")

STUDY = "capacity"
STYLE = {
    "hashchain-lru": dict(color="#1f77b4", marker="o", ls="-"),
    "radix-lru": dict(color="#d62728", marker="x", ls="-"),
    "radix-lfu": dict(color="#ff7f0e", marker="^", ls="-"),
    "radix-slru": dict(color="#9467bd", marker="v", ls="-"),
    # The model lines are drawn on top, with marks of their own, so that one which coincides
    # with a cache's line (lru-model with hashchain-lru; Belady with LRU on a short prefix) shows.
    "belady": dict(color="#2ca02c", marker="d", ls="--", zorder=5, mfc="none"),
    "lru-model": dict(color="0.2", marker="+", ls=":", zorder=6),
    "infinite": dict(color="black", marker=None, ls="-.", zorder=4),
}


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    df["hr"] = df["hit_tokens"] / df["prompt_tokens"]
    whole = load_hit_rates(results)
    model = whole[(whole["backend"] == "block-model") & (whole["convention"] == "C2")]
    sources = list(dict.fromkeys(df["source"]))
    ncols = 3
    nrows = -(-(len(sources) + 2) // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(7.2, 2.3 * nrows + 0.5), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(sources) + 2:]:
        ax.axis("off")
    for ax, source in zip(axes, sources, strict=False):
        d = df[df["source"] == source]
        for label, st in STYLE.items():
            g = d[d["label"] == label].sort_values("capacity_tokens")
            if len(g):
                ax.plot(g["capacity_tokens"], g["hr"], label=label, ms=4, lw=1, **st)
        n = int(d["requests"].max())
        ax.set_title(f"{source} (first {n} req.)" if source in TRACE_SOURCES else f"{source} ({n} req.)",
                     fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("capacity (tokens)")
        ax.set_ylabel("token hit rate")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=6, frameon=False)
    rates, fractions = axes[len(sources)], axes[len(sources) + 1]
    for (trace, g), color in zip(model.groupby("trace"), ("#1f77b4", "#d62728"), strict=False):
        finite = g[g["policy"] != "infinite"].astype({"capacity_tokens": float})
        lru = finite[finite["policy"] == "lru"].sort_values("capacity_tokens")
        opt = finite[finite["policy"] == "belady"].sort_values("capacity_tokens")
        inf = float(g[g["policy"] == "infinite"]["token_hit_rate"].iloc[0])
        rates.plot(lru["capacity_tokens"], lru["token_hit_rate"], "o-", color=color, ms=3, lw=1,
                   label=f"{trace}: LRU")
        rates.plot(opt["capacity_tokens"], opt["token_hit_rate"], "--", color=color, lw=1,
                   label=f"{trace}: Belady")
        rates.axhline(inf, color=color, lw=0.8, ls=":")
        share = lru["token_hit_rate"].to_numpy() / opt["token_hit_rate"].to_numpy()
        fractions.plot(lru["capacity_tokens"], share, "o-", color=color, ms=3, lw=1, label=trace)
    for ax in (rates, fractions):
        for cap in (3_000_000, 50_000_000):
            ax.axvline(cap, color="0.5", lw=0.8, ls=":")
        ax.set_xscale("log", base=10)
        ax.set_xlabel("capacity (tokens)")
    rates.set_ylabel("token hit rate (C2)")
    rates.set_title("whole traces, block model", fontsize=8)
    rates.legend(fontsize=5)
    fractions.set_ylabel("LRU / Belady (C2)")
    fractions.set_ylim(0, 1.05)
    fractions.set_title("whole traces: LRU / optimum", fontsize=8)
    fractions.legend(fontsize=6)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = [save(fig, "capacity", paper)]

    def rate(trace: str, policy: str, convention: str, cap: float, column: str = "token_hit_rate") -> float:
        return hit_rate(whole, trace, policy, cap, convention=convention, column=column) * 100

    def share_of_optimum(trace: str) -> float:
        return rate(trace, "lru", "C2", 3e6) / rate(trace, "belady", "C2", 3e6)

    piv = df.pivot_table(index=["source", "capacity_tokens"], columns="label", values="hr")
    radix_best = piv[["radix-lru", "radix-lfu", "radix-slru"]].max(axis=1)
    inf = float("inf")
    values = {
        "capConvInfBlock": fmt(rate("conversation", "infinite", "C1", inf, "block_hit_rate")),
        "capSynInfBlock": fmt(rate("synthetic", "infinite", "C1", inf, "block_hit_rate")),
        "capConvInfToken": fmt(rate("conversation", "infinite", "C2", inf)),
        "capSynInfToken": fmt(rate("synthetic", "infinite", "C2", inf)),
        "capConvLruThreeM": fmt(rate("conversation", "lru", "C2", 3e6)),
        "capSynLruThreeM": fmt(rate("synthetic", "lru", "C2", 3e6)),
        "capConvBeladyThreeM": fmt(rate("conversation", "belady", "C2", 3e6)),
        "capSynBeladyThreeM": fmt(rate("synthetic", "belady", "C2", 3e6)),
        "capConvLruFiftyM": fmt(rate("conversation", "lru", "C2", 5e7)),
        "capConvFracThreeM": fmt(fraction_of_infinite(whole, "conversation", "lru", "C2", 3e6) * 100),
        "capConvFracFiftyM": fmt(fraction_of_infinite(whole, "conversation", "lru", "C2", 5e7) * 100),
        "capSynFracThreeM": fmt(fraction_of_infinite(whole, "synthetic", "lru", "C2", 3e6) * 100),
        "capSynFracFiftyM": fmt(fraction_of_infinite(whole, "synthetic", "lru", "C2", 5e7) * 100),
        "capConvLruOfBeladyThreeM": fmt(share_of_optimum("conversation") * 100),
        "capSynLruOfBeladyThreeM": fmt(share_of_optimum("synthetic") * 100),
        "capConvRequests": str(int(whole[whole["trace"] == "conversation"]["requests"].iloc[0])),
        "capSynRequests": str(int(whole[whole["trace"] == "synthetic"]["requests"].iloc[0])),
        "capPrefixRequests": str(int(df[df["source"] == TRACE_SOURCES[0]]["requests"].max())),
        "capPrefixConvInf": fmt(float(piv.loc[TRACE_SOURCES[0]]["infinite"].max()) * 100),
        "capPrefixSynInf": fmt(float(piv.loc[TRACE_SOURCES[1]]["infinite"].max()) * 100),
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
