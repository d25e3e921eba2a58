"""Study: hit rates over the *whole* Mooncake traces, the paper's main capacity result.

One tidy file, ``results/whole_traces/hit_rates.csv``, one row per (trace, capacity, backend,
page size, policy, convention): rates as fractions in [0, 1], requests counted and rejected
ones (larger than the cache) counted apart.

- ``block-model`` rows (every scale): the block-level model of ``analysis/bounds.py`` on the
  traces' own 512-token block ids, under both conventions of ``analysis/metrics.py`` (C1:
  Mooncake's ids as they come; C2: the engine's n-1 cap, full blocks only): block-LRU, the
  offline optimum (Belady, block level) and the infinite cache (``capacity_tokens`` = inf).
  Whole traces take seconds.
- ``block-model`` policy rows (every scale, C2, 1M-10M tokens): every eviction policy of
  ``prefixcache.eviction`` on the same model (``analysis/eviction_model.py``: leaves only,
  every block one page, time = request index), our online ``lrp`` and the offline
  ``reuse-oracle`` (knows whether a block is reused, not when).
- backend rows (``--scale full`` only: one whole-trace replay takes minutes on 2 cores): both
  complete traces replayed request by request through hashchain (B=16; LRU, lrp, gdsf) and
  radix (page 1: LRU; page 16: LRU, LFU, SLRU, FIFO, priority, gdsf, lrp), convention C2 (what the
  backends do). Replay mode emits no output, so lrp's output-length feature is always zero here.

Mooncake's trace hashes 512-token blocks, so it cannot tell the designs apart below 512 tokens.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis import bounds, eviction_model
from prefixcache.experiments.analysis.metrics import CONVENTIONS, block_id_hit_rates, block_id_trace
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    run_cells,
    study_main,
)
from prefixcache.experiments.inputs.traces import MOONCAKE_BLOCK, read_mooncake

from prefixcache.eviction import POLICIES

STUDY = "whole_traces"
FULL = "whole_traces_full"  # the committed result of --scale full
TRACES = {"conversation": "mooncake-conversation", "synthetic": "mooncake-synthetic"}
CAPACITIES = [1_000_000, 2_000_000, 3_000_000, 6_000_000, 10_000_000, 50_000_000]
BLOCK_POLICIES = {"lru": bounds.lru_hits, "belady": bounds.belady_hits}
# Block-model eviction policies beyond LRU and Belady, at the capacities eviction is judged at.
MODEL_POLICIES = [p for p in POLICIES if p != "lru"] + list(eviction_model.MODEL_POLICIES)
POLICY_CAPACITIES = CAPACITIES[:5]
BACKENDS = [("hashchain", 16, ["lru", "lrp", "gdsf"]), ("radix", 1, ["lru"]),
            ("radix", 16, ["lru", "lfu", "slru", "fifo", "priority", "gdsf", "lrp"])]
SCALE = {
    # tiny: the test suite's, every kind of row on a few requests
    "tiny": dict(limit=100, backends=True, capacities=[1_000_000, 3_000_000, 50_000_000],
                 policy_capacities=[1_000_000, 3_000_000, 10_000_000]),
    "default": dict(limit=None, backends=False, capacities=CAPACITIES, policy_capacities=POLICY_CAPACITIES),
    "full": dict(limit=None, backends=True, capacities=CAPACITIES, policy_capacities=POLICY_CAPACITIES),
}
COLUMNS = ["trace", "capacity_tokens", "backend", "page_size", "policy", "convention",
           "token_hit_rate", "block_hit_rate", "requests", "rejected"]


def block_model_rows(limit: int | None, capacities: list[int]) -> list[dict[str, Any]]:
    rows = []
    for trace, source in TRACES.items():
        records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
        for convention in CONVENTIONS:
            blocks = block_id_trace(records, convention)
            runs = {("infinite", math.inf): bounds.infinite_cache_hits(blocks)}
            for policy, hits_at in BLOCK_POLICIES.items():
                for cap in capacities:
                    runs[(policy, cap)] = hits_at(blocks, cap // MOONCAKE_BLOCK)
            for (policy, cap), hits in runs.items():
                token_rate, block_rate = block_id_hit_rates(records, hits)
                rows.append(dict(trace=trace, capacity_tokens=cap, backend="block-model",
                                 page_size=MOONCAKE_BLOCK, policy=policy, convention=convention,
                                 token_hit_rate=token_rate, block_hit_rate=block_rate,
                                 requests=len(records), rejected=0))
    return rows


def policy_rows(
    trace: str, policy: str, limit: int | None, capacities: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One block-model policy on one trace (convention C2) at each capacity: its hit_rates rows
    (none for lru and belady, which ``block_model_rows`` has) and its token hit rate on each
    half of the trace (``lrp`` was tuned on the first halves; the second is held out)."""
    records = read_mooncake(MOONCAKE_TRACES[TRACES[trace]])[:limit]
    blocks = block_id_trace(records, "C2")
    prompts, outputs = [r.input_length for r in records], [r.output_length for r in records]
    rows, halves = [], []
    middle = len(records) // 2
    for cap in capacities:
        if policy in BLOCK_POLICIES:
            hits = BLOCK_POLICIES[policy](blocks, cap // MOONCAKE_BLOCK)
        else:
            hits = eviction_model.policy_hits(blocks, cap // MOONCAKE_BLOCK, policy, prompts, outputs)
            token_rate, block_rate = block_id_hit_rates(records, hits)
            rows.append(dict(trace=trace, capacity_tokens=cap, backend="block-model",
                             page_size=MOONCAKE_BLOCK, policy=policy, convention="C2",
                             token_hit_rate=token_rate, block_hit_rate=block_rate,
                             requests=len(records), rejected=0))
        for half, part in (("first", slice(0, middle)), ("second", slice(middle, None))):
            halves.append(dict(trace=trace, half=half, capacity_tokens=cap, policy=policy,
                               token_hit_rate=block_id_hit_rates(records[part], hits[part])[0]))
    return rows, halves


def all_policy_rows(
    limit: int | None, capacities: list[int], jobs: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from joblib import Parallel, delayed

    tasks = [(trace, policy) for trace in TRACES for policy in [*BLOCK_POLICIES, *MODEL_POLICIES]]
    parts = Parallel(n_jobs=jobs)(delayed(policy_rows)(t, p, limit, capacities) for t, p in tasks)
    return [r for rows, _ in parts for r in rows], [h for _, halves in parts for h in halves]


def backend_configs(limit: int | None, capacities: list[int]) -> list[dict[str, Any]]:
    out = []
    for trace, source in TRACES.items():
        for backend, page, policies in BACKENDS:
            for policy in policies:
                # hashchain's lru is vLLM's default: no option, so its cells keep their names
                options = {} if (backend, policy) == ("hashchain", "lru") else {"eviction_policy": policy}
                for cap in capacities:
                    out.append(cell_config(STUDY, source=source, backend=backend, page_size=page,
                                           capacity_tokens=cap, mode="replay", options=options,
                                           label=f"{trace}-{policy}", limit=limit))
    return out


def backend_rows(cells: pd.DataFrame) -> list[dict[str, Any]]:
    trace_of = {source: trace for trace, source in TRACES.items()}
    rows = []
    for c in cells.to_dict("records"):
        policy = json.loads(c["options"]).get("eviction_policy", "lru")
        rows.append(dict(trace=trace_of[c["source"]], capacity_tokens=c["capacity_tokens"],
                         backend=c["backend"], page_size=c["page_size"], policy=policy, convention="C2",
                         token_hit_rate=c["hit_rate"], block_hit_rate=c["block_hit_rate"],
                         requests=c["requests"], rejected=c["rejected"]))
    return rows


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    s = SCALE[check_scale(scale)]
    t0 = time.perf_counter()
    rows = block_model_rows(s["limit"], s["capacities"])
    policy_table, halves = all_policy_rows(s["limit"], s["policy_capacities"], jobs)
    rows += policy_table
    if s["backends"]:
        # One process per trace shares its request list across that trace's cells.
        cells = run_cells(backend_configs(s["limit"], s["capacities"]), out, force=force, jobs=jobs,
                          group=lambda c: c["source"])
        rows += backend_rows(cells)
    df = pd.DataFrame(rows, columns=COLUMNS)
    caps = [c if math.isinf(c) else int(c) for c in df["capacity_tokens"]]
    df["capacity_tokens"] = pd.Series(caps, index=df.index, dtype=object)  # ints, and inf
    # The full scale's rows take an hour: they are a committed result (results/whole_traces_full/,
    # written by `make whole-traces-full` only, with where and how they were made).
    folder = out / (FULL if scale == "full" else STUDY)
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "hit_rates.csv", index=False)
    pd.DataFrame(halves).to_csv(folder / "policy_halves.csv", index=False)
    if scale == "full":
        meta = dict(command=" ".join(sys.argv), date=time.strftime("%Y-%m-%d"), machine=machine(),
                    wall_s=round(time.perf_counter() - t0, 1))
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{STUDY}: {len(df)} rows -> {folder / 'hit_rates.csv'}")
    return folder


def machine() -> str:
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, {python}"


def load_hit_rates(results: Path, full: bool = False) -> pd.DataFrame:
    """The default scale's rows, or (``full``) the committed full-scale result."""
    return pd.read_csv(results / (FULL if full else STUDY) / "hit_rates.csv")


def find_rate(df: pd.DataFrame, trace: str, policy: str, capacity: float, *, convention: str = "C2",
              backend: str = "block-model", page_size: int | None = None,
              column: str = "token_hit_rate") -> float | None:
    """One row's rate in a hit_rates table (capacity ``math.inf`` for the infinite cache), or
    None if the table has no such row."""
    sel = ((df["trace"] == trace) & (df["backend"] == backend) & (df["convention"] == convention)
           & (df["policy"] == policy) & (df["capacity_tokens"].astype(float) == float(capacity)))
    if page_size is not None:
        sel &= df["page_size"] == page_size
    rows = df[sel]
    return float(rows[column].iloc[0]) if len(rows) else None


def hit_rate(df: pd.DataFrame, trace: str, policy: str, capacity: float, **where: Any) -> float:
    """``find_rate`` for a row that must be there (ValueError naming it otherwise)."""
    value = find_rate(df, trace, policy, capacity, **where)
    if value is None:
        raise ValueError(f"hit_rates has no row for {trace}, {policy}, {capacity} tokens, {where}")
    return value


def fraction_of_infinite(
    df: pd.DataFrame, trace: str, policy: str, convention: str, capacity: float
) -> float:
    """A block-model policy's token hit rate over the infinite cache's, same trace and convention."""
    inf = hit_rate(df, trace, "infinite", math.inf, convention=convention)
    return hit_rate(df, trace, policy, capacity, convention=convention) / inf if inf else 0.0


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
