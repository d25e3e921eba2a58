"""Study: hybrid models (sliding-window and Mamba layers) in both designs.

The same memory for every cache: ``capacity_tokens`` tokens of KV in every layer of the model
(``CacheConfig.layer_token_budget``), laid out as each upstream lays it out (vLLM 0.33: KV-cache
groups over one block pool, a Mamba model's block raised to hold a state; SGLang 0.5.23: a full
and a sliding-window pool by ``swa_full_tokens_ratio``, or a KV and a state pool by
``mamba_full_memory_ratio``). Per layout and design: the token hit rate, the memory a request
pins at its peak (``PrefixCache.memory_in_use``, layer-token units per prompt token: about 1
for the dense one-layer model, up to the layer count for a hybrid that kept every layer's KV)
and what eviction took.

Designs: hashchain B=16 at vLLM's engine default (``prefix_cache_retention_interval=0``: window
and Mamba groups hash only the tails a hit can resume at), hashchain with dense retention
(None: every full block hashed), radix page 1 and page 16 (SGLang's Mamba cache runs at page 1
only: no page-16 cell for the Mamba layout).

Requests are replayed one at a time with chunked prefill (``common.replay_chunked``, ``CHUNK``
tokens per step as an engine's token budget cuts them, aligned as the cache's
``prefill_chunking`` asks), so that a sliding-window layer can free what leaves its window while
the prompt is still being computed.

Parts:
- built-in workloads x layouts x designs at two capacities, seeds for CIs (every scale);
- the Mamba block floor: the Mamba layers' state size S (hence vLLM's block, raised to hold a
  state) swept from 16 to 528 against radix page 1, on the built-in workloads (every scale).
  vLLM's finer ``--prefix-match-unit`` for Mamba (hits inside a block, copy-on-write) is not
  modelled, so the floor itself is what is swept;
- the whole Mooncake traces at 3M tokens per layer (``--scale full`` only: minutes per cell),
  a committed result (``results/hybrid_traces/``, written by ``make hybrid-traces`` only).

Writes ``results/hybrid/summary`` (one row per cell).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    check_scale,
    run_cells,
    save_study,
    study_main,
)
from prefixcache.experiments.figures.study_whole_traces import machine
from prefixcache.experiments.inputs.workloads import available_workloads

from prefixcache import ModelLayout

STUDY = "hybrid"
TRACES_STUDY = "hybrid_traces"  # the committed result of --scale full
CHUNK = 512
TRACE_CHUNK = 2048
LAYOUTS = ["dense", "gemma3-like", "gpt-oss-like", "mamba-hybrid"]
DENSE_RETENTION = {"prefix_cache_retention_interval": None}
# (label, backend, page size, options)
VARIANTS: list[tuple[str, str, int, dict[str, Any]]] = [
    ("hashchain", "hashchain", 16, {}),
    ("hashchain-dense", "hashchain", 16, DENSE_RETENTION),
    ("radix-p1", "radix", 1, {}),
    ("radix-p16", "radix", 16, {}),
]
# The Mamba block floor: three Mamba layers of state size S per full layer.
STATE_SIZES = [16, 64, 176, 528]
SCALE = {
    "tiny": dict(workloads=["multi-turn-chat", "shared-doc-qa"], seeds=1, capacities=[1 << 13],
                 floor_workloads=["multi-turn-chat"]),
    "default": dict(workloads=available_workloads(), seeds=3, capacities=[1 << 13, 1 << 16],
                    floor_workloads=available_workloads()),
    "full": dict(workloads=available_workloads(), seeds=3, capacities=[1 << 13, 1 << 16],
                 floor_workloads=available_workloads()),
}
TRACE_CAPACITY = 3_000_000
TRACE_LAYOUTS = ["gemma3-like", "gpt-oss-like", "mamba-hybrid"]
TRACE_VARIANTS = ["hashchain", "radix-p16"]  # radix-p1 for the Mamba layout (its only page)


def supported(layout: Any, backend: str, page: int) -> bool:
    """SGLang 0.5.23's Mamba cache runs in no_buffer mode, page 1 only (ours too)."""
    has_mamba = ModelLayout.parse(layout).count("mamba") > 0
    return not (has_mamba and backend == "radix" and page != 1)


