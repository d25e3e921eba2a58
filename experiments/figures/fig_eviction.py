"""Figure: vLLM's eviction-order choices ablated (free order, unhashed blocks first), with
radix-LRU as reference. Reads ``results/eviction``; writes ``figures/eviction`` and
``generated/eviction.tex``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from prefixcache.experiments.figures.plotting import figure_main, fmt, load, placeholder, save, write_macros
from prefixcache.experiments.figures.study_eviction import RADIX_PAGE

STUDY = "eviction"
VLLM = "vLLM (reverse, unhashed first)"


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    meta = json.loads((results / STUDY / "config.json").read_text())
    if df.empty or "skipped" in meta:
        return [placeholder("eviction", paper, "eviction ablation skipped: the hashchain backend\n"
                            "does not accept free_order / unhashed_first"),
                write_macros(paper, "eviction", {k: "n/a" for k in ("evMaxGain", "evMaxLoss", "evMeanLoss",
                                                                    "evRadixVsVllm", "evRadixPageVsVllm")})]
    sources = list(dict.fromkeys(df["source"]))
    piv = df.pivot_table(index=["source", "capacity_tokens"], columns="label", values="hit_rate")
    # The variants lie within a point of each other: plot each one's difference from vLLM's order
    # (and vLLM's own hit rate on a twin axis), not five curves on top of each other.
    fig, axes = plt.subplots(1, len(sources), figsize=(3.0 * len(sources), 2.6), squeeze=False)
    for ax, source in zip(axes[0], sources, strict=True):
        p = piv.loc[source].sort_index()
        for label in [c for c in p.columns if c != VLLM]:
            ax.plot(p.index, (p[label] - p[VLLM]) * 100, marker="o", ms=3, lw=1, label=label,
                    ls="--" if label.startswith("radix-LRU") else "-")
        ax.axhline(0, color="black", lw=0.8)
        twin = ax.twinx()
        twin.plot(p.index, p[VLLM], color="0.7", lw=0.8, ls=":")
        twin.set_ylabel("vLLM order's hit rate (dotted)", fontsize=6)
        twin.grid(False)
        twin.tick_params(labelsize=6)
        ax.set_xscale("log", base=2)
        ax.set_title(source, fontsize=8)
        ax.set_xlabel("capacity (tokens)")
    axes[0][0].set_ylabel("hit rate minus vLLM's order (points)")
    axes[0][0].legend(fontsize=5)
    fig.tight_layout()
    out = [save(fig, "eviction", paper)]
    others = [c for c in piv.columns if c not in (VLLM, "radix-LRU", RADIX_PAGE)]
    delta = piv[others].sub(piv[VLLM], axis=0) * 100  # positive: the ablated variant wins
    values = {
        "evMaxGain": fmt(float(delta.max().max()), 2),
        "evMaxLoss": fmt(float(-delta.min().min()), 2),
        "evMeanLoss": fmt(float(-delta.mean().mean()), 2),
        "evRadixVsVllm": fmt(float((piv["radix-LRU"] - piv[VLLM]).abs().max()) * 100, 2),
        "evRadixPageVsVllm": fmt(float((piv[RADIX_PAGE] - piv[VLLM]).abs().max()) * 100, 2),
    }
    out.append(write_macros(paper, "eviction", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
