"""Figure and tables: the hybrid gaps explained. Reads ``results/hybrid_causes`` (the workloads,
at the scale just run) and the committed ``results/hybrid_causes_full`` (its whole traces);
writes ``figures/hybrid_causes``, ``generated/hybrid_causes.tex`` (each whole-trace gap and its
causes), ``generated/hybrid_ablation.tex`` (each setting alone, whole traces) and
``generated/hybrid_causes_values.tex``.

Every layout's causes are three steps: what vLLM's default costs hashchain (sparse retention;
for Mamba, the block floor), what no switch names, and what SGLang's default costs radix (the
SWA pool share; for Mamba, the state pool). They sum to the measured gap exactly.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.figures.common import MOONCAKE_TRACES, refuse_stale_grid
from prefixcache.experiments.figures.fig_decomposition import is_trace
from prefixcache.experiments.figures.plotting import (
    SOURCE_WORD,
    figure_main,
    fmt,
    save,
    write_macros,
    write_table_tex,
)
from prefixcache.experiments.figures.study_hybrid_causes import (
    CAPACITY,
    FULL,
    PANELS,
    RATIOS,
    RUN_COUNTS,
    STUDY,
)

# Each panel's three causes in chain order: vLLM's default, the rest, SGLang's default.
STEPS = ["vllm", "rest", "sglang"]
STEP_OF = {"sparse retention": "vllm", "block floor": "vllm", "rest (no switch)": "rest",
           "pool share": "sglang", "state pool": "sglang"}
COLORS = {"sparse retention": "tab:blue", "block floor": "tab:green", "rest (no switch)": "0.6",
          "pool share": "tab:orange", "state pool": "tab:red"}
CAUSE_NAME = {"sparse retention": "vLLM's sparse retention", "block floor": "vLLM's block floor",
              "rest (no switch)": "the rest (what no switch names)", "pool share": "SGLang's pool share",
              "state pool": "radix's state pool"}
# Macro spelling (letters only) of each panel and step
PANEL_WORD = {"gemma3-like": "Gemma", "gpt-oss-like": "Gptoss", "window-512": "WinFiveTwelve",
              "window-2048": "WinTwoK", "mamba-hybrid": "Mamba"}
STEP_WORD = {"vllm": "Vllm", "rest": "Rest", "sglang": "Sglang"}
RATIO_WORD = {0.2: "PointTwo", 0.4: "PointFour", 0.6: "PointSix", 0.8: "PointEight", 1.0: "One"}
RETENTION_WORD = {"hashchain": "RetZero", "hashchain-ret-1w": "RetOneW", "hashchain-ret-2w": "RetTwoW",
                  "hashchain-dense": "RetDense"}
RETENTION_NAME = {"hashchain": "0", "hashchain-ret-1w": "one window", "hashchain-ret-2w": "two windows",
                  "hashchain-dense": "dense"}
# the runs of every panel's chain, by macro word
RUN_WORD = {"hashchain": "Hash", "hashchain-dense": "HashDense", "radix": "Radix", "radix-r1.0": "RadixEqual",
            "hashchain-s16": "HashSmall", "radix-s16": "RadixSmall"}


def ratio_label(ratio: float) -> str:
    """The variant of radix at SWA pool share ``ratio`` (0.8, SGLang's default, is "radix")."""
    return "radix" if ratio == 0.8 else f"radix-r{ratio}"


def load_tables(results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(causes, rates): the workloads' rows of this run beside the committed full grid's
    whole-trace rows. The full grid must hold this run's cells with the same counts: a stale
    grid is refused."""
    causes = pd.read_csv(results / STUDY / "causes.csv")
    rates = pd.read_csv(results / STUDY / "rates.csv")
    full = results / FULL
    if not (full / "causes.csv").exists():
        return causes, rates
    refuse_stale_grid(results, STUDY, FULL, RUN_COUNTS, "hybrid-causes-full")
    out = []
    for mine_t, stem in ((causes, "causes"), (rates, "rates")):
        theirs = pd.read_csv(full / f"{stem}.csv")
        out.append(pd.concat([mine_t[~is_trace(mine_t["source"])], theirs[is_trace(theirs["source"])]],
                             ignore_index=True))
    return out[0], out[1]


def check_sums(causes: pd.DataFrame) -> pd.DataFrame:
    """Per (source, panel): the measured gap beside its causes' sum; raises unless equal (to the
    6 significant digits the tables keep)."""
    per = causes.groupby(["source", "panel"], sort=False)
    table = per[["measured_pt", "measured_lo", "measured_hi"]].first()
    table["sum_pt"] = per["chain_pt"].sum()
    off = ~np.isclose(table["sum_pt"], table["measured_pt"], rtol=1e-4, atol=1e-4)
    if off.any():
        raise RuntimeError(f"causes do not sum to the gap: {table[off].index.tolist()}")
    return table


def points(value: float) -> str:
    """Points to one decimal, without a sign on a value that rounds to zero."""
    text = fmt(float(value), 1)
    return "0.0" if text == "-0.0" else text


def interval(row: pd.Series, prefix: str) -> str:
    return f"{points(row[f'{prefix}_pt'])} [{points(row[f'{prefix}_lo'])}, {points(row[f'{prefix}_hi'])}]"


def make(results: Path, paper: Path) -> list[Path]:
    causes, rates = load_tables(results)
    sums = check_sums(causes)
    sources = list(dict.fromkeys(causes["source"]))
    panels = [p for p in PANELS if p in set(causes["panel"])]
    ncols = min(len(sources), 5)
    nrows = -(-len(sources) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.45 * ncols, 2.1 * nrows + 0.4), squeeze=False)
    for ax in axes.flat[len(sources):]:
        ax.set_visible(False)
    x = np.arange(len(panels))
    for ax, source in zip(axes.flat[: len(sources)], sources, strict=True):
        part = causes[causes["source"] == source]
        up, down = np.zeros(len(panels)), np.zeros(len(panels))
        for cause, color in COLORS.items():
            mine = part[part["cause"] == cause]
            v = np.array([mine[mine["panel"] == p]["chain_pt"].sum() for p in panels])
            if not v.any():
                continue
            bottom = np.where(v >= 0, up, down)
            ax.bar(x, v, 0.6, bottom=bottom, color=color, label=cause)
            up, down = up + np.maximum(v, 0), down + np.minimum(v, 0)
        s = sums.loc[source].reindex(panels)
        err = [s["measured_pt"] - s["measured_lo"], s["measured_hi"] - s["measured_pt"]]
        ax.errorbar(x + 0.36, s["measured_pt"], yerr=err, fmt="o", color="black", ms=3, lw=1, capsize=2,
                    label="measured gap (95% CI)")
        ax.axhline(0, color="black", lw=0.6)
        ax.margins(y=0.08)  # stacked bars end at the limits otherwise
        ax.set_xticks(x, [p.removesuffix("-like").removesuffix("-hybrid").replace("window-", "w")
                          for p in panels], fontsize=6, rotation=45)
        ax.set_title(source if source not in MOONCAKE_TRACES else f"{source} (whole)", fontsize=6)
    for row in axes:
        row[0].set_ylabel("radix minus hashchain\n(points of hit rate)", fontsize=7)
    handles, labels = {}, []
    for ax in axes.flat[: len(sources)]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=3, fontsize=6,
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 / nrows, 1, 1))
    out = [save(fig, STUDY, paper)]

    trace_causes = causes[is_trace(causes["source"])]
    values: dict[str, str] = {
        "hybcWorkloads": str(causes.loc[~is_trace(causes["source"]), "source"].nunique()),
        "hybcSeeds": str(int(causes.loc[~is_trace(causes["source"]), "seeds"].max())),
        "hybcPanels": str(len(sums)),
        "hybcTraceRan": "yes" if len(trace_causes) else "no",
        "hybcCapacityK": str(CAPACITY // 1024),
    }
    for source in MOONCAKE_TRACES:  # "--" where the full grid has not run
        for panel, (_, _, variants, _) in PANELS.items():
            words = ["Gap", "GapCi", *STEP_WORD.values()]
            words += [f"{kind}{RUN_WORD[v[0]]}" for v in variants if v[0] in RUN_WORD
                      for kind in ("Rate", "EvictM")]
            for word in words:
                values[f"hybc{SOURCE_WORD[source]}{PANEL_WORD[panel]}{word}"] = "--"
    for r in rates[is_trace(rates["source"]) & rates["label"].isin(list(RUN_WORD))].itertuples():
        key = f"hybc{SOURCE_WORD[r.source]}{PANEL_WORD[r.panel]}"
        values[f"{key}Rate{RUN_WORD[r.label]}"] = fmt(r.hit_rate_pt, 1)
        values[f"{key}EvictM{RUN_WORD[r.label]}"] = fmt(r.evicted_tokens / 1e6, 0)
    rows = []
    for (source, panel), cell in trace_causes.groupby(["source", "panel"], sort=False):
        first = cell.iloc[0]
        steps = {STEP_OF[c]: row for c, (_, row) in zip(cell["cause"], cell.iterrows(), strict=True)}
        key = f"hybc{SOURCE_WORD[source]}{PANEL_WORD[panel]}"
        values[f"{key}Gap"] = points(first["measured_pt"])
        values[f"{key}GapCi"] = interval(first, "measured").split(" ", 1)[1]
        for step in STEPS:
            values[f"{key}{STEP_WORD[step]}"] = points(steps[step]["chain_pt"])
        rows.append([source.removeprefix("mooncake-"), panel, interval(first, "measured"),
                     *(interval(steps[s], "chain") for s in STEPS)])
    values.update(summary_values(causes))
    if not rows:
        rows = [["\\multicolumn{6}{l}{not run here: \\texttt{make hybrid-causes-full} writes them}"]]
    out.append(write_table_tex(
        paper, "hybrid_causes", ["trace", "layout", "gap", "vLLM default", "no switch", "SGLang default"],
        rows, "llrrrr",
        "The hybrid gaps of the whole Mooncake traces explained (3M tokens of KV per layer; points of "
        "token hit rate, radix minus hashchain, 95\\% CI over conversations). The three steps sum to "
        "the gap. vLLM default: sparse retention (window layouts) or the block floor (Mamba); "
        "SGLang default: the SWA pool share 0.8 or the state pool of 528-token states; no switch: "
        "the designs at equal settings (window layouts: dense retention against equal pools; "
        "Mamba: both at a 16-token state).", "tab:hybrid-causes", fit_width=True))
    out.append(ablation_table(rates, paper, values))
    out.append(write_macros(paper, "hybrid_causes_values", values))
    return out


def summary_values(causes: pd.DataFrame) -> dict[str, str]:
    """What the text says across panels: the range of the unnamed rest on the whole traces'
    window layouts, on how many window panels with a gap (workloads, whole traces) sparse
    retention is the largest step, and the largest step of the Mamba layout on the traces."""
    window = causes[causes["panel"].map(lambda p: PANELS[p][1] is not None)]
    rest = window[is_trace(window["source"]) & (window["cause"] == "rest (no switch)")]["chain_pt"]
    out = {"hybcRestMin": points(rest.min()) if len(rest) else "--",
           "hybcRestMax": points(rest.max()) if len(rest) else "--"}
    on_trace = is_trace(window["source"])
    for word, part in (("Work", window[~on_trace]), ("Trace", window[on_trace])):
        largest = part.loc[part["chain_pt"].abs().groupby([part["source"], part["panel"]]).idxmax()]
        largest = largest[largest["chain_pt"] != 0]  # a panel without a gap has no largest step
        out[f"hybc{word}WindowPanels"] = str(len(largest))
        out[f"hybc{word}RetentionLargest"] = str(int((largest["cause"] == "sparse retention").sum()))
    mamba = causes[is_trace(causes["source"]) & (causes["panel"] == "mamba-hybrid")]
    names = set(mamba.loc[mamba["chain_pt"].abs().groupby(mamba["source"]).idxmax(), "cause"])
    out["hybcTraceMambaLargest"] = CAUSE_NAME[names.pop()] if len(names) == 1 else "not the same step"
    return out


def ablation_table(rates: pd.DataFrame, paper: Path, values: dict[str, str]) -> Path:
    """Each setting alone on the whole traces: hashchain's retention and radix's pool share on
    the Gemma and gpt-oss layouts (hit %), one column per trace and layout."""
    t = rates[is_trace(rates["source"]) & rates["panel"].isin(["gemma3-like", "gpt-oss-like"])]
    columns = [(s, p) for s in MOONCAKE_TRACES for p in ("gemma3-like", "gpt-oss-like")
               if not t[(t["source"] == s) & (t["panel"] == p)].empty]
    settings = [("hashchain", "retention 0 (vLLM)"), ("hashchain-ret-1w", "retention 1 window"),
                ("hashchain-ret-2w", "retention 2 windows"), ("hashchain-dense", "dense retention")]
    settings += [(ratio_label(r), f"pool share {r}" + (" (SGLang)" if r == 0.8 else ""))
                 for r in sorted([*RATIOS, 0.8])]
    for source in MOONCAKE_TRACES:  # "--" where the full grid has not run
        for panel in ("gemma3-like", "gpt-oss-like"):
            key = f"hybc{SOURCE_WORD[source]}{PANEL_WORD[panel]}"
            words = [*(f"Share{w}" for w in RATIO_WORD.values()), *RETENTION_WORD.values(), "BestRet",
                     "BestRetHit", "BestShare", "BestShareHit"]
            for word in words:
                values[f"{key}{word}"] = "--"
    rows = []
    for label, name in settings:
        design = "hashchain" if label.startswith("hashchain") else "radix"
        cells = []
        for source, panel in columns:
            hit = t[(t["source"] == source) & (t["panel"] == panel) & (t["label"] == label)]["hit_rate_pt"]
            cells.append(fmt(float(hit.iloc[0]), 1) if len(hit) else "--")
        rows.append([design, name, *cells])
    for (source, panel) in columns:
        part = t[(t["source"] == source) & (t["panel"] == panel)].set_index("label")["hit_rate_pt"]
        key = f"hybc{SOURCE_WORD[source]}{PANEL_WORD[panel]}"
        for r, word in RATIO_WORD.items():
            values[f"{key}Share{word}"] = fmt(float(part[ratio_label(r)]), 1)
        for label, word in RETENTION_WORD.items():
            values[f"{key}{word}"] = fmt(float(part[label]), 1)
        best = max(RETENTION_WORD, key=lambda label: float(part[label]))
        values[f"{key}BestRet"], values[f"{key}BestRetHit"] = RETENTION_NAME[best], fmt(float(part[best]), 1)
        share = max(RATIO_WORD, key=lambda r: float(part[ratio_label(r)]))
        values[f"{key}BestShare"] = fmt(share, 1)
        values[f"{key}BestShareHit"] = fmt(float(part[ratio_label(share)]), 1)
    if not columns:
        rows = [["\\multicolumn{2}{l}{not run here: \\texttt{make hybrid-causes-full} writes them}"]]
    header = ["design", "setting", *(f"{s.removeprefix('mooncake-')[:4]}. {p.replace('-like', '')}"
                                     for s, p in columns)]
    return write_table_tex(
        paper, "hybrid_ablation", header, rows, "ll" + "r" * max(len(columns), 0),
        "One setting at a time on the whole Mooncake traces (token hit rate, \\%; 3M tokens of KV per "
        "layer): hashchain's retention interval and radix's SWA pool share "
        "(\\texttt{swa\\_full\\_tokens\\_ratio}), each design otherwise at its upstream defaults. "
        "Retention every window keeps a window-long tail every window, so it hashes every block, as "
        "dense retention does.",
        "tab:hybrid-ablation")


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