def floor_layout(state_tokens: int) -> list[list[Any]]:
    return [["mamba", state_tokens]] * 3 + [["full"]]


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    out = []
    for wl in s["workloads"]:
        for seed in range(s["seeds"]):
            for capacity in s["capacities"]:
                for layout in LAYOUTS:
                    for label, backend, page, options in VARIANTS:
                        if supported(layout, backend, page):
                            out.append(cell_config(STUDY, source=wl, backend=backend, page_size=page,
                                                   capacity_tokens=capacity, mode="chunked-replay",
                                                   options=options, label=label, seed=seed, layout=layout,
                                                   chunk=CHUNK))
    for wl in s["floor_workloads"]:
        for seed in range(s["seeds"]):
            for state in STATE_SIZES:
                for label, backend, page, options in VARIANTS:
                    if label in ("hashchain", "radix-p1"):
                        c = cell_config(STUDY, source=wl, backend=backend, page_size=page,
                                        capacity_tokens=1 << 16, mode="chunked-replay", options=options,
                                        label=label, seed=seed, layout=floor_layout(state), chunk=CHUNK)
                        c["part"] = "floor"
                        c["state_tokens"] = state
                        out.append(c)
    return out


def trace_configs() -> list[dict[str, Any]]:
    out = []
    variants = {v[0]: v for v in VARIANTS}
    for source in MOONCAKE_TRACES:
        for layout in TRACE_LAYOUTS:
            for name in TRACE_VARIANTS:
                label, backend, page, options = variants[name]
                if not supported(layout, backend, page):
                    label, backend, page, options = variants["radix-p1"]
                out.append(cell_config(TRACES_STUDY, source=source, backend=backend, page_size=page,
                                       capacity_tokens=TRACE_CAPACITY, mode="chunked-replay", options=options,
                                       label=label, layout=layout, chunk=TRACE_CHUNK))
    return out


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    df = run_cells(configs(scale), out, force=force, jobs=jobs)
    save_study(df, out, STUDY, {"scale": scale, "chunk": CHUNK, "layouts": LAYOUTS,
                                "variants": [v[0] for v in VARIANTS], "state_sizes": STATE_SIZES})
    if scale == "full":
        run_traces(out, force, jobs)
    return out / STUDY


def run_traces(out: Path, force: bool, jobs: int) -> Path:
    """The whole traces (one process per trace shares its requests): the committed table."""
    t0 = time.perf_counter()
    cells = run_cells(trace_configs(), out / "hybrid_trace_cells", force=force, jobs=jobs,
                      group=lambda c: (c["source"], c["layout"]))
    folder = out / TRACES_STUDY
    folder.mkdir(parents=True, exist_ok=True)
    keep = ["source", "layout", "label", "backend", "page_size", "capacity_tokens", "requests", "rejected",
            "hit_rate", "prompt_tokens", "hit_tokens", "evicted_tokens", "peak_units_mean",
            "peak_units_per_prompt_token", "layer_token_budget", "wall_s"]
    cells[keep].to_csv(folder / "summary.csv", index=False)
    command = "make hybrid-traces" if sys.argv[:1] == ["-c"] else " ".join(sys.argv)
    meta = dict(command=command, date=time.strftime("%Y-%m-%d"), machine=machine(), chunk=TRACE_CHUNK,
                jobs=jobs, wall_s=round(time.perf_counter() - t0, 1))
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{TRACES_STUDY}: {len(cells)} cells -> {folder / 'summary.csv'}")
    return folder


def load_traces(results: Path) -> pd.DataFrame | None:
    path = results / TRACES_STUDY / "summary.csv"
    return pd.read_csv(path) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
