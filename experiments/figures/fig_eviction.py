"""Figure: vLLM's eviction-order choices ablated (free order, unhashed blocks first), with
radix-LRU as reference. Reads ``results/eviction``; writes ``figures/eviction`` and
``generated/eviction.tex``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, placeholder, save, write_macros

STUDY = "eviction"
VLLM = "vLLM (reverse, unhashed first)"


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    meta = json.loads((results / STUDY / "config.json").read_text())
    if df.empty or "skipped" in meta:
        return [placeholder("eviction", paper, "eviction ablation skipped: the hashchain backend\n"
                            "does not accept free_order / unhashed_first"),
                write_macros(paper, "eviction", {k: "n/a" for k in ("evMaxGain", "evMaxLoss", "evMeanLoss",
                                                                    "evRadixVsVllm")})]
    sources = list(dict.fromkeys(df["source"]))
    fig, axes = plt.subplots(1, len(sources), figsize=(3.0 * len(sources), 2.6), squeeze=False)
    for ax, source in zip(axes[0], sources, strict=True):
        d = df[df["source"] == source]
        for label, g in d.groupby("label", sort=False):
            g = g.sort_values("capacity_tokens")
            ax.plot(g["capacity_tokens"], g["hit_rate"], marker="o", ms=3, lw=1, label=label,
                    ls="--" if label == "radix-LRU" else "-")
        ax.set_xscale("log", base=2)
        ax.set_title(source, fontsize=8)
        ax.set_xlabel("capacity (tokens)")
    axes[0][0].set_ylabel("token hit rate")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    out = [save(fig, "eviction", paper)]
    piv = df.pivot_table(index=["source", "capacity_tokens"], columns="label", values="hit_rate")
    others = [c for c in piv.columns if c not in (VLLM, "radix-LRU")]
    delta = piv[others].sub(piv[VLLM], axis=0) * 100  # positive: the ablated variant wins
    values = {
        "evMaxGain": fmt(float(delta.max().max()), 2),
        "evMaxLoss": fmt(float(-delta.min().min()), 2),
        "evMeanLoss": fmt(float(-delta.mean().mean()), 2),
        "evRadixVsVllm": fmt(float((piv["radix-LRU"] - piv[VLLM]).abs().max()) * 100, 2),
    }
    out.append(write_macros(paper, "eviction", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
