"""Figure: cost of cache operations against prompt length and cache size, from
``results/bench/ops.csv`` (written by ``prefixcache.experiments.bench``). Writes
``figures/ops`` and ``generated/ops.tex``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from prefixcache.experiments.figures.plotting import figure_main, fmt, placeholder, save, write_macros


def make(results: Path, paper: Path) -> list[Path]:
    path = results / "bench" / "ops.csv"
    if not path.exists():
        msg = "no results/bench/ops.csv:\nrun python -m prefixcache.experiments.bench"
        return [placeholder("ops", paper, msg),
                write_macros(paper, "ops", {"opsMeasured": "no"})]
    df = pd.read_csv(path)
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 2.6))
    by_len = df[df["variable"] == "prompt_tokens"].copy()
    by_len["ns_per_token"] = by_len["seconds"] / by_len["value"] * 1e9
    for (label, op), g in by_len.groupby(["backend", "op"]):
        axes[0].plot(g["value"], g["ns_per_token"], "o-" if op == "lookup_hit" else "x--", ms=3, lw=1,
                     label=f"{label} {op}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("prompt length (tokens)")
    axes[0].set_ylabel("ns per token")
    axes[0].legend(fontsize=5)
    by_size = df[(df["variable"] == "cache_pages") & (df["op"] == "cycle_evicting")]
    for label, g in by_size.groupby("backend"):
        axes[1].plot(g["value"], g["seconds"] * 1e3, "o-", ms=3, lw=1, label=label)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("cache size (pages), full of evictable entries")
    axes[1].set_ylabel("ms per 1k-token admit cycle")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    out = [save(fig, "ops", paper)]
    longest = by_len[by_len["value"] == by_len["value"].max()]
    per = longest.set_index(["backend", "op"])["ns_per_token"]
    names = {"hashchain-sha256": "HashSha", "hashchain-xxhash": "HashXx", "radix-p1": "RadixOne",
             "radix-p16": "RadixSixteen"}
    values = {"opsMeasured": "yes", "opsLongest": f"{int(by_len['value'].max()):,}".replace(",", "{,}")}
    for label, name in names.items():
        for op, oname in (("lookup_hit", "Lookup"), ("cycle_miss", "Cycle")):
            if (label, op) in per.index:
                values[f"ops{oname}{name}"] = fmt(float(per[(label, op)]))
    summary = results / "bench" / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        for label, name in names.items():
            if label in s:
                values[f"opsFlat{name}"] = fmt(float(s[label]["cycle_evicting_max_over_min"]), 2)
                values[f"opsExp{name}"] = fmt(float(s[label]["lookup_exponent"]), 2)
    out.append(write_macros(paper, "ops", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
