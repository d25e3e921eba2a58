"""Table: the host tier on whole traces (the tier study's full grid). Reads the committed
``results/tiers_full/`` (``make tiers-full``); writes ``generated/tiers_full.tex`` and
``generated/tiers_full_values.tex`` (``tierFull...`` macros; ``tierFullRan`` is "no" and the
table empty when the grid was never run).

Every rate is a share of the prompt tokens of the whole trace (the engine study's
denominator). "Pooled" is one device pool of both tiers' size, replayed; the gap is the tier's
total rate minus it, with a 95% interval over conversations (the same resamples for both). A
tier "recovers" the pooled rate where that interval reaches 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from prefixcache.experiments.figures.fig_tiers import LABEL_WORD
from prefixcache.experiments.figures.plotting import (
    SOURCE_WORD,
    figure_main,
    fmt,
    write_macros,
    write_table_tex,
)
from prefixcache.experiments.figures.study_tiers import FULL, POLICIES, SCALE, UNBOUNDED

from prefixcache.tiers import LLAMA3_8B_BYTES_PER_TOKEN

POLICY_NAME = {  # the table's name of each label's write policy
    "hashchain": "hashchain LRU",
    "hashchain-arc": "hashchain ARC",
    "radix": "radix write-through",
    "radix-selective": "radix selective",
    "radix-write-back": "radix write-back",
}
SIZE_WORD = {
    "0": "None",
    "1M": "OneM",
    "3M": "ThreeM",
    "10M": "TenM",
    "50M": "FiftyM",
    UNBOUNDED: "Unbounded",
}
HEADER = [
    "trace",
    "GPU",
    "host",
    "policy",
    "device \\%",
    "host \\%",
    "total \\% (95\\% CI)",
    "pooled \\%",
    "gap pt (95\\% CI)",
    "host-size pool \\%",
    "gap pt (95\\% CI)",
    "host evicted M",
    "TTFT p90 s",
]


def pct(x: float) -> str:
    """A rate in percent to a hundredth (the bounds are this close to the tiers)."""
    return fmt(float(x) * 100, 2)


def points(rate: float) -> str:
    """A gap in points, signed, to a thousandth (some gaps are hundredths)."""
    return f"{rate * 100:+.3f}"


def size(tokens: int) -> str:
    return f"{tokens / 1e6:g}M"


def size_word(name: str) -> str:
    """Macro spelling of a size's name (letters only): 10M -> TenM; another size by its digits."""
    return SIZE_WORD.get(name) or "Size" + "".join("abcdefghij"[int(d)] for d in name if d.isdigit())


def values(table: pd.DataFrame, meta: dict, runtime: pd.DataFrame) -> dict[str, str]:
    """The ``tierFull...`` macros of the committed grid."""
    tiers = table[table["part"] == "tiers"]
    out = {
        "tierFullRan": "yes",
        "tierFullCells": str(len(table)),
        "tierFullGridCells": str(meta["grid_cells"]),
        "tierFullTierCells": str(len(tiers)),
        "tierFullExecutor": meta["executor"],
        "tierFullJobs": str(meta["jobs"]),
        "tierFullCellWallMin": fmt(meta["cell_wall_s"] / 60, 0),
        "tierFullTraces": ", ".join(t.removeprefix("mooncake-") for t in meta["traces"]),
        "tierFullGpusM": ", ".join(size(g) for g in meta["gpus"]),
        # the 3M-device half on both traces (the text's second device size)
        "tierFullThreeMRan": "yes" if {3_000_000} <= set(tiers["device_tokens"]) and
        tiers[tiers["device_tokens"] == 3_000_000]["trace"].nunique() == 2 else "no",
    }
    grid = SCALE["full"]
    # the cells not run, as "the cells <rest> have not run" reads them
    rest = [f"of the {t.removeprefix('mooncake-')} trace" for t in grid["traces"] if t not in meta["traces"]]
    rest += [f"at {size(g)} device tokens" for g in grid["gpus"] if g not in meta["gpus"]]
    # what the paper says of the rest (ends the sentence that gives the cells run)
    out["tierFullRestNote"] = (
        f"; the cells {' or '.join(rest)} have not run (\\texttt{{paper/LOG.md}})" if rest else ""
    )
    walls = runtime.set_index("cell")["wall_s"]
    for design, word in (("hashchain", "Hash"), ("radix", "Radix")):
        cells = tiers[(tiers["design"] == design) & (tiers["host"] != "0")]["cell"]
        if len(cells):
            out[f"tierFull{word}CellMinMin"] = fmt(float(walls[cells].min()) / 60)
            out[f"tierFull{word}CellMaxMin"] = fmt(float(walls[cells].max()) / 60)
    hosted = tiers[tiers["host"] != "0"]
    recovered = hosted[hosted["gap_hi"] >= 0]
    out["tierFullHostedCells"] = str(len(hosted))
    out["tierFullRecovered"] = str(len(recovered))
    for trace, t in table.groupby("trace"):
        src = SOURCE_WORD["mooncake-" + trace]
        out[f"tierFull{src}PromptM"] = fmt(float(t["prompt_tokens"].iloc[0]) / 1e6)
        out[f"tierFull{src}Requests"] = str(int(t["requests"].iloc[0]))
        unbounded = t[t["host"] == UNBOUNDED]
        if len(unbounded):
            out[f"tierFull{src}UnboundedM"] = fmt(float(unbounded["host_tokens"].iloc[0]) / 1e6)
    gb = LLAMA3_8B_BYTES_PER_TOKEN / 1e9
    for _, r in table.iterrows():
        src = SOURCE_WORD["mooncake-" + r["trace"]]
        at = f"Gpu{size_word(size(r['device_tokens']))}Host{size_word(r['host'])}"
        if r["part"] == "host-pool":  # a bound without a device part: its rate only
            out[f"tierFull{src}HostPool{LABEL_WORD[r['design']]}Host{size_word(r['host'])}"] = pct(
                r["token_hit_rate"]
            )
            continue
        if r["part"] == "pooled":
            out[f"tierFull{src}Pooled{LABEL_WORD[r['design']]}{at}"] = pct(r["token_hit_rate"])
            continue
        key = f"tierFull{src}{LABEL_WORD[r['label']]}{at}"
        out[f"{key}Device"] = pct(r["device_hit_rate"])
        out[f"{key}Host"] = pct(r["host_hit_rate"])
        out[f"{key}Total"] = pct(r["token_hit_rate"])
        out[f"{key}TotalCI"] = f"{pct(r['token_hit_rate_lo'])}--{pct(r['token_hit_rate_hi'])}"
        out[f"{key}HostEvictedM"] = fmt(float(r["host_evicted_tokens"]) / 1e6)
        out[f"{key}StoredGB"] = fmt(float(r["stored_tokens"]) * gb, 0)
        out[f"{key}StoredM"] = fmt(float(r["stored_tokens"]) / 1e6)
        out[f"{key}TtftNinety"] = fmt(float(r["ttft_p90_s"]), 2)
        if pd.notna(r["gap_to_pooled"]):
            out[f"{key}Pooled"] = pct(r["pooled_hit_rate"])
            out[f"{key}GapPts"] = points(r["gap_to_pooled"])
            out[f"{key}GapCI"] = f"{points(r['gap_lo'])} to {points(r['gap_hi'])}"
        if pd.notna(r["host_pool_gap"]):
            out[f"{key}HostPool"] = pct(r["host_pool_hit_rate"])
            out[f"{key}HostPoolGapPts"] = points(r["host_pool_gap"])
            out[f"{key}HostPoolGapCI"] = f"{points(r['host_pool_gap_lo'])} to {points(r['host_pool_gap_hi'])}"
    return out


