"""Figure: mean time to first token against the achieved hit rate (SGLang Fig. 8a/b analogue),
measured under the engine's cost model, with the no-queue estimate. Reads ``results/ttft``;
writes ``figures/ttft`` and ``generated/ttft.tex``."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from prefixcache.experiments.figures.plotting import PALETTE, figure_main, fmt, load, save, write_macros

STUDY = "ttft"


def make(results: Path, paper: Path) -> list[Path]:
    df = load(results, STUDY).sort_values("shared_fraction")
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 2.6))
    for backend, g in df.groupby("backend"):
        c = PALETTE.get(backend, "0.3")
        axes[0].plot(g["hit_rate"] * 100, g["ttft_mean_s"] * 1e3, "o-", color=c, label=f"{backend} (queued)")
        axes[0].plot(g["hit_rate"] * 100, g["isolated_ttft_mean_s"] * 1e3, ":", color=c,
                     label=f"{backend} (no queue)")
        axes[1].plot(g["shared_fraction"] * 100, g["throughput_tok_s"] / 1e3, "o-", color=c, label=backend)
    axes[0].set_xlabel("achieved token hit rate (%)")
    axes[0].set_ylabel("mean TTFT (ms, simulated)")
    axes[0].legend(fontsize=6)
    axes[1].set_xlabel("shared share of each prompt (%)")
    axes[1].set_ylabel("throughput (k tokens/s, simulated)")
    fig.tight_layout()
    out = [save(fig, "ttft", paper)]
    cached = df[df["backend"] != "none"]
    lo = cached[cached["shared_fraction"] == cached["shared_fraction"].min()]
    hi = cached[cached["shared_fraction"] == cached["shared_fraction"].max()]
    values = {
        "ttftLowHit": fmt(float(lo["hit_rate"].mean()) * 100),
        "ttftHighHit": fmt(float(hi["hit_rate"].mean()) * 100),
        "ttftLowMs": fmt(float(lo["ttft_mean_s"].mean()) * 1e3),
        "ttftHighMs": fmt(float(hi["ttft_mean_s"].mean()) * 1e3),
        "ttftSpeedup": fmt(float(lo["ttft_mean_s"].mean() / hi["ttft_mean_s"].mean())),
        "ttftMaxBackendDiffMs": fmt(float(cached.pivot_table(index="shared_fraction", columns="backend",
                                                             values="ttft_mean_s").pipe(
            lambda p: (p.max(axis=1) - p.min(axis=1)).max())) * 1e3, 2),
    }
    out.append(write_macros(paper, "ttft", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
