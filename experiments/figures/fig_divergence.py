"""Figure: how far a cache hit's logits are from a full recompute's, per dtype, page size and
model mode (default, batch-invariant): every run's largest logit difference and the change of
the top token's log-probability, bit-identical runs on the floor. Reads
``results/divergence_measured`` (committed, ``make divergence``) or a run at another scale in
``results/divergence``; writes ``figures/divergence`` and ``generated/divergence.tex``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.divergence import DTYPES, TINY_MODEL, WHOLE
from prefixcache.experiments.analysis.metrics import mean_ci95
from prefixcache.experiments.figures.plotting import PALETTE, figure_main, fmt, load, save, write_macros
from prefixcache.experiments.figures.study_divergence import MAIN_MODES, STUDY, measured_summary

# Macro names are letters only.
DTYPE_WORDS = {"fp32": "Single", "fp16": "Half", "bf16": "Brain"}
METRICS = [("max_abs_diff", r"max$_v$ |$\Delta$ logit|"), ("top1_logprob_diff", r"|$\Delta$ log p(top-1)|")]
FLOOR = 1e-9  # where a difference of exactly 0 is drawn on the log axis
MARKERS = {"hashchain": "s", "radix": "o"}


def jitter(n: int, width: float) -> np.ndarray:
    """Evenly spread offsets for n points (deterministic: the figure is byte-identical on rerun)."""
    return np.linspace(-width / 2, width / 2, n) if n > 1 else np.zeros(n)


def draw(ax: plt.Axes, df: pd.DataFrame, column: str, dtypes: list[str], counts: bool) -> None:
    """One strip per (dtype, mode, backend): default mode in the backend's colour, the
    batch-invariant mode in black, to the right of it; ``counts``: how many of the strip's
    runs differ at all, above it."""
    backends = [b for b in MARKERS if b in set(df["backend"])]
    slots = [(mode, backend) for mode in MAIN_MODES for backend in backends]
    width = 0.8 / len(slots)
    for x, dtype in enumerate(dtypes):
        for k, (mode, backend) in enumerate(slots):
            g = df[(df["dtype"] == dtype) & (df["mode"] == mode) & (df["backend"] == backend)]
            if g.empty:
                continue
            g = g.sort_values(["seed", "chunk"])
            y = g[column].clip(lower=FLOOR).to_numpy()
            centre = x - 0.4 + (k + 0.5) * width
            colour = PALETTE[backend] if mode == "default" else "black"
            ax.scatter(centre + jitter(len(g), 0.7 * width), y, s=7, marker=MARKERS[backend],
                       facecolors="none", edgecolors=colour, linewidths=0.6, label=f"{backend}, {mode}")
            if counts:
                ax.text(centre, 0.97, f"{int((~g['bit_identical']).sum())}/{len(g)}", ha="center", va="top",
                        fontsize=5, color=colour, transform=ax.get_xaxis_transform())
    ax.set_yscale("log")
    ax.set_ylim(FLOOR / 3, 0.3)
    ax.grid(False, axis="x")
    for x in range(1, len(dtypes)):
        ax.axvline(x - 0.5, color="0.8", lw=0.6)
    ticks = [FLOOR, 1e-7, 1e-5, 1e-3]
    ax.set_yticks(ticks, ["0"] + [f"$10^{{{round(np.log10(t))}}}$" for t in ticks[1:]])
    ax.minorticks_off()
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_xlim(-0.5, len(dtypes) - 0.5)


def sci(value: float) -> str:
    """``value`` as LaTeX, 1.2 x 10^-6 style (0 stays 0)."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"\\ensuremath{{{mantissa}\\times 10^{{{int(exponent)}}}}}"


def per_seed(df: pd.DataFrame, column: str) -> tuple[float, float]:
    """Mean over seeds of the per-seed mean of ``column``, with its 95% CI half-width."""
    return mean_ci95(df.groupby("seed")[column].mean().tolist())


def chunk_phrase(chunks: list[int]) -> str:
    """'8, 16 and the whole prompt': the prefill chunk sizes in words (WHOLE is 0)."""
    words = [f"{c} tokens" for c in chunks if c != WHOLE] + (["the whole prompt"] if WHOLE in chunks else [])
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def ablation_macros(df: pd.DataFrame) -> dict[str, str]:
    """Share of runs that differ when only one part of the model is invariant, per dtype."""
    values = {}
    for mode, key in (("invariant-ops", "Ops"), ("invariant-attention", "Attention")):
        for dtype, word in DTYPE_WORDS.items():
            g = df[(df["mode"] == mode) & (df["dtype"] == dtype)]
            share = fmt(100 * float((~g["bit_identical"]).mean()), 0) if len(g) else "n/a"
            values[f"divOnly{key}Differ{word}"] = share
            values[f"divOnly{key}Runs{word}"] = str(len(g)) if len(g) else "n/a"
    return values


