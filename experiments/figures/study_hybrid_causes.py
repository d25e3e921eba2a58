"""Study: the hybrid gaps explained, one setting at a time.

The hybrid study (``study_hybrid``) measures each design on each layout; this one asks why
they differ. Per layout, the measured gap is radix (SGLang 0.5.23's defaults; page 16 beside
window layers, page 1 beside Mamba layers, its only page there) minus hashchain B=16 (vLLM
0.33's engine defaults), in points of token hit rate. Each named cause is a difference of
runs that changes one upstream default; the causes of a layout sum to its gap exactly:

* window layouts: vLLM's sparse retention (``prefix_cache_retention_interval`` 0 -> dense),
  then what no switch names (the tree against chained block hashes, and vLLM's one shared
  pool against SGLang's two: hashchain dense -> radix with equal pools,
  ``swa_full_tokens_ratio`` 1.0), then SGLang's pool share (1.0 -> its default 0.8);
* the Mamba layout: vLLM's block floor (hashchain with a 16-token state, so a 16-token block,
  minus hashchain with a 528-token one), then what no switch names (radix minus hashchain at
  state 16), then radix's state pool (its 528-token states against 16-token ones). A
  smaller state also costs less memory, so the first and last steps both carry the state's
  size; only the first carries the floor.

Beside the chain, each setting is ablated alone on the layouts whose defaults it is (retention
0 / dense / one / two windows on hashchain; pool share 0.2 to 1.0 on radix), and the window is
swept (128 for gpt-oss, 512 and 2048 on one window layer per full layer, 1024 for Gemma 3).

Requests replay one at a time with chunked prefill, as ``study_hybrid`` runs them (the same
memory: ``capacity_tokens`` of KV in every layer). 95% intervals come from a bootstrap over
request groups (a trace's conversations, a workload's ``prompt_groups``), every variant of a
panel resampled alike. ``--scale full`` adds both whole Mooncake traces at 3M tokens per layer
and writes the committed ``results/hybrid_causes_full/`` (``make hybrid-causes-full``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    run_cells,
    save_study,
    study_main,
)
from prefixcache.experiments.figures.study_decomposition import Effects, cell_arrays, named
from prefixcache.experiments.figures.study_hybrid import floor_layout
from prefixcache.experiments.figures.study_whole_traces import machine
from prefixcache.experiments.inputs.workloads import available_workloads

STUDY = "hybrid_causes"
FULL = "hybrid_causes_full"  # the committed result of --scale full (its whole traces)
CHUNK, TRACE_CHUNK = 512, 2048  # as study_hybrid
CAPACITY, TRACE_CAPACITY = 1 << 13, 3_000_000  # tokens of KV per layer
RATIOS = [0.2, 0.4, 0.6, 1.0]  # swa_full_tokens_ratio beside SGLang's default 0.8
SMALL_STATE = 16  # the Mamba state (and so vLLM's block) without a floor

# A variant: (label, backend, page size, options, layout or None for the panel's own)
Variant = tuple[str, str, int, dict[str, Any], Any]
Combo = Mapping[str, float]  # label -> coefficient: a difference of runs' hit rates
MEASURED: Combo = {"radix": 1.0, "hashchain": -1.0}


def _swa_chain(full_ablation: bool, window: int) -> list[Variant]:
    out: list[Variant] = [
        ("hashchain", "hashchain", 16, {}, None),
        ("hashchain-dense", "hashchain", 16, {"prefix_cache_retention_interval": None}, None),
        ("radix-r1.0", "radix", 16, {"swa_full_tokens_ratio": 1.0}, None),
        ("radix", "radix", 16, {}, None),
    ]
    if full_ablation:
        out += [(f"hashchain-ret-{k}w", "hashchain", 16, {"prefix_cache_retention_interval": k * window},
                 None) for k in (1, 2)]
        out += [(f"radix-r{r}", "radix", 16, {"swa_full_tokens_ratio": r}, None) for r in RATIOS if r != 1.0]
    return out


SWA_CAUSES: dict[str, Combo] = {
    "sparse retention": {"hashchain-dense": 1.0, "hashchain": -1.0},
    "rest (no switch)": {"radix-r1.0": 1.0, "hashchain-dense": -1.0},
    "pool share": {"radix": 1.0, "radix-r1.0": -1.0},
}
MAMBA_CAUSES: dict[str, Combo] = {
    "block floor": {"hashchain-s16": 1.0, "hashchain": -1.0},
    "rest (no switch)": {"radix-s16": 1.0, "hashchain-s16": -1.0},
    "state pool": {"radix": 1.0, "radix-s16": -1.0},
}
# panel -> (layout, window (None: Mamba), variants, causes)
PANELS: dict[str, tuple[Any, int | None, list[Variant], dict[str, Combo]]] = {
    "gemma3-like": ("gemma3-like", 1024, _swa_chain(True, 1024), SWA_CAUSES),
    "gpt-oss-like": ("gpt-oss-like", 128, _swa_chain(True, 128), SWA_CAUSES),
    "window-512": ([["sliding_window", 512], ["full"]], 512, _swa_chain(False, 512), SWA_CAUSES),
    "window-2048": ([["sliding_window", 2048], ["full"]], 2048, _swa_chain(False, 2048), SWA_CAUSES),
    "mamba-hybrid": ("mamba-hybrid", None, [
        ("hashchain", "hashchain", 16, {}, None),
        ("radix", "radix", 1, {}, None),
        ("hashchain-s16", "hashchain", 16, {}, floor_layout(SMALL_STATE)),
        ("radix-s16", "radix", 1, {}, floor_layout(SMALL_STATE)),
    ], MAMBA_CAUSES),
}
SCALE: dict[str, dict[str, Any]] = {
    "tiny": dict(workloads=["multi-turn-chat"], seeds=1, traces=[]),
    "default": dict(workloads=available_workloads(), seeds=3, traces=[]),
    "full": dict(workloads=available_workloads(), seeds=3, traces=list(MOONCAKE_TRACES)),
}
# runs.csv: each run of the full grid by name with its integer counts, which a later
# default-scale run is checked against exactly (as study_decomposition's)
RUN_KEYS = ["cell", "panel", "label", "source", "seed"]
RUN_COUNTS = ["hits", "queries", "evicted_tokens", "hit_tokens", "prompt_tokens"]


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    cells = [(wl, seed, CAPACITY, CHUNK) for wl in s["workloads"] for seed in range(s["seeds"])]
    cells += [(trace, 0, TRACE_CAPACITY, TRACE_CHUNK) for trace in s["traces"]]
    out = []
    for source, seed, capacity, chunk in cells:
        for panel, (layout, _, variants, _) in PANELS.items():
            for label, backend, page, options, own_layout in variants:
                c = cell_config(STUDY, source=source, backend=backend, page_size=page,
                                capacity_tokens=capacity, mode="chunked-replay", options=options,
                                label=label, seed=seed,
                                layout=own_layout if own_layout is not None else layout, chunk=chunk)
                c["panel"] = panel
                out.append(c)
    return out


def panel_effects(cells: pd.DataFrame, out: Path) -> tuple[Effects, int]:
    """The hit rates of one (source, panel)'s variants, every seed's requests in their own
    groups, resampled alike; and how many groups."""
    labels = list(dict.fromkeys(cells["label"]))
    hit_g, prompt_g, weights = cell_arrays(cells, labels, out, STUDY)
    return Effects(labels, hit_g, prompt_g, weights), len(prompt_g)


def coefficients(effect: Effects, coefs: Combo) -> np.ndarray:
    """``coefs`` as a vector over the effect's variants."""
    c = np.zeros(len(effect.col))
    for label, k in coefs.items():
        c[effect.col[label]] += k
    return c


