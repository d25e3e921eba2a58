"""Figure and table: hash or tree in a running server, the whole Mooncake traces through the
engine under the GPU roofline clock. Reads the committed ``results/engine_traces_full`` (else
the default scale's ``results/engine_traces``); writes ``figures/engine_traces``,
``generated/engine_traces.tex`` (a table) and ``generated/engine_traces_values.tex``.

Where both are there, the default scale's cells must equal the full grid's rows for the same
cells: the committed measurement is rerun in part by every ``make reproduce``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.figures.plotting import (
    PALETTE,
    figure_main,
    fmt,
    save,
    write_macros,
    write_table_tex,
)
from prefixcache.experiments.figures.study_engine_traces import (
    CLOCK,
    FULL,
    OVERLOAD,
    STUDY,
    configs,
    load_summary,
)

from prefixcache.cost_model import named_clock
from prefixcache.scheduler import LPM_FALLBACK_QUEUE_LEN

KEY = ["trace", "capacity_tokens", "backend", "page_size", "scheduler", "load"]
CONFIG_STYLE = {("hashchain", 16): (PALETTE["hashchain"], "hashchain p16"),
                ("radix", 16): (PALETTE["radix"], "radix p16"), ("radix", 1): ("#ff9896", "radix p1")}
SCHED_STYLE = {"fcfs": ("-", "o"), "lpm": ("--", "x")}
TRACE_WORD = {"conversation": "Conv", "synthetic": "Syn"}
CONFIG_WORD = {("hashchain", 16): "Hash", ("radix", 16): "Radix", ("radix", 1): "RadixOne"}


def check_default_matches_full(results: Path) -> None:
    """ValueError unless every default-scale cell equals its row of the committed full grid
    (every column: the cells are deterministic, so any difference is a stale full grid)."""
    default, full = results / STUDY / "summary.csv", results / FULL / "summary.csv"
    if not (default.exists() and full.exists()):
        return
    d, f = pd.read_csv(default), pd.read_csv(full)
    both = d.merge(f, on=KEY, suffixes=("", "_full"), how="left", indicator=True)
    missing = both[both["_merge"] != "both"]
    if len(missing):
        raise ValueError(f"{full}: no rows for the default cells {missing[KEY].to_dict('records')}")
    for col in [c for c in d.columns if c not in KEY]:
        a, b = both[col].to_numpy(), both[f"{col}_full"].to_numpy()
        if not np.array_equal(a, b):
            raise ValueError(f"{full} is stale: the default cells' {col} differs from it "
                             "(rerun `make engine-traces-full` and commit it)")


def interval(point: pd.Series, lo: pd.Series, hi: pd.Series) -> list[np.ndarray]:
    """Error-bar lengths of a bootstrap interval around its point; a percentile interval may
    not contain the point (then its near side is drawn as zero)."""
    return [np.maximum(point - lo, 0).to_numpy(), np.maximum(hi - point, 0).to_numpy()]


def draw(df: pd.DataFrame, queue: pd.DataFrame, paper: Path) -> Path:
    traces = [t for t in TRACE_WORD if t in set(df["trace"])]
    fig, axes = plt.subplots(3, len(traces), figsize=(7.0, 7.2), squeeze=False)
    caps = sorted(df["capacity_tokens"].unique())
    mid_cap = caps[len(caps) // 2]
    for j, trace in enumerate(traces):
        t = df[df["trace"] == trace]
        ax = axes[0][j]
        at = t[t["load"] == 0.8]
        for (backend, page), (colour, label) in CONFIG_STYLE.items():
            for sched, (ls, marker) in SCHED_STYLE.items():
                g = at[(at["backend"] == backend) & (at["page_size"] == page) & (at["scheduler"] == sched)]
                g = g.sort_values("capacity_tokens")
                if g.empty:
                    continue
                err = interval(g["token_hit_rate"] * 100, g["token_hit_rate_lo"] * 100,
                               g["token_hit_rate_hi"] * 100)
                ax.errorbar(g["capacity_tokens"] / 1e6, g["token_hit_rate"] * 100, yerr=err, color=colour,
                            ls=ls, marker=marker, ms=3, lw=1, capsize=2, label=f"{label} {sched}")
        ax.set_xscale("log")
        ax.set_xticks([c / 1e6 for c in caps], labels=[f"{c / 1e6:g}" for c in caps])
        ax.set_xlabel("device pool (M tokens)")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(f"{trace}: load 80%", fontsize=8)
        ax.legend(fontsize=5)
        ax = axes[1][j]
        at = t[(t["capacity_tokens"] == mid_cap) & (t["scheduler"] == "fcfs")]
        for (backend, page), (colour, label) in CONFIG_STYLE.items():
            g = at[(at["backend"] == backend) & (at["page_size"] == page)].sort_values("load")
            if g.empty:
                continue
            for q, ls in (("p50", ":"), ("p90", "-"), ("p99", "--")):
                col = f"ttft_{q}_s"
                err = interval(g[col], g[f"ttft_{q}_lo"], g[f"ttft_{q}_hi"])
                ax.errorbar(g["load"] * 100, g[col], yerr=err, color=colour, ls=ls, marker="o", ms=2.5,
                            lw=1, capsize=2, label=f"{label} {q}")
        ax.set_yscale("log")
        ax.set_xlabel("load (% of the no-cache capacity,\nprefill and decode)")
        ax.set_ylabel("TTFT (s, roofline clock)")
        ax.set_title(f"{trace}: {mid_cap / 1e6:g}M tokens, FCFS", fontsize=8)
        ax.legend(fontsize=4.5, ncol=3)
        ax = axes[2][j]
        q = queue[(queue["trace"] == trace) & (queue["capacity_tokens"] == mid_cap)]
        q = q[(q["backend"] == "radix") & (q["page_size"] == 16) & (q["scheduler"] == "fcfs")]
        shades = max(1, q["load"].nunique() - 1)
        for k, (load, g) in enumerate(q.groupby("load")):
            ax.plot(g["time_s"] / 60, g["waiting"], lw=0.9, color=plt.cm.viridis(k / shades),
                    label=f"load {load:.0%}")
        ax.axhline(LPM_FALLBACK_QUEUE_LEN, color="0.4", ls=":", lw=0.8)
        ax.text(0.0, LPM_FALLBACK_QUEUE_LEN, f" LPM falls back above {LPM_FALLBACK_QUEUE_LEN}", fontsize=5,
                va="bottom", color="0.3")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("simulated time (min)")
        ax.set_ylabel("waiting requests")
        ax.set_title(f"{trace}: radix p16, {mid_cap / 1e6:g}M tokens, FCFS", fontsize=8)
        ax.legend(fontsize=5)
    fig.tight_layout()
    return save(fig, "engine_traces", paper)


def cell(df: pd.DataFrame, **where: Any) -> pd.Series:
    sel = np.ones(len(df), dtype=bool)
    for k, v in where.items():
        sel &= (df[k] == v).to_numpy()
    rows = df[sel]
    if len(rows) != 1:
        raise ValueError(f"engine_traces: {len(rows)} rows for {where}")
    return rows.iloc[0]


def values(df: pd.DataFrame, full: bool, meta_wall: str) -> dict[str, str]:
    caps = sorted(df["capacity_tokens"].unique())
    mid = caps[len(caps) // 2]
    ran = int((df["scheduler"] != "lpm-no-fallback").sum())  # the derived rows ran no cell
    out = {"etScale": "full" if full else "default", "etCells": str(ran),
           "etMidCapM": fmt(mid / 1e6, 0), "etClock": named_clock(CLOCK).source.split(": ", 1)[1],
           "etOverloadPct": fmt(OVERLOAD * 100, 0), "etWallMin": meta_wall,
           "etFallbackQueue": str(LPM_FALLBACK_QUEUE_LEN), "etDefaultCells": str(len(configs("default")))}
    normal = df[df["load"] <= 1.0]
    out["etPeakWaitingNormal"] = str(int(normal["peak_waiting"].max()))
    out["etPeakWaitingOverload"] = str(int(df[df["load"] == OVERLOAD]["peak_waiting"].max()))
    lpm = df[df["scheduler"] == "lpm"].set_index([k for k in KEY if k != "scheduler"])
    fcfs = df[df["scheduler"] == "fcfs"].set_index([k for k in KEY if k != "scheduler"])
    gain = (lpm["token_hit_rate"] - fcfs["token_hit_rate"]).dropna() * 100
    out["etLpmGainMinPts"], out["etLpmGainMaxPts"] = fmt(float(gain.min()), 2), fmt(float(gain.max()), 2)
    # the largest hit-rate gap between two designs in any cell (same trace, pool, scheduler, load)
    by_design = df[df["scheduler"] != "lpm-no-fallback"].pivot_table(
        index=["trace", "capacity_tokens", "scheduler", "load"], columns=["backend", "page_size"],
        values="token_hit_rate")
    spread = (by_design.max(axis=1) - by_design.min(axis=1)) * 100
    out["etMaxDesignGapPts"] = fmt(float(spread.max()), 2)
    for trace, word in TRACE_WORD.items():
        if trace not in set(df["trace"]):
            continue
        rows = df[df["trace"] == trace]
        out[f"et{word}Requests"] = f"{int(rows['requests'].max()):,}"
        out[f"et{word}Conversations"] = f"{int(rows['conversations'].max()):,}"
        rates = {}
        for config, cword in CONFIG_WORD.items():
            if not ((df["backend"] == config[0]) & (df["page_size"] == config[1])).any():
                continue
            r = cell(df, trace=trace, capacity_tokens=mid, backend=config[0], page_size=config[1],
                     scheduler="fcfs", load=0.8)
            rates[config] = r["token_hit_rate"]
            out[f"et{word}{cword}Hit"] = fmt(r["token_hit_rate"] * 100)
            out[f"et{word}{cword}HitCI"] = (f"{r['token_hit_rate_lo'] * 100:.1f}--"
                                           f"{r['token_hit_rate_hi'] * 100:.1f}")
            out[f"et{word}{cword}TtftNinety"] = fmt(r["ttft_p90_s"], 2)
            out[f"et{word}{cword}TtftNinetyCI"] = f"{r['ttft_p90_lo']:.2f}--{r['ttft_p90_hi']:.2f}"
        gap = (rates[("radix", 16)] - rates[("hashchain", 16)]) * 100
        out[f"et{word}RadixMinusHashPts"] = fmt(gap, 2)
        over = rows[rows["load"] == OVERLOAD]
        if len(over):  # past capacity, radix p16: what LPM does to the queue and TTFT
            f = cell(over, capacity_tokens=mid, backend="radix", page_size=16, scheduler="fcfs")
            lp = cell(over, capacity_tokens=mid, backend="radix", page_size=16, scheduler="lpm")
            out |= {f"et{word}OverFcfsPFifty": fmt(f["ttft_p50_s"]),
                    f"et{word}OverLpmPFifty": fmt(lp["ttft_p50_s"]),
                    f"et{word}OverFcfsPNinety": fmt(f["ttft_p90_s"]),
                    f"et{word}OverLpmPNinety": fmt(lp["ttft_p90_s"]),
                    f"et{word}OverFcfsPeak": str(int(f["peak_waiting"])),
                    f"et{word}OverLpmPeak": str(int(lp["peak_waiting"])),
                    f"et{word}OverLpmGainPts": fmt((lp["token_hit_rate"] - f["token_hit_rate"]) * 100)}
    return out


def table(df: pd.DataFrame, paper: Path) -> Path:
    rows = []
    at = df[(df["load"] == 0.8) & (df["scheduler"] == "fcfs")]
    for trace in TRACE_WORD:
        for cap in sorted(at["capacity_tokens"].unique()):
            for (backend, page), (_, label) in CONFIG_STYLE.items():
                g = at[(at["trace"] == trace) & (at["capacity_tokens"] == cap) & (at["backend"] == backend)
                       & (at["page_size"] == page)]
                if g.empty:
                    continue
                r = g.iloc[0]
                lpm = cell(df, trace=trace, capacity_tokens=cap, backend=backend, page_size=page,
                           scheduler="lpm", load=0.8)
                rows.append([trace, f"{cap / 1e6:g}M", label,
                             f"{r['token_hit_rate'] * 100:.1f} ({r['token_hit_rate_lo'] * 100:.1f}--"
                             f"{r['token_hit_rate_hi'] * 100:.1f})",
                             f"{(lpm['token_hit_rate'] - r['token_hit_rate']) * 100:+.2f}",
                             f"{r['ttft_p50_s']:.2f}", f"{r['ttft_p90_s']:.2f}", f"{r['ttft_p99_s']:.2f}",
                             str(int(r["peak_waiting"]))])
    header = ["trace", "pool", "cache", "hit \\% (95\\% CI)", "LPM $\\Delta$ pt", "p50 s", "p90 s", "p99 s",
              "peak queue"]
    caption = ("Whole Mooncake traces through the engine at 80\\% of the no-cache capacity, FCFS, under "
               "the GPU roofline clock: token hit rate with its 95\\% interval from a bootstrap over "
               "conversations, LPM's change of it, TTFT percentiles and the longest waiting queue "
               "(\\texttt{results/engine\\_traces\\_full/summary.csv}).")
    return write_table_tex(paper, "engine_traces", header, rows, "lllrrrrrr", caption, "tab:engine-traces",
                           fit_width=True)


def make(results: Path, paper: Path) -> list[Path]:
    check_default_matches_full(results)
    df, queue, full = load_summary(results)
    meta = results / FULL / "meta.json"
    wall = "n/a"
    if full and meta.exists():
        import json

        wall = fmt(json.loads(meta.read_text())["wall_s"] / 60, 0)
    return [draw(df, queue, paper), table(df, paper), write_macros(paper, "engine_traces_values",
                                                                   values(df, full, wall))]


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
