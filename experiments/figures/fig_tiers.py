"""Figure and table: a host tier under the device pool. Reads ``results/tiers`` (and, if
present, ``results/cpu_clock/tiers``: the same study under the CPU-measured clock); writes
``figures/tiers``, ``generated/tiers.tex``, ``generated/tiers_values.tex`` and
``generated/tiers_values_cpu.tex`` (the CPU clock's values as ``tierCpu...``).

Hit rates are shares of the prompt tokens of the requests served (one arrival sample per
trace); "pooled" is one device pool of both tiers' size, replayed: what a local tier could at
most recover. Bytes use Llama-3-8B's 128 KiB a token (``prefixcache.tiers``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from prefixcache.experiments.figures.common import (
    CPU_CLOCK_RESULTS,
    clock_label,
    clock_text,
    other_clock_macros,
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
from prefixcache.experiments.figures.study_tiers import DESIGNS, STUDY, VARIANTS

from prefixcache.cost_model import clock_from_constants
from prefixcache.tiers import LLAMA3_8B_BYTES_PER_TOKEN, HostLink

TOKEN_BUDGET = 2048  # the cells' (cell_config's default)

LABEL_WORD = {
    "hashchain": "Hash",
    "radix": "Radix",
    "hashchain-arc": "HashArc",
    "radix-selective": "RadixSelective",
    "radix-write-back": "RadixWriteBack",
}


def millions(tokens: float) -> str:
    if tokens == 0:
        return "0"
    return fmt(tokens / 1e6, 0) if tokens >= 1e6 else fmt(tokens / 1e6, 2)


def size_word(tokens: int) -> str:
    """Macro spelling of a size in tokens (letters only): 1M -> OneM, 10M -> TenM, 0 -> None."""
    words = {0: "None", 1_000_000: "OneM", 3_000_000: "ThreeM", 10_000_000: "TenM", 50_000_000: "FiftyM"}
    return words.get(int(tokens), "Size" + "".join("abcdefghij"[int(d)] for d in str(int(tokens))))


def read_study(results: Path) -> tuple[Any, Any, list[str], list[int], list[int]]:
    """(engine cells, pooled replays, traces, device sizes, host sizes) stored under ``results``."""
    df = load(results, STUDY)
    tiers = df[df["part"] == "tiers"].copy()
    pooled = df[df["part"] == "pooled"]
    for col in ("host_hits", "loaded_tokens", "stored_tokens", "host_evicted_tokens", "host_hit_rate"):
        tiers[col] = tiers[col].fillna(0) if col in tiers else 0
    tiers["device_hit_rate"] = tiers["hit_rate"]
    tiers["total_hit_rate"] = tiers["hit_rate"] + tiers["host_hit_rate"]
    sources = [s for s in SOURCE_WORD if s in set(tiers["source"])]
    gpus = sorted(int(g) for g in tiers["capacity_tokens"].unique())
    hosts = sorted(int(h) for h in tiers["host_tokens"].unique())
    return tiers, pooled, sources, gpus, hosts


def make(results: Path, paper: Path) -> list[Path]:
    tiers, pooled, sources, gpus, hosts = read_study(results)
    first, gpu0 = sources[0], gpus[0]
    constants = json.loads(tiers["cost_model"].iloc[0])
    clock = clock_text(constants)

    fig, axes = plt.subplots(1, 2, figsize=(7.2, 2.5))
    ax = axes[0]
    x = np.arange(len(hosts))
    width = 0.8 / len(DESIGNS)
    for i, label in enumerate(DESIGNS):
        s = tiers[(tiers["source"] == first) & (tiers["label"] == label) & (tiers["capacity_tokens"] == gpu0)]
        s = s.set_index("host_tokens").reindex(hosts)
        pos = x + (i - (len(DESIGNS) - 1) / 2) * width
        ax.bar(pos, s["device_hit_rate"], width, color=PALETTE[label], label=f"{label} device")
        ax.bar(
            pos,
            s["host_hit_rate"],
            width,
            bottom=s["device_hit_rate"],
            color=PALETTE[label],
            alpha=0.45,
            label=f"{label} host",
        )
        p = (
            pooled[
                (pooled["source"] == first)
                & (pooled["label"] == f"pooled-{label}")
                & (pooled["gpu_tokens"] == gpu0)
            ]
            .set_index("host_tokens")
            .reindex(hosts)
        )
        ax.scatter(
            pos,
            p["hit_rate"],
            marker="_",
            s=80,
            color="black",
            zorder=3,
            label="pooled (one pool)" if i == 0 else None,
        )
    ax.set_xticks(x, [f"host {millions(h)}M" if h else "no host tier" for h in hosts], fontsize=7)
    ax.set_ylabel("token hit rate")
    ax.set_title(f"{first.removeprefix('mooncake-')}, GPU {millions(gpu0)}M tokens", fontsize=8)
    ax.legend(fontsize=5.5, ncol=2, loc="center left")
    ax = axes[1]
    # The designs often coincide: each gets its own marker and a small sideways offset, so that
    # hashchain's line does not hide under radix's.
    marks = {"hashchain": ("s", -0.04), "radix": ("o", 0.04)}
    for label in DESIGNS:
        marker, shift = marks.get(label, ("^", 0.0))
        for gpu, style in zip(gpus, ("-", "--"), strict=False):
            s = tiers[
                (tiers["source"] == first) & (tiers["label"] == label) & (tiers["capacity_tokens"] == gpu)
            ]
            s = s.sort_values("host_tokens")
            ax.plot(
                np.arange(len(s)) + shift,
                s["ttft_p90_s"],
                ls=style,
                marker=marker,
                ms=3.5,
                mfc="none" if label == "hashchain" else None,
                color=PALETTE[label],
                label=f"{label}, GPU {millions(gpu)}M",
            )
    ax.set_xticks(np.arange(len(hosts)), [f"{millions(h)}M" for h in hosts], fontsize=7)
    ax.set_xlabel("host tier (tokens)", fontsize=7)
    ax.set_ylabel(f"TTFT p90 (s, {clock_label(constants)} clock)")
    ax.legend(fontsize=5.5)
    fig.tight_layout()
    out = [save(fig, STUDY, paper)]
    rows, values = table_values(tiers, pooled, sources, gpus, hosts)
    out.append(
        write_table_tex(
            paper,
            STUDY,
            HEADER,
            rows,
            "llrrrrrrrrrr",
            f"The small default (\\texttt{{make reproduce}}): a host tier under the device pool for the "
            f"first {values['tierLimit']} requests of each "
            "Mooncake trace on one engine at 70\\% of its no-cache load. Device and host: shares of "
            "prompt tokens reused from each tier; pooled: one device pool of both sizes (replay). TTFT "
            f"in simulated seconds (clock: {clock}) with host loads on a 50~GB/s link; bytes at "
            "128~KiB a token (Llama-3-8B).",
            "tab:tiers",
            fit_width=True,
        )
    )
    out.append(write_macros(paper, "tiers_values", values))
    cpu: dict[str, str] = {"tierMeasured": "no"}  # the paper guards the comparison with \ifx
    if (results / CPU_CLOCK_RESULTS / STUDY / "config.json").exists():  # the study on the CPU clock
        cpu_study = read_study(results / CPU_CLOCK_RESULTS)
        _, cpu = table_values(*cpu_study)
        cpu["tierMaxHitGapPts"] = fmt(max_hit_gap(tiers, cpu_study[0]) * 100)
        cpu["tierMeasured"] = "yes"
    out.append(write_macros(paper, "tiers_values_cpu", other_clock_macros(cpu, "tier")))
    return out


def max_hit_gap(a: Any, b: Any) -> float:
    """The largest difference of a device, host or total hit rate between two runs' cells."""
    on = ["source", "label", "capacity_tokens", "host_tokens"]
    rates = ["device_hit_rate", "host_hit_rate", "total_hit_rate"]
    both = a[on + rates].merge(b[on + rates], on=on, suffixes=("", "_b"), validate="one_to_one")
    if len(both) != len(a):
        raise ValueError(f"the two runs have different cells: {len(a)} and {len(b)} -> {len(both)} matched")
    return max(float((both[r] - both[f"{r}_b"]).abs().max()) for r in rates)


