"""Study: hit rate against cache capacity, on two Mooncake traces and two synthetic workloads.

Caches: hashchain-LRU (vLLM), radix-LRU, radix-LFU and radix-SLRU (SGLang policies), all at
page size 16 so only the index and the eviction policy differ. Ceilings from
``experiments/analysis/bounds.py``: the infinite cache, the offline optimum (Belady) and the block-LRU
model (Mattson stack distances) at each capacity.

Mooncake traces hash 512-token blocks: a prompt is rebuilt from its block ids, so two prompts
share either whole 512-token blocks or nothing, and the trace cannot tell designs apart below
512 tokens. The trace bounds are therefore computed over 512-token blocks (identical to 16 up to
partial last blocks, and 30x cheaper for Belady). At default scale a prefix of each trace is
replayed; the whole traces are study_whole_traces.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis import bounds
from prefixcache.experiments.figures.common import (
    MOONCAKE_TRACES,
    cell_config,
    cell_name,
    check_scale,
    make_requests,
    run_cells,
    save_study,
    study_main,
)
from prefixcache.experiments.inputs.traces import mooncake_prompt, read_mooncake

STUDY = "capacity"
PAGE = 16
TRACE_BOUND_PAGE = 512
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("hashchain-lru", "hashchain", {}),
    ("radix-lru", "radix", {"eviction_policy": "lru"}),
    ("radix-lfu", "radix", {"eviction_policy": "lfu"}),
    ("radix-slru", "radix", {"eviction_policy": "slru"}),
]
# Synthetic sources: shared-document QA with many Zipf-popular documents, and many chats.
SYNTHETIC = {
    "shared-doc-qa": dict(num_docs=64, doc_len=1024, num_requests=300, zipf_s=0.8),
    "multi-turn-chat": dict(conversations=48, turns=6, system_len=256),
}
SCALE = {
    "tiny": dict(limit=25, synthetic_scale=0.2, capacities=[1 << 17, 1 << 20]),
    "default": dict(limit=400, synthetic_scale=1.0, capacities=[1 << k for k in range(17, 24)]),
    "full": dict(limit=None, synthetic_scale=1.0, capacities=[1 << k for k in range(17, 27)]),
}


def sources(scale: str) -> dict[str, dict[str, Any]]:
    """source -> (workload params, request limit)."""
    s = SCALE[check_scale(scale)]
    out = {name: {"params": {}, "limit": s["limit"]} for name in MOONCAKE_TRACES}
    for name, params in SYNTHETIC.items():
        p = dict(params)
        for key in ("num_requests", "conversations"):
            if key in p:
                p[key] = max(4, int(p[key] * s["synthetic_scale"]))
        out[name] = {"params": p, "limit": None}
    return out


def synthetic_capacities(scale: str) -> list[int]:
    # Synthetic working sets are ~10x smaller than a trace prefix: shift the grid down.
    return [max(c >> 4, 1 << 13) for c in SCALE[scale]["capacities"]]


def configs(scale: str) -> list[dict[str, Any]]:
    out = []
    for source, spec in sources(scale).items():
        caps = SCALE[scale]["capacities"] if source in MOONCAKE_TRACES else synthetic_capacities(scale)
        for cap in caps:
            for label, backend, options in VARIANTS:
                out.append(cell_config(STUDY, source=source, backend=backend, label=label, options=options,
                                       page_size=PAGE, capacity_tokens=cap, mode="replay",
                                       params=spec["params"], limit=spec["limit"]))
    return out


def bound_rows(scale: str, out_root: Path, force: bool) -> list[dict[str, Any]]:
    """Infinite / Belady / LRU-model hit rates per source and capacity (cached as JSON)."""
    rows: list[dict[str, Any]] = []
    for source, spec in sources(scale).items():
        is_trace = source in MOONCAKE_TRACES
        caps = SCALE[scale]["capacities"] if is_trace else synthetic_capacities(scale)
        page = TRACE_BOUND_PAGE if is_trace else PAGE
        key = dict(study=STUDY, source=source, params=spec["params"], limit=spec["limit"], bound_page=page,
                   capacities=caps, kind="bounds")
        path = out_root / STUDY / f"{cell_name(key)}.json"
        if path.exists() and not force:
            rows += json.loads(path.read_text())
            continue
        if is_trace:  # token lists straight from the trace: building Requests costs seconds
            records = read_mooncake(MOONCAKE_TRACES[source])[: spec["limit"]]
            prompts = [mooncake_prompt(r) for r in records]
            left = prompts
        else:
            reqs = make_requests(key | {"seed": 0})
            prompts = [list(r.prompt_token_ids) for r in reqs]
            # What each request leaves cached: its prompt, plus a planned answer (a chat turn).
            left = [p + list(r.planned_output_ids or ())[:-1] for p, r in zip(prompts, reqs, strict=True)]
        trace = bounds.block_trace(prompts, page, left)
        total = sum(len(p) for p in prompts)
        inf = sum(bounds.infinite_cache_hits(trace)) / total
        lru = bounds.lru_hit_curve(trace, [c // page for c in caps])
        new = []
        for cap, lru_hits in zip(caps, lru, strict=True):
            belady = sum(bounds.belady_hits(trace, cap // page)) / total
            for label, value in (("infinite", inf), ("belady", belady), ("lru-model", lru_hits / total)):
                new.append(dict(study=STUDY, source=source, label=label, backend="bound",
                                capacity_tokens=cap, page_size=page, hit_rate=value, prompt_tokens=total,
                                hit_tokens=round(value * total), requests=len(prompts)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(new, indent=1))
        rows += new
    return rows


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    # One process per trace shares its (costly, prompt-only) request list across its cells;
    # synthetic requests get answers appended by a replay, so each of those cells is alone.
    df = run_cells(configs(scale), out, force=force, jobs=jobs,
                   group=lambda c: c["source"] if c["source"] in MOONCAKE_TRACES else cell_name(c))
    df = pd.concat([df, pd.DataFrame(bound_rows(scale, out, force))], ignore_index=True)
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "page_size": PAGE,
                                "synthetic": SYNTHETIC, "trace_bound_page": TRACE_BOUND_PAGE})
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
