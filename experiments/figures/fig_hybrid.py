"""Figure and tables: hybrid layouts in both designs, at equal memory. Reads ``results/hybrid``
(and ``results/hybrid_traces`` if ``make hybrid-traces`` left it); writes ``figures/hybrid``,
``generated/hybrid.tex`` (built-in workloads), ``generated/hybrid_traces.tex`` (whole traces)
and ``generated/hybrid_values.tex``.

Each number is the mean over the built-in workloads of the mean over seeds, with the 95% CI
over seeds of that mean. Memory: the peak a request pins, in layer-token units per prompt token.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.plotting import (
    PALETTE,
    SOURCE_WORD,
    figure_main,
    fmt,
    load,
    save,
    write_macros,
    write_table_tex,
)
from prefixcache.experiments.figures.study_hybrid import LAYOUTS, STUDY, VARIANTS, load_traces

from prefixcache import ModelLayout

LABEL_COLOR = {"hashchain": PALETTE["hashchain"], "hashchain-dense": "#aec7e8", "radix-p1": PALETTE["radix"],
               "radix-p16": "#ff9896"}
# Macro spelling of each layout and design (LaTeX macro names are letters only).
LAYOUT_WORD = {"dense": "Dense", "gemma3-like": "Gemma", "gpt-oss-like": "Gptoss", "mamba-hybrid": "Mamba"}
LABEL_WORD = {"hashchain": "Hash", "hashchain-dense": "HashDense", "radix-p1": "RadixOne",
              "radix-p16": "RadixSixteen"}
STATE_WORD = {16: "Sixteen", 64: "SixtyFour", 176: "OneSeventySix", 528: "FiveTwentyEight"}


def summarise(df: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """Mean over workloads per seed, then mean and 95% CI over seeds, per ``keys``."""
    per_seed = df.groupby([*keys, "seed"], as_index=False)[metric].mean()
    rows = []
    for key, g in per_seed.groupby(keys):
        mean, half = mean_ci95(g[metric].tolist())
        named = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        rows.append(dict(named, mean=mean, ci=half))
    return pd.DataFrame(rows)


def pick(table: pd.DataFrame, **where: object) -> tuple[float, float] | None:
    t = table
    for k, v in where.items():
        t = t[t[k] == v]
    return None if t.empty else (float(t["mean"].iloc[0]), float(t["ci"].iloc[0]))


def show(value: tuple[float, float] | None, scale: float = 100, digits: int = 1, ci: bool = True) -> str:
    if value is None:
        return "--"
    mean, half = value[0] * scale, value[1] * scale
    if not ci or np.isnan(half):
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} $\\pm$ {fmt(half, digits)}"


def make(results: Path, paper: Path) -> list[Path]:
    everything = load(results, STUDY)
    main = everything[everything["part"].isna()] if "part" in everything else everything
    floor = everything[everything["part"] == "floor"] if "part" in everything else everything.iloc[:0]
    layouts = [lay for lay in LAYOUTS if lay in set(main["layout"])]
    labels = [v[0] for v in VARIANTS if v[0] in set(main["label"])]
    caps = sorted(int(c) for c in main["capacity_tokens"].unique())
    tight = caps[0]
    keys = ["layout", "label", "capacity_tokens"]
    # Memory as a share of what the same layers pin with full attention everywhere (1 unit per
    # token per layer): the layout's layer count divides the units.
    layers = main["layout"].map(lambda name: ModelLayout.parse(name).num_layers)
    main = main.assign(memory_share=main["peak_units_per_prompt_token"] / layers)
    hit, mem = summarise(main, "hit_rate", keys), summarise(main, "memory_share", keys)

    fig, axes = plt.subplots(1, 3, figsize=(7.2, 2.5), gridspec_kw={"width_ratios": [1.2, 1.2, 1]})
    width = 0.8 / len(labels)
    x = np.arange(len(layouts))
    for ax, table, title in ((axes[0], hit, f"hit rate, {tight // 1024}k tokens/layer"),
                             (axes[1], mem, "memory pinned, share of full attention")):
        t = table[table["capacity_tokens"] == tight]
        for i, label in enumerate(labels):
            s = t[t["label"] == label].set_index("layout").reindex(layouts)
            ax.bar(x + (i - (len(labels) - 1) / 2) * width, s["mean"], width, yerr=s["ci"].fillna(0),
                   color=LABEL_COLOR[label], label=label, capsize=1.5)
        ax.set_xticks(x, [lay.replace("-like", "").replace("-hybrid", "") for lay in layouts], fontsize=7)
        ax.set_title(title, fontsize=8)
    axes[0].set_ylabel("token hit rate")
    axes[1].set_ylabel("per prompt token and layer")
    axes[0].legend(fontsize=5.5, loc="lower left", ncol=2)
    if not floor.empty:
        fl = summarise(floor, "hit_rate", ["state_tokens", "label"])
        for label, g in fl.groupby("label"):
            g = g.sort_values("state_tokens")
            axes[2].errorbar(g["state_tokens"], g["mean"], yerr=g["ci"].fillna(0), marker="o", ms=3,
                             color=LABEL_COLOR[str(label)], label=str(label))
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("Mamba state size S (layer-tokens)", fontsize=7)
        axes[2].set_ylabel("token hit rate")
        axes[2].set_title("Mamba block floor", fontsize=8)
        axes[2].legend(fontsize=6)
    fig.tight_layout()
    out = [save(fig, STUDY, paper)]

    header = ["layout", "design"] + [f"hit \\% @ {c // 1024}k" for c in caps] + ["memory share"]
    rows = [[layout, label, *(show(pick(hit, layout=layout, label=label, capacity_tokens=c)) for c in caps),
             show(pick(mem, layout=layout, label=label, capacity_tokens=tight), scale=1, digits=2)]
            for layout in layouts for label in labels if pick(hit, layout=layout, label=label,
                                                               capacity_tokens=tight) is not None]
    out.append(write_table_tex(
        paper, STUDY, header, rows, "ll" + "r" * (len(caps) + 1),
        "Hybrid layouts at equal memory (tokens of KV per layer); built-in workloads, mean over "
        "workloads, 95\\% CI over seeds. hashchain: vLLM's engine default (retention 0); "
        "hashchain-dense: every block hashed. Memory share: the peak a request pins per prompt "
        "token and layer, against full attention in every layer (1).", "tab:hybrid"))

    values = {"hybWorkloads": str(main["source"].nunique()), "hybSeeds": str(main["seed"].nunique()),
              "hybCells": str(len(everything)), "hybTight": str(tight // 1024),
              "hybAmple": str(caps[-1] // 1024)}
    for layout in layouts:
        for label in labels:
            key = f"hyb{LAYOUT_WORD[layout]}{LABEL_WORD[label]}"
            for cap, word in ((tight, "Tight"), (caps[-1], "Ample")):
                at = pick(hit, layout=layout, label=label, capacity_tokens=cap)
                values[f"{key}Hit{word}"] = show(at, ci=False)
            at = pick(mem, layout=layout, label=label, capacity_tokens=tight)
            values[f"{key}Mem"] = show(at, 1, 2, ci=False)
    if not floor.empty:
        fl = summarise(floor, "hit_rate", ["state_tokens", "label"])
        for state in sorted(floor["state_tokens"].unique()):
            for label in ("hashchain", "radix-p1"):
                word = STATE_WORD[int(state)]
                values[f"hybFloor{LABEL_WORD[label]}{word}"] = show(
                    pick(fl, state_tokens=state, label=label), ci=False)
    out.append(traces_table(results, paper, values))
    out.append(write_macros(paper, "hybrid_values", values))
    return out


def traces_table(results: Path, paper: Path, values: dict[str, str]) -> Path:
    """The whole Mooncake traces (committed by ``make hybrid-traces``), or a line saying they
    were not run; fills the trace macros either way (``--`` when absent)."""
    df = load_traces(results)
    header = ["trace", "layout", "design", "hit \\%", "memory share", "evicted (M tokens)"]
    rows = []
    for source, sw in SOURCE_WORD.items():
        for layout in ("gemma3-like", "gpt-oss-like", "mamba-hybrid"):
            for label in ("hashchain", "radix-p16", "radix-p1"):
                key = f"hybTrace{sw}{LAYOUT_WORD[layout]}{LABEL_WORD[label]}"
                row = None if df is None else df[(df["source"] == source) & (df["layout"] == layout)
                                                 & (df["label"] == label)]
                if row is None or row.empty:
                    values[key] = "--"
                    continue
                r = row.iloc[0]
                values[key] = fmt(float(r["hit_rate"]) * 100)
                share = float(r["peak_units_per_prompt_token"]) / ModelLayout.parse(layout).num_layers
                rows.append([source.removeprefix("mooncake-"), layout, label, fmt(float(r["hit_rate"]) * 100),
                             fmt(share, 2), fmt(float(r["evicted_tokens"]) / 1e6)])
    if not rows:
        rows = [["\\multicolumn{6}{l}{not run here: \\texttt{make hybrid-traces} writes them}"]]
    return write_table_tex(
        paper, "hybrid_traces", header, rows, "lllrrr",
        "Hybrid layouts over the whole Mooncake traces, 3M tokens of KV per layer (chunked "
        "replay, 2048-token chunks; hashchain at retention 0; SGLang's Mamba cache at page 1).",
        "tab:hybrid-traces")


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