def gap_text(r: pd.Series, prefix: str) -> str:
    """A gap to a bound in points with its interval, or "--" where the cell has no such bound."""
    gap, lo, hi = (r[f"{prefix}{c}"] for c in ("gap", "gap_lo", "gap_hi"))
    if pd.isna(gap):
        return "--"
    return f"{points(gap)} ({points(lo)} to {points(hi)})"


def rows(table: pd.DataFrame) -> list[list[str]]:
    order = {label: i for i, label in enumerate(POLICIES)}
    hosts = {"0": 0, "10M": 1, "50M": 2, UNBOUNDED: 3}
    tiers = table[table["part"] == "tiers"].rename(columns={"gap_to_pooled": "gap"})
    tiers = tiers.assign(
        _order=[(r.trace, r.device_tokens, hosts.get(r.host, 9), order[r.label]) for r in tiers.itertuples()]
    )
    out = []
    for _, r in tiers.sort_values("_order").iterrows():
        out.append(
            [
                r["trace"],
                size(r["device_tokens"]),
                r["host"],
                POLICY_NAME[r["label"]],
                pct(r["device_hit_rate"]),
                pct(r["host_hit_rate"]),
                f"{pct(r['token_hit_rate'])} ({pct(r['token_hit_rate_lo'])}--{pct(r['token_hit_rate_hi'])})",
                pct(r["pooled_hit_rate"]) if pd.notna(r["pooled_hit_rate"]) else "--",
                gap_text(r, ""),
                pct(r["host_pool_hit_rate"]) if pd.notna(r["host_pool_hit_rate"]) else "--",
                gap_text(r, "host_pool_"),
                fmt(float(r["host_evicted_tokens"]) / 1e6),
                fmt(float(r["ttft_p90_s"]), 2),
            ]
        )
    return out


def make(results: Path, paper: Path) -> list[Path]:
    folder = results / FULL
    if not (folder / "summary.csv").exists():
        (paper / "generated").mkdir(parents=True, exist_ok=True)
        empty = paper / "generated" / "tiers_full.tex"
        empty.write_text(
            "% generated by prefixcache.experiments.figures (tiers_full); the full grid never ran\n"
        )
        return [empty, write_macros(paper, "tiers_full_values", {"tierFullRan": "no"})]
    table = pd.read_csv(folder / "summary.csv")
    meta = json.loads((folder / "meta.json").read_text())
    runtime = pd.read_csv(folder / "runtime.csv")
    caption = (
        "The host tier on whole Mooncake traces (\\texttt{results/tiers\\_full/}; one engine at 70\\% "
        "of its no-cache load, GPU roofline clock). Rates are shares of every prompt token of the "
        "trace. Pooled: one device pool of both sizes, replayed (host 0: the device pool alone); "
        "host-size pool: one pool of the host's size alone, replayed; gap: total minus the bound, "
        "with its 95\\% interval over conversations (paired); unbounded: a host as large as every "
        "token of the trace."
    )
    spec = "llll" + "r" * (len(HEADER) - 4)
    return [
        write_table_tex(
            paper, "tiers_full", HEADER, rows(table), spec, caption, "tab:tiers-full", fit_width=True
        ),
        write_macros(paper, "tiers_full_values", values(table, meta, runtime)),
    ]


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
