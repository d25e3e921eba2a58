"""Figure and table: routers in front of N replicas. Reads ``results/routing`` (and, if present,
``results/cpu_clock/routing``: the same study under the CPU-measured clock); writes
``figures/routing``, ``generated/routing.tex``, ``generated/routing_values.tex`` and
``generated/routing_values_cpu.tex`` (the CPU clock's values as ``routCpu...``).

Hit rates carry the 95% bootstrap interval over conversations (one arrival sample per trace: the
same for every router); TTFT and event lags are in the simulated clock's seconds (queue +
prefill; the study's clock, by default the GPU roofline), which the figure and table name.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from prefixcache.experiments.figures.common import (
    CPU_CLOCK_RESULTS,
    MOONCAKE_TRACES,
    clock_label,
    clock_text,
    other_clock_macros,
    trace_arrival_scale,
)
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
from prefixcache.experiments.figures.study_routing import ROUTERS, STUDY
from prefixcache.experiments.inputs.traces import read_mooncake

from prefixcache.cost_model import clock_from_constants

DESIGN_WORD = {"hashchain": "Hash", "radix": "Radix"}
# Macro spelling of each router label (LaTeX macro names are letters only).
ROUTER_WORD = {
    "round-robin": "RoundRobin",
    "sglang": "Sglang",
    "sglang-old": "SglangOld",
    "dynamo": "Dynamo",
    "dynamo-current": "DynamoCurrent",
    "dynamo-events": "DynamoEvents",
    "dynamo-current-events": "DynamoCurrentEvents",
    "llm-d": "Llmd",
    "llm-d-precise": "LlmdPrecise",
    "production-stack": "ProductionStack",
    "ray-serve": "RayServe",
    "preble": "Preble",
    "oracle": "Oracle",
}


def pct(x: float) -> str:
    return fmt(float(x) * 100)


def parts(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(routers, event lag, local oracle, pooled replay) rows of the study's table."""
    main = df[df["part"] == "routers"]
    lag = pd.concat([df[df["part"] == "lag"], main[main["kv_events"] == True]])  # noqa: E712
    local = pd.concat([df[df["part"] == "local"], main[main["label"] == "oracle"]])
    return main, lag, local, df[df["part"] == "global"]


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY)
    main, lag, local, pooled = parts(df)
    clock = clock_text(json.loads(main["cost_model"].iloc[0]))
    sources = [s for s in SOURCE_WORD if s in set(main["source"])]
    labels = [r[0] for r in ROUTERS if r[0] in set(main["label"])]
    designs = [d for d in DESIGN_WORD if d in set(main["design"])]
    first = sources[0]

    fig, axes = plt.subplots(1, 3, figsize=(7.2, 2.6), gridspec_kw={"width_ratios": [2.2, 1, 1]})
    ax = axes[0]
    x = np.arange(len(labels))
    width = 0.8 / len(designs)
    for i, design in enumerate(designs):
        s = main[(main["source"] == first) & (main["design"] == design)].set_index("label").reindex(labels)
        err = np.vstack([s["token_hit_rate"] - s["hit_rate_lo"], s["hit_rate_hi"] - s["token_hit_rate"]])
        ax.bar(
            x + (i - (len(designs) - 1) / 2) * width,
            s["token_hit_rate"],
            width,
            yerr=err,
            color=PALETTE[design],
            label=design,
            capsize=1.2,
        )
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("token hit rate")
    ax.set_title(f"routers, {first.removeprefix('mooncake-')}", fontsize=8)
    ax.legend(fontsize=6)
    ax = axes[1]
    for label, g in lag[(lag["source"] == first) & (lag["design"] == designs[0])].groupby("label"):
        g = g.sort_values("event_lag_s")
        ax.plot(g["event_lag_s"].clip(lower=0.01), g["token_hit_rate"], marker="o", ms=3, label=str(label))
    for label, style in (("dynamo", ":"), ("llm-d", "--")):
        ref = main[(main["source"] == first) & (main["design"] == designs[0]) & (main["label"] == label)]
        if not ref.empty:
            ax.axhline(
                float(ref["token_hit_rate"].iloc[0]),
                ls=style,
                lw=0.8,
                color="grey",
                label=f"{label} (no events)",
            )
    ax.set_xscale("log")
    label = clock_label(json.loads(main["cost_model"].iloc[0]))
    ax.set_xlabel(f"event lag (s, {label} clock; 0 at 0.01)", fontsize=6)
    ax.set_title("exact routers vs event lag", fontsize=8)
    ax.legend(fontsize=5)
    ax = axes[2]
    for design in [d for d in designs if d in set(pooled["design"])]:  # the part's designs only
        lo = local[(local["source"] == first) & (local["design"] == design)].sort_values("replicas")
        gl = pooled[(pooled["source"] == first) & (pooled["design"] == design)].sort_values("replicas")
        ax.plot(
            lo["replicas"],
            lo["token_hit_rate"],
            marker="o",
            ms=3,
            color=PALETTE[design],
            label=f"{design} local (oracle)",
        )
        ax.plot(
            gl["replicas"],
            gl["token_hit_rate"],
            marker="s",
            ms=3,
            ls="--",
            color=PALETTE[design],
            label=f"{design} pooled",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas", fontsize=7)
    ax.set_title("local vs global cache", fontsize=8)
    ax.legend(fontsize=5)
    fig.tight_layout()
    out = [save(fig, STUDY, paper)]
    header, rows, values = table_values(df)
    names = [s.removeprefix("mooncake-") for s in sources]
    traces = " and ".join(names) + (" traces" if len(names) > 1 else " trace")
    out.append(
        write_table_tex(
            paper,
            STUDY,
            header,
            rows,
            "l" + "r" * (len(header) - 1),
            f"Routers over {values['routReplicas']} replicas of {values['routCapacityM']}M tokens, "
            f"the first {values['routRequests']} requests of the Mooncake "
            f"{traces} at "
            f"{values['routLoad']}\\% of the no-cache load: token hit \\% with its 95\\% bootstrap "
            "interval per design; the rest for the "
            f"{first.removeprefix('mooncake-')} trace "
            f"and {designs[0]} replicas: the router's prediction error (MAE, tokens; false hits: "
            "predicted a hit, reused nothing), load imbalance (time-weighted max/mean active "
            f"requests) and TTFT in simulated seconds (clock: {clock}).",
            "tab:routing",
            fit_width=True,
        )
    )
    out.append(write_macros(paper, "routing_values", values))
    cpu: dict[str, str] = {"routMeasured": "no"}  # the paper guards the comparison with \ifx
    if (results / CPU_CLOCK_RESULTS / STUDY / "config.json").exists():  # the study on the CPU clock
        cpu_df = load(results / CPU_CLOCK_RESULTS, STUDY)
        _, _, cpu = table_values(cpu_df)
        cpu["routMaxNonDynamoHitGapPts"] = fmt(max_hit_gap(main, parts(cpu_df)[0], "dynamo") * 100)
        cpu["routMeasured"] = "yes"
    out.append(write_macros(paper, "routing_values_cpu", other_clock_macros(cpu, "rout")))
    return out


def max_hit_gap(a: pd.DataFrame, b: pd.DataFrame, but: str) -> float:
    """The largest difference of a router's token hit rate between two runs' routers parts,
    routers whose label starts with ``but`` left out."""
    on = ["source", "design", "replicas", "capacity_tokens", "label"]
    both = a[on + ["token_hit_rate"]].merge(b[on + ["token_hit_rate"]], on=on, suffixes=("", "_b"),
                                            validate="one_to_one")
    if len(both) != len(a):
        raise ValueError(f"the two runs have different router cells: {len(a)} and {len(b)}")
    both = both[~both["label"].str.startswith(but)]
    return float((both["token_hit_rate"] - both["token_hit_rate_b"]).abs().max())


def arrival_gap_s(main: pd.DataFrame) -> float:
    """Mean seconds between arrivals of the first trace's rescaled requests (the study's rescale
    under its clock), the scale an event lag is measured against."""
    r0 = main.iloc[0]
    limit = None if pd.isna(r0["limit"]) else int(r0["limit"])
    records = read_mooncake(MOONCAKE_TRACES[r0["source"]])[:limit]
    factor = trace_arrival_scale(r0["source"], limit, clock_from_constants(json.loads(r0["cost_model"])),
                                 float(r0["load"]), int(r0["replicas"]))
    return (records[-1].timestamp - records[0].timestamp) * factor / max(len(records) - 1, 1)


def table_values(df: pd.DataFrame) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """The table's header and rows and the paper's values (``rout...`` macros) of one run."""
    main, lag, local, pooled = parts(df)
    sources = [s for s in SOURCE_WORD if s in set(main["source"])]
    labels = [r[0] for r in ROUTERS if r[0] in set(main["label"])]
    designs = [d for d in DESIGN_WORD if d in set(main["design"])]
    first = sources[0]
    values: dict[str, str] = {
        "routRequests": str(int(main["requests"].iloc[0])),
        "routReplicas": str(int(main["replicas"].iloc[0])),
        "routCapacityM": fmt(float(main["capacity_tokens"].iloc[0]) / 1e6),
        "routLoad": fmt(float(main["load"].iloc[0]) * 100, 0),
        "routCells": str(len(df)),
        "routClock": clock_text(json.loads(main["cost_model"].iloc[0])),
        "routArrivalGapS": fmt(arrival_gap_s(main[main["source"] == first]), 2),
    }
    header = (
        ["router"]
        + [f"{s.removeprefix('mooncake-')[:4]}. {d[:5]}." for s in sources for d in designs]
        + ["MAE", "false hits \\%", "max/mean", "TTFT p50", "p90", "p99"]
    )
    rows = []
    for label in labels:
        row = [label]
        for source in sources:
            for design in designs:
                r = main[(main["source"] == source) & (main["design"] == design) & (main["label"] == label)]
                if r.empty:
                    row.append("--")
                    continue
                r0 = r.iloc[0]
                row.append(
                    f"{pct(r0['token_hit_rate'])} [{pct(r0['hit_rate_lo'])}, {pct(r0['hit_rate_hi'])}]"
                )
                key = f"rout{ROUTER_WORD[label]}{DESIGN_WORD[design]}{SOURCE_WORD[source]}"
                values[f"{key}Hit"] = pct(r0["token_hit_rate"])
                values[f"{key}Mae"] = fmt(float(r0["pred_mae"]), 0)
                values[f"{key}StateMae"] = fmt(float(r0["pred_state_mae"]), 0)  # belief vs the cache
                values[f"{key}QueueMae"] = fmt(float(r0["pred_queue_mae"]), 0)  # cache then vs reused
                values[f"{key}Signed"] = fmt(float(r0["pred_signed_mean"]), 0)
                values[f"{key}TtftFifty"] = fmt(float(r0["ttft_p50_s"]))
                values[f"{key}TtftNinety"] = fmt(float(r0["ttft_p90_s"]))
                values[f"{key}Imbalance"] = fmt(float(r0["imbalance_max_over_mean"]), 2)
        r = main[(main["source"] == first) & (main["design"] == designs[0]) & (main["label"] == label)].iloc[
            0
        ]
        row += [
            fmt(float(r["pred_mae"]), 0),
            pct(r["pred_false_hits"]),
            fmt(float(r["imbalance_max_over_mean"]), 2),
            fmt(float(r["ttft_p50_s"])),
            fmt(float(r["ttft_p90_s"])),
            fmt(float(r["ttft_p99_s"])),
        ]
        rows.append(row)
    for label in ("dynamo-events", "llm-d-precise"):
        for design in designs:
            g = lag[(lag["source"] == first) & (lag["design"] == design) & (lag["label"] == label)]
            named = {0.0: "Zero", 1.0: "One", 10.0: "Ten", 100.0: "Hundred", 1000.0: "Thousand"}
            at = [(lag_s, named[lag_s]) for lag_s in sorted(set(g["event_lag_s"])) if lag_s in named]
            for lag_s, word in [*at, (max(g["event_lag_s"], default=0.0), "Max")]:
                r = g[g["event_lag_s"] == lag_s]
                values[f"rout{ROUTER_WORD[label]}{DESIGN_WORD[design]}Lag{word}"] = (
                    "--" if r.empty else pct(r["token_hit_rate"].iloc[0])
                )
    values["routMaxLag"] = fmt(float(lag["event_lag_s"].max()), 0) if not lag.empty else "--"
    for design in designs:
        for n in sorted(pooled["replicas"].unique()):
            word = {2: "Two", 4: "Four", 8: "Eight", 16: "Sixteen"}[int(n)]
            gl = pooled[
                (pooled["source"] == first) & (pooled["design"] == design) & (pooled["replicas"] == n)
            ]
            lo = local[(local["source"] == first) & (local["design"] == design) & (local["replicas"] == n)]
            values[f"routPooled{DESIGN_WORD[design]}{word}"] = (
                "--" if gl.empty else pct(gl["token_hit_rate"].iloc[0])
            )
            values[f"routLocal{DESIGN_WORD[design]}{word}"] = (
                "--" if lo.empty else pct(lo["token_hit_rate"].iloc[0])
            )
    for design in designs:  # ratios the published claims are stated in
        at = main[(main["source"] == first) & (main["design"] == design)].set_index("label")["token_hit_rate"]
        if {"sglang", "round-robin"} <= set(at.index):
            values[f"routSglangOverRoundRobin{DESIGN_WORD[design]}"] = fmt(
                float(at["sglang"] / at["round-robin"]), 2
            )
        for n in sorted(pooled["replicas"].unique()):
            word = {2: "Two", 4: "Four", 8: "Eight", 16: "Sixteen"}[int(n)]
            gl = pooled[
                (pooled["source"] == first) & (pooled["design"] == design) & (pooled["replicas"] == n)
            ]
            lo = local[(local["source"] == first) & (local["design"] == design) & (local["replicas"] == n)]
            if not gl.empty and not lo.empty:
                ratio = float(gl["token_hit_rate"].iloc[0]) / float(lo["token_hit_rate"].iloc[0])
                values[f"routPooledOverLocal{DESIGN_WORD[design]}{word}"] = fmt(ratio, 2)
    return header, rows, values


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