def combo(effect: Effects, coefs: Combo) -> tuple[float, float, float]:
    """sum(coefficient x hit rate) over runs, in points, with its 95% interval."""
    c = coefficients(effect, coefs)
    lo, hi = np.percentile(effect.boot @ c, [2.5, 97.5])
    return float(effect.rate @ c), float(lo), float(hi)


def tables(df: pd.DataFrame, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(causes: one row per source, panel and cause, its points and interval beside the
    measured gap's; rates: one row per source, panel and variant, its hit rate, interval and
    what it evicted). Raises if a panel's causes do not sum to its gap."""
    cause_rows, rate_rows = [], []
    for (source, panel), cells in df.groupby(["source", "panel"], sort=True):
        effect, num_groups = panel_effects(cells, out)
        gap = combo(effect, MEASURED)
        causes = PANELS[panel][3]
        total = sum(coefficients(effect, c) for c in causes.values())
        if not np.allclose(total, coefficients(effect, MEASURED)):
            raise RuntimeError(f"{panel}: its causes do not sum to the measured gap")
        common = dict(source=source, panel=panel, seeds=int(cells["seed"].nunique()), groups=num_groups)
        for cause, coefs in causes.items():
            cause_rows.append(dict(**common, cause=cause, **named("chain", combo(effect, coefs)),
                                   **named("measured", gap)))
        evicted = cells.groupby("label")["evicted_tokens"].sum()
        for label, i in effect.col.items():
            lo, hi = np.percentile(effect.boot[:, i], [2.5, 97.5])
            rate_rows.append(dict(source=source, panel=panel, label=label, hit_rate_pt=float(effect.rate[i]),
                                  hit_rate_lo=float(lo), hit_rate_hi=float(hi),
                                  evicted_tokens=int(evicted[label])))
    return pd.DataFrame(cause_rows), pd.DataFrame(rate_rows)


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    t0 = time.perf_counter()
    cfgs = configs(scale)
    # a trace panel's cells in one process, reading the trace once (a workload's requests
    # grow by their planned answers: not shared)
    df = run_cells(cfgs, out, force=force, jobs=jobs,
                   group=lambda c: (c["source"], c["panel"]) if c["source"] in MOONCAKE_TRACES else id(c))
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "panels": list(PANELS),
                                "capacity": CAPACITY, "trace_capacity": TRACE_CAPACITY})
    causes, rates = tables(df, out)
    # simulated hits only (no wall clock): the same on every machine
    causes.to_csv(out / STUDY / "causes.csv", index=False, float_format="%.6g")
    rates.to_csv(out / STUDY / "rates.csv", index=False, float_format="%.6g")
    if scale == "full":
        folder = out / FULL
        folder.mkdir(parents=True, exist_ok=True)
        causes.to_csv(folder / "causes.csv", index=False, float_format="%.6g")
        rates.to_csv(folder / "rates.csv", index=False, float_format="%.6g")
        df[RUN_KEYS + RUN_COUNTS].to_csv(folder / "runs.csv", index=False)
        command = "make hybrid-causes-full" if sys.argv[:1] == ["-c"] else " ".join(sys.argv)
        meta = dict(command=command, date=time.strftime("%Y-%m-%d"), machine=machine(), jobs=jobs,
                    cells=len(df), wall_s=round(time.perf_counter() - t0, 1),
                    cell_wall_s=round(float(df["wall_s"].sum()), 1))
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