def macros(df: pd.DataFrame) -> dict[str, str]:
    default = df[df["mode"] == "default"]
    invariant = df[df["mode"] == "batch-invariant"]
    differing = int((~invariant["bit_identical"]).sum())
    values = {
        "divLayers": str(TINY_MODEL.n_layers),
        "divDim": str(TINY_MODEL.dim),
        "divHeads": str(TINY_MODEL.n_heads),
        "divKvHeads": str(TINY_MODEL.n_kv_heads),
        "divVocab": str(TINY_MODEL.vocab_size),
        "divPageSizes": " and ".join(str(p) for p in sorted(df["page_size"].unique())),
        "divSeeds": str(df["seed"].nunique()),
        "divRuns": str(len(df)),
        "divRunsPerMode": str(len(default)),
        "divPromptMin": str(int(df["prompt_tokens"].min())),
        "divPromptMax": str(int(df["prompt_tokens"].max())),
        "divHitMin": str(int(df["hit_tokens"].min())),
        "divHitMax": str(int(df["hit_tokens"].max())),
        "divChunks": chunk_phrase(sorted(int(c) for c in df["chunk"].unique())),
        "divInvariantRuns": str(len(invariant)),
        "divInvariantDiffering": str(differing),
        "divInvariantMaxDiff": sci(float(invariant["max_abs_diff"].max())) if len(invariant) else "n/a",
        # The one-sided 95% upper bound on a rate of which none of n trials shows: 3/n (rule of three).
        "divInvariantUpperPct": fmt(300.0 / len(invariant), 1) if len(invariant) and not differing else "n/a",
    }
    # Where the fp32 differences come from: how often by prefill chunk size.
    single = default[default["dtype"] == "fp32"]
    chunks = sorted(int(c) for c in single["chunk"].unique() if c != WHOLE)
    for key, chunk in (("Smallest", chunks[0] if chunks else None), ("Whole", WHOLE)):
        g = single[single["chunk"] == chunk] if chunk is not None else single.iloc[:0]
        share = float((~g["bit_identical"]).mean()) if len(g) else None
        values[f"divDifferSingle{key}Chunk"] = "n/a" if share is None else fmt(100 * share, 0)
    values["divSmallestChunk"] = str(chunks[0]) if chunks else "n/a"
    for dtype, word in DTYPE_WORDS.items():
        g = default[default["dtype"] == dtype].assign(differs=lambda d: ~d["bit_identical"],
                                                      flips=lambda d: ~d["top1_agrees"])
        if g.empty:
            for key in ("Differ", "DifferCI", "MaxDiff", "MedianDiff", "Flips", "MaxLogprob"):
                values[f"div{key}{word}"] = "n/a"
            continue
        share, half = per_seed(g, "differs")
        nonzero = g.loc[g["max_abs_diff"] > 0, "max_abs_diff"]
        values[f"divDiffer{word}"] = fmt(100 * share, 0)
        values[f"divDifferCI{word}"] = "n/a" if np.isnan(half) else fmt(100 * half, 0)
        values[f"divMaxDiff{word}"] = sci(float(g["max_abs_diff"].max()))
        values[f"divMedianDiff{word}"] = sci(float(nonzero.median())) if len(nonzero) else "0"
        values[f"divFlips{word}"] = str(int(g["flips"].sum()))
        values[f"divMaxLogprob{word}"] = sci(float(g["top1_logprob_diff"].max()))
    return values


def study_table(results: Path) -> pd.DataFrame:
    """The cells the figure draws: the committed default-scale measurement
    (``results/divergence_measured``), unless ``results`` holds a run at another scale."""
    config = results / STUDY / "config.json"
    scale = json.loads(config.read_text())["scale"] if config.exists() else "default"
    measured = measured_summary() if scale == "default" else None
    return measured if measured is not None else load(results, STUDY)


def make(results: Path, paper: Path) -> list[Path]:
    everything = study_table(results)
    df = everything[everything["mode"].isin(MAIN_MODES)]
    dtypes = [d for d in DTYPES if d in set(df["dtype"])]
    pages = sorted(df["page_size"].unique())
    fig, axes = plt.subplots(len(METRICS), len(pages), figsize=(7.0, 3.8), sharey="row", squeeze=False)
    for j, page in enumerate(pages):
        for i, (column, label) in enumerate(METRICS):
            ax = axes[i][j]
            draw(ax, df[df["page_size"] == page], column, dtypes, counts=i == 0)
            if i == 0:
                ax.set_title(f"page size {page}", fontsize=8)
            if j == 0:
                ax.set_ylabel(label)
    handles: dict[str, Any] = {}  # one legend entry per label, in the order first drawn
    for ax in axes.flat:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, handle)
    fig.legend(handles=list(handles.values()), labels=list(handles), loc="upper center", ncol=4,
               fontsize=6, bbox_to_anchor=(0.5, 1.04), frameon=False)
    fig.tight_layout()
    out = [save(fig, "divergence", paper)]
    out.append(write_macros(paper, "divergence", {**macros(df), **ablation_macros(everything)}))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
