"""Figure and table: every eviction policy on the whole Mooncake traces (block model, C2), as
the fraction of the LRU -> Belady gap it closes, with our online ``lrp`` and the offline
reuse oracle. Reads ``results/whole_traces/{hit_rates,policy_halves}.csv``; writes
``figures/policies``, ``generated/policies.tex`` (table) and ``generated/policies_values.tex``;
the policies' costs come from ``results/bench/eviction.csv`` (committed; ``make bench``)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from prefixcache.experiments.figures.plotting import figure_main, save, write_macros, write_table_tex
from prefixcache.experiments.figures.study_whole_traces import FULL, MODEL_POLICIES, POLICY_CAPACITIES, STUDY

from prefixcache.eviction import SGLANG_POLICIES

TRACES = ("conversation", "synthetic")
SGLANG = SGLANG_POLICIES[1:]  # and lru, the baseline
LITERATURE = ("gdsf", "tlru", "wa", "arc", "s3fifo")  # published policies, our implementations
OURS = ("lrp", "reuse-oracle")
TABLE_CAPACITIES = tuple(POLICY_CAPACITIES)  # 1, 2, 3, 6 and 10M: ARC's worst sits at 2M and 6M
# The backends' own lrp (whole-trace replays, results/whole_traces_full): each against its own
# LRU, the gap to the block model's Belady.
BACKEND_LRP = (("hashchain", 16, "lrp, hashchain"), ("radix", 16, "lrp, radix p16"))
SHOWN_FLOOR = -1.0  # gap closed below -100% (filo, mru) is drawn at the floor


def gap_closed(rates: pd.DataFrame) -> pd.DataFrame:
    """(policy rate - LRU) / (Belady - LRU) for each (trace, capacity) row of a policy-wide table;
    NaN where there is no gap (a tiny trace prefix)."""
    gap = (rates["belady"] - rates["lru"]).where(lambda g: g > 0)
    return rates.sub(rates["lru"], axis=0).div(gap, axis=0)


def percent(fraction: float, signed: bool = False) -> str:
    """A fraction as whole percent ("--" for NaN; never "-0")."""
    if math.isnan(fraction):
        return "--"
    points = round(float(fraction) * 100)
    return f"{points:+d}" if signed and points else str(points)


def whole_trace_rates(results: Path) -> pd.DataFrame:
    df = pd.read_csv(results / STUDY / "hit_rates.csv")
    df = df[(df["backend"] == "block-model") & (df["convention"] == "C2")
            & df["capacity_tokens"].astype(float).isin([float(c) for c in POLICY_CAPACITIES])]
    df = df.assign(capacity_tokens=df["capacity_tokens"].astype(float).astype(int))
    return df.pivot_table(index=["trace", "capacity_tokens"], columns="policy", values="token_hit_rate")


def half_rates(results: Path, half: str) -> pd.DataFrame:
    df = pd.read_csv(results / STUDY / "policy_halves.csv")
    df = df[df["half"] == half]
    return df.pivot_table(index=["trace", "capacity_tokens"], columns="policy", values="token_hit_rate")


def backend_lrp_gap(results: Path, model: pd.DataFrame) -> dict[str, pd.Series]:
    """Per backend of ``BACKEND_LRP``: (its lrp rate - its LRU rate) / (Belady - its LRU rate)
    by (trace, capacity), Belady the block model's; capacities the full grid lacks are NaN."""
    path = results / FULL / "hit_rates.csv"
    if not path.exists():
        return {}
    df = pd.read_csv(path)
    df = df[(df["backend"] != "block-model") & (df["convention"] == "C2")]
    df = df.assign(capacity_tokens=df["capacity_tokens"].astype(float))
    df = df[df["capacity_tokens"].isin([float(c) for c in POLICY_CAPACITIES])]
    df = df.assign(capacity_tokens=df["capacity_tokens"].astype(int))
    out = {}
    for backend, page, label in BACKEND_LRP:
        rates = df[(df["backend"] == backend) & (df["page_size"] == page)].pivot_table(
            index=["trace", "capacity_tokens"], columns="policy", values="token_hit_rate")
        if "lrp" not in rates or "lru" not in rates:
            continue
        rates = rates.reindex(model.index)
        gap = (model["belady"] - rates["lru"]).where(lambda g: g > 0)
        out[label] = (rates["lrp"] - rates["lru"]) / gap
    return out


def cost_values(bench: Path) -> dict[str, str]:
    """Cost per evicted page against each backend's LRU (``make bench``), "--" without it."""
    names = ("polCostLrp", "polCostRankedMax", "polCostRadixMax")
    if not bench.exists():
        return dict.fromkeys(names, "--")
    df = pd.read_csv(bench)
    hashchain = df[df["backend"] == "hashchain"].set_index("policy")["ratio_to_lru"]
    fixed = hashchain.drop(["lru", "lrp"], errors="ignore")
    radix = df[df["backend"] == "radix"]["ratio_to_lru"]
    ratios = (f"{hashchain['lrp']:.1f}", f"{fixed.max():.1f}", f"{radix.max():.2f}")
    return dict(zip(names, ratios, strict=True))