HEADER = [
        "trace",
        "design",
        "GPU",
        "host",
        "device \\%",
        "host \\%",
        "pooled \\%",
        "TTFT p50",
        "p90",
        "loaded GB",
        "stored GB",
        "host evicted M",
    ]


def table_values(tiers: Any, pooled: Any, sources: list[str], gpus: list[int],
                 hosts: list[int]) -> tuple[list[list[str]], dict[str, str]]:
    """The table's rows and the paper's values (``tier...`` macros) of one run of the study."""
    rows = []
    values: dict[str, str] = {"tierLimit": str(int(tiers["limit"].iloc[0])) if "limit" in tiers else "--"}
    constants = json.loads(tiers["cost_model"].iloc[0])
    clock = clock_from_constants(constants)
    values["tierClock"] = clock_text(constants)
    full = TOKEN_BUDGET * (TOKEN_BUDGET + 1) // 2  # a fresh prefill filling a step
    values["tierPrefillUsPerToken"] = fmt(clock.step_time(TOKEN_BUDGET, 0, 1, full, 0) / TOKEN_BUDGET * 1e6)
    gb = LLAMA3_8B_BYTES_PER_TOKEN / 1e9
    for source in sources:
        for label in [*DESIGNS, *VARIANTS]:
            for gpu in gpus:
                for host in hosts:
                    r = tiers[
                        (tiers["source"] == source)
                        & (tiers["label"] == label)
                        & (tiers["capacity_tokens"] == gpu)
                        & (tiers["host_tokens"] == host)
                    ]
                    if r.empty:
                        continue
                    r0 = r.iloc[0]
                    design = label.split("-")[0]
                    p = pooled[
                        (pooled["source"] == source)
                        & (pooled["label"] == f"pooled-{design}")
                        & (pooled["gpu_tokens"] == gpu)
                        & (pooled["host_tokens"] == host)
                    ]
                    pooled_rate = "--" if p.empty else fmt(float(p["hit_rate"].iloc[0]) * 100)
                    rows.append(
                        [
                            source.removeprefix("mooncake-"),
                            label,
                            f"{millions(gpu)}M",
                            f"{millions(host)}M",
                            fmt(float(r0["device_hit_rate"]) * 100),
                            fmt(float(r0["host_hit_rate"]) * 100),
                            pooled_rate,
                            fmt(float(r0["ttft_p50_s"])),
                            fmt(float(r0["ttft_p90_s"])),
                            fmt(float(r0["loaded_tokens"]) * gb),
                            fmt(float(r0["stored_tokens"]) * gb),
                            fmt(float(r0["host_evicted_tokens"]) / 1e6),
                        ]
                    )
                    at = f"Gpu{size_word(gpu)}Host{size_word(host)}"
                    key = f"tier{SOURCE_WORD[source]}{LABEL_WORD[label]}{at}"
                    values[f"{key}Device"] = fmt(float(r0["device_hit_rate"]) * 100)
                    values[f"{key}Host"] = fmt(float(r0["host_hit_rate"]) * 100)
                    values[f"{key}Total"] = fmt(float(r0["total_hit_rate"]) * 100)
                    values[f"{key}Pooled"] = pooled_rate
                    values[f"{key}TtftNinety"] = fmt(float(r0["ttft_p90_s"]))
                    values[f"{key}HostEvictedM"] = fmt(float(r0["host_evicted_tokens"]) / 1e6)
                    hits = float(r0["host_hits"])
                    moved = float(r0["loaded_tokens"]) + float(r0["stored_tokens"])
                    values[f"{key}BytesPerHit"] = fmt(moved / hits, 1) if hits else "--"
    link = HostLink()  # the engine's default link, which the study uses
    values["tierLoadUsPerToken"] = fmt(link.bytes_per_token / link.bandwidth_bytes_per_s * 1e6)
    values["tierLinkGBs"] = fmt(link.bandwidth_bytes_per_s / 1e9, 0)
    for source in sources:
        at = tiers[(tiers["source"] == source)]
        values[f"tier{SOURCE_WORD[source]}PromptM"] = fmt(float(at["prompt_tokens"].iloc[0]) / 1e6)
    return rows, values


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
