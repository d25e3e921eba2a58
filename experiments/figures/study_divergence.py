"""Study: how far a cache hit's logits are from a full recompute's, and batch invariance.

vLLM users report that a prompt's outputs change between a prefix-cache hit and a miss
(vLLM #5543, #40896, #54490) and that ``VLLM_BATCH_INVARIANT=1`` removes the change. Here, in
model mode (``experiments/analysis/divergence.py``): random prompt pairs sharing a random
prefix, the later prompt served by each cache (hashchain at 16-token blocks, radix at pages 1
and 16) after the earlier one, prefilled in chunks of several sizes, against the "none"
backend's one-step recompute; fp32, fp16 and bf16; the default model and the batch-invariant
one, and (for the dtypes of ``ablation_dtypes``) the two ablations that make only the per-token
ops or only attention invariant. A tiny random-weight decoder on CPU, its attention through the
Triton kernel under the interpreter.

One cell per (dtype, mode, seed): ``results/divergence/<dtype>-<mode>-s<seed>-<hash8>/`` holds
its ``config.json`` and ``runs`` (one row per cache and chunk size); a cell whose folder holds
the same config is read back, not re-run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from prefixcache.experiments.analysis.divergence import CACHES, MODES, TINY_MODEL, WHOLE, measure
from prefixcache.experiments.figures.common import (
    REPO_ROOT,
    check_scale,
    read_table,
    save_study,
    study_main,
    write_table,
)

MEASURED = "divergence_measured"  # the committed default-scale cells (make divergence)
STUDY = "divergence"
MEASURED_DIR = REPO_ROOT / "results" / MEASURED
# Bump when ``measure`` changes what a row means: stored cells of another version rerun.
MEASURE_VERSION = 2
MAIN_MODES = MODES[:2]  # default, batch-invariant; the rest are ablations
SCALE: dict[str, dict[str, Any]] = {
    "tiny": dict(dtypes=["fp32"], ablation_dtypes=[], chunks=[WHOLE], seeds=1, min_len=17, max_len=20,
                 min_shared=16),
    "default": dict(dtypes=["fp32", "fp16", "bf16"], ablation_dtypes=["fp32", "fp16"], chunks=[8, 16, WHOLE],
                    seeds=8, min_len=20, max_len=40, min_shared=16),
    "full": dict(dtypes=["fp32", "fp16", "bf16"], ablation_dtypes=["fp32", "fp16", "bf16"],
                 chunks=[4, 8, 32, WHOLE], seeds=20, min_len=20, max_len=64, min_shared=16),
}


def configs(scale: str) -> list[dict[str, Any]]:
    """Every (dtype, mode, seed) cell of ``scale``."""
    s = SCALE[check_scale(scale)]
    cells = [(dtype, mode) for dtype in s["dtypes"] for mode in MAIN_MODES]
    cells += [(dtype, mode) for dtype in s["ablation_dtypes"] for mode in MODES[2:]]
    return [dict(study=STUDY, dtype=dtype, mode=mode, seed=seed, chunks=s["chunks"], min_len=s["min_len"],
                 max_len=s["max_len"], min_shared=s["min_shared"], caches=[list(c) for c in CACHES],
                 model=repr(TINY_MODEL), version=MEASURE_VERSION)
            for dtype, mode in cells for seed in range(s["seeds"])]


def cell_folder(config: dict[str, Any], out_root: Path) -> Path:
    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    name = f"{config['dtype']}-{config['mode']}-s{config['seed']}-{digest}"
    return out_root / STUDY / name


def run_cell(config: dict[str, Any], out_root: Path, force: bool = False) -> pd.DataFrame:
    """Measure (or read back) one cell's runs. One torch thread, whatever ``--jobs``: the
    results must not depend on how the GEMMs were split across threads."""
    folder = cell_folder(config, out_root)
    stored = folder / "config.json"
    if not force and stored.exists() and json.loads(stored.read_text()) == config:
        try:
            return read_table(folder / "runs")
        except FileNotFoundError:
            pass  # interrupted between the two writes: measure again
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = measure(config["seed"], config["dtype"], config["mode"], config["chunks"],
                       config["min_len"], config["max_len"], config["min_shared"])
    finally:
        torch.set_num_threads(threads)
    df = pd.DataFrame(rows)
    folder.mkdir(parents=True, exist_ok=True)
    write_table(df, folder / "runs")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return df


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    """The study at ``scale``. The default scale's cells are a committed measurement
    (``results/divergence_measured``, ``make divergence``): logits in float16 differ with the
    CPU's math paths, so another machine would rewrite the paper's numbers. Reproduce reads
    that measurement and computes nothing here unless it is absent."""
    if scale == "default" and measured_summary() is not None:
        print(f"{STUDY}: the committed measurement {MEASURED_DIR} (make divergence rewrites it)")
        return MEASURED_DIR
    df = _cells(configs(scale), out, force, jobs)
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "caches": CACHES, "model": repr(TINY_MODEL)})
    return out / STUDY


def _cells(cfgs: list[dict[str, Any]], out: Path, force: bool, jobs: int) -> pd.DataFrame:
    from joblib import Parallel, delayed

    if jobs <= 1:
        frames = [run_cell(c, out, force) for c in cfgs]
    else:
        frames = Parallel(n_jobs=jobs)(delayed(run_cell)(c, out, force) for c in cfgs)
    return pd.concat(frames, ignore_index=True)


def measured_summary() -> pd.DataFrame | None:
    """The committed default-scale cells, or None where they are absent."""
    try:
        return read_table(MEASURED_DIR / "summary")
    except FileNotFoundError:
        return None


def record_measurement(out: Path = REPO_ROOT / "results", jobs: int = 2) -> Path:
    """``make divergence``: measure the default scale afresh on this machine and commit the
    result (``results/divergence_measured/summary.csv`` and ``meta.json``, with the machine)."""
    import platform
    import time

    t0 = time.perf_counter()
    df = _cells(configs("default"), out, True, jobs)
    folder = out / MEASURED
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "summary.csv", index=False)
    meta = {"scale": "default", **SCALE["default"], "caches": CACHES, "model": repr(TINY_MODEL),
            "machine": f"{platform.machine()}, {platform.processor() or '?'}, torch {torch.__version__}",
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.perf_counter() - t0, 1)}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(f"{STUDY}: {len(df)} rows -> {folder / 'summary.csv'}")
    return folder


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