def make(results: Path, paper: Path) -> list[Path]:
    gap = gap_closed(whole_trace_rates(results))
    held_out = gap_closed(half_rates(results, "second"))
    policies = [p for p in MODEL_POLICIES if p in gap.columns]
    fig, axes = plt.subplots(1, 2, figsize=(6.8, 2.7), sharey=True)
    palette = plt.get_cmap("tab20").colors
    colour = {p: palette[i % len(palette)] for i, p in enumerate(x for x in policies if x not in OURS)}
    colour.update({"lrp": "black", "reuse-oracle": "0.4"})
    for ax, trace in zip(axes, TRACES, strict=True):
        g = gap.loc[trace]
        for policy in policies:
            ours = policy in OURS
            style = "--" if policy == "reuse-oracle" else "-." if policy in LITERATURE else "-"
            ax.plot(g.index / 1e6, (g[policy].clip(lower=SHOWN_FLOOR)) * 100, marker="o", ms=3,
                    lw=1.8 if ours else 0.9, ls=style, color=colour[policy], label=policy)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlim(0.8, 12)  # fixed: a tiny prefix has no gap, hence no point to scale to
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 3, 6, 10], labels=["1M", "2M", "3M", "6M", "10M"])
        ax.set_title(f"Mooncake {trace}", fontsize=8)
        ax.set_xlabel("cache capacity (tokens)")
    axes[0].set_ylabel("LRU$\\to$Belady gap closed (%)")
    axes[1].legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    out = [save(fig, "policies", paper)]

    def cell(frame: pd.DataFrame, trace: str, cap: int, policy: str) -> str:
        return percent(float(frame.loc[(trace, cap), policy]), signed=True)

    caps = [c for c in TABLE_CAPACITIES if c in set(gap.index.get_level_values("capacity_tokens"))]
    rows = [[policy, *[cell(gap, t, c, policy) for t in TRACES for c in caps]] for policy in policies]
    rows.append(["lrp, 2nd half", *[cell(held_out, t, c, "lrp") for t in TRACES for c in caps]])
    backends = backend_lrp_gap(results, whole_trace_rates(results))
    for label, series in backends.items():
        rows.append([label, *[percent(float(series.get((t, c), float("nan"))), signed=True)
                              for t in TRACES for c in caps]])
    header = ["Policy"] + [f"{t[:3]}.\\ {c // 10**6}M" for t in TRACES for c in caps]
    caption = ("Percent of the LRU$\\to$Belady gap each policy closes on the whole Mooncake traces "
               "(block model, C2; negative: worse than LRU). SGLang's policies first, then wlfu "
               "(ours, SGLang's vocabulary), GDSF, tail-optimized LRU, workload-aware, ARC and "
               "S3-FIFO. \\emph{lrp} is ours (online); "
               "\\emph{reuse-oracle} knows whether a block is reused, not when (offline). "
               "Then \\emph{lrp} on the held-out second half of each trace, and \\emph{lrp} run by "
               "each backend over the whole traces (replays, against the backend's own LRU, "
               "\\texttt{results/whole\\_traces\\_full/hit\\_rates.csv}).")
    out.append(write_table_tex(paper, "policies", header, rows, "l" + "r" * (len(header) - 1), caption,
                               "tab:policies", fit_width=True))
    lrp, oracle = gap["lrp"], gap["reuse-oracle"]
    zoo = gap[[p for p in policies if p in SGLANG]]
    literature = gap[[p for p in policies if p in LITERATURE]]
    stacked = literature.stack().dropna()  # a tiny trace prefix has no gap: all NaN
    best_where = stacked.idxmax() if len(stacked) else ("--", 0, "--")  # (trace, capacity, policy)
    values = {
        "polLrpConvThreeM": percent(lrp.loc[("conversation", 3_000_000)]),
        "polLrpSynThreeM": percent(lrp.loc[("synthetic", 3_000_000)]),
        "polLrpMin": percent(lrp.min()),
        "polLrpMax": percent(lrp.max()),
        "polLrpHeldOutMin": percent(held_out["lrp"].min()),
        "polLrpHeldOutMax": percent(held_out["lrp"].max()),
        "polZooBest": percent(zoo.max().max()),
        "polLitBest": percent(literature.max().max()),
        "polLitBestName": best_where[2],
        "polLitBestTrace": best_where[0],
        "polLitBestCap": f"{best_where[1] // 10**6}M",
        "polSfifoConvOneM": percent(gap.loc[("conversation", 1_000_000), "s3fifo"]),
        "polSfifoConvTenM": percent(gap.loc[("conversation", 10_000_000), "s3fifo"]),
        "polArcMin": percent(gap["arc"].min()),
        "polArcMax": percent(gap["arc"].max()),
        "polOracleSynOneM": percent(oracle.loc[("synthetic", 1_000_000)]),
        "polOracleConvOneM": percent(oracle.loc[("conversation", 1_000_000)]),
    }
    values.update(cost_values(results / "bench" / "eviction.csv"))
    for label, word in (("lrp, hashchain", "Hash"), ("lrp, radix p16", "Radix")):
        closed = backends.get(label, pd.Series(dtype=float)).dropna()
        values[f"polBackend{word}LrpMin"] = percent(closed.min()) if len(closed) else "--"
        values[f"polBackend{word}LrpMax"] = percent(closed.max()) if len(closed) else "--"
    out.append(write_macros(paper, "policies_values", values))
    return out


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
