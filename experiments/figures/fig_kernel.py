"""Figure: paged-attention kernel bandwidth (decode) and TFLOP/s (extend) against page size,
from ``results/kernel_bench/results.csv`` (GPU only, ``prefixcache.experiments.bench.kernel``).
Without it the figure says so and the text claims no kernel numbers. Writes
``figures/kernel`` and ``generated/kernel.tex``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from prefixcache.experiments.figures.plotting import (
    figure_main,
    fmt,
    placeholder,
    save,
    tex_escape,
    write_macros,
)


def make(results: Path, paper: Path) -> list[Path]:
    path = results / "kernel_bench" / "results.csv"
    if not path.exists():
        msg = "kernel not measured on a GPU:\nno results/kernel_bench/results.csv"
        return [placeholder("kernel", paper, msg),
                write_macros(paper, "kernel", {"kernelMeasured": "no", "kernelDevice": "none"})]
    df = pd.read_csv(path)
    df = df[df["impl"] == "triton"]
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 2.6))
    for ax, mode, col, ylabel in ((axes[0], "decode", "frac_peak_bw", "decode: fraction of HBM peak"),
                                  (axes[1], "extend", "frac_peak_flops", "extend: fraction of bf16 peak")):
        d = df[df["mode"] == mode]
        for (page, batch), g in d.groupby(["page_size", "batch"]):
            g = g.sort_values("context")
            ax.plot(g["context"], g[col], "o-" if page == 1 else "x--", ms=3, lw=1,
                    label=f"page {page}, batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=5)
    fig.tight_layout()
    out = [save(fig, "kernel", paper)]
    config_path = results / "kernel_bench" / "config.json"
    device = "unknown"
    if config_path.exists():
        device = json.loads(config_path.read_text()).get("device", "unknown")
    values = {"kernelMeasured": "yes", "kernelDevice": tex_escape(device)}
    for page, name in ((1, "One"), (16, "Sixteen")):
        dec = df[(df["mode"] == "decode") & (df["page_size"] == page)]
        ext = df[(df["mode"] == "extend") & (df["page_size"] == page)]
        if len(dec):
            values[f"kernelBw{name}"] = fmt(float(dec["tb_per_s"].max()), 2)
            values[f"kernelBwFrac{name}"] = fmt(float(dec["frac_peak_bw"].max()) * 100)
        if len(ext):
            values[f"kernelTflops{name}"] = fmt(float(ext["tflop_per_s"].max()), 0)
            values[f"kernelFlopFrac{name}"] = fmt(float(ext["frac_peak_flops"].max()) * 100)
    out.append(write_macros(paper, "kernel", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
