"""Study: hit rate against block/page size, hashchain vs radix, set against (B-1)/2.

A block cache reuses only whole blocks, so at a divergence inside block k it loses the tokens
of block k before the divergence: up to B-1, (B-1)/2 on average *if the divergence point is
uniform modulo B*. Built-in workloads use round lengths (512, 64, ...) that put every
divergence on a block boundary, which would hide the loss; each seed therefore draws the
workload's segment lengths at random within +-25% of the defaults.

Requests are replayed one at a time (``common.replay``, planned outputs included), so the
only thing that changes with B is the index granularity; batching effects are in the
scheduling study. Writes ``results/granularity/summary`` (one row per cell).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from prefixcache.experiments.figures.common import (
    cell_config,
    check_scale,
    run_cells,
    save_study,
    study_main,
)

STUDY = "granularity"
# Segment-length fields of each workload, jittered per seed (the other fields stay default).
LENGTH_FIELDS: dict[str, dict[str, int]] = {
    "generated-shared-prefix": {"system_prompt_len": 512, "question_len": 64},
    "few-shot": {"instruction_len": 32, "exemplar_len": 64, "query_len": 32},
    "multi-turn-chat": {"system_len": 128, "question_len": 64, "answer_len": 64},
    "shared-doc-qa": {"system_len": 64, "doc_len": 1024, "question_len": 32},
    "prefix-repetition": {"prefix_len": 256, "suffix_len": 256},
    "react-agent": {"system_len": 512, "task_len": 64, "action_len": 32, "observation_len": 128},
    "tree-of-thought": {"root_len": 256, "thought_len": 48},
}
SCALE = {
    "tiny": dict(workloads=["generated-shared-prefix", "multi-turn-chat"], seeds=1, pages=[1, 16, 64]),
    "default": dict(workloads=list(LENGTH_FIELDS), seeds=3, pages=[1, 2, 4, 8, 16, 32, 64]),
    "full": dict(workloads=list(LENGTH_FIELDS), seeds=10, pages=[1, 2, 4, 8, 16, 32, 64]),
}
BACKENDS = ["hashchain", "radix"]
# Large enough that nothing is evicted (the figure checks evicted_tokens == 0): granularity
# alone, not capacity. Not larger: vLLM-style pools build one block object per page up front.
CAPACITY_TOKENS = 1 << 18


def jittered(workload: str, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 + seed)
    fields = LENGTH_FIELDS[workload]
    return {k: int(rng.integers(int(v * 0.75), int(v * 1.25) + 1)) for k, v in fields.items()}


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    out = []
    for wl in s["workloads"]:
        for seed in range(s["seeds"]):
            for page in s["pages"]:
                for backend in BACKENDS:
                    out.append(cell_config(STUDY, source=wl, backend=backend, page_size=page,
                                           capacity_tokens=CAPACITY_TOKENS, mode="replay",
                                           params=jittered(wl, seed), seed=seed))
    return out


# The real traces at their own block structure: prompts share whole 512-token blocks, so a hit
# that a B=16 cache loses part of can only come from the n-1 cap or a shared partial block.
TRACE_LIMIT = {"tiny": 50, "default": 400, "full": None}
TRACE_PAGE = 16


def trace_offsets(scale: str, out: Path, force: bool) -> list[dict[str, Any]]:
    """Per Mooncake trace (a prefix of it): the token-level infinite-cache hit of each request
    and what a B=16 cache loses of it (its hit mod 16), both unbounded. Cached as JSON."""
    from prefixcache.experiments.analysis import bounds
    from prefixcache.experiments.figures.common import MOONCAKE_TRACES
    from prefixcache.experiments.inputs.traces import mooncake_prompt, read_mooncake

    limit = TRACE_LIMIT[check_scale(scale)]
    path = out / STUDY / f"traces-{limit or 'all'}.json"
    if path.exists() and not force:
        return list(json.loads(path.read_text()))
    rows = []
    for source, file in MOONCAKE_TRACES.items():
        prompts = [mooncake_prompt(r) for r in read_mooncake(file)[:limit]]
        token = bounds.infinite_cache_hits(bounds.block_trace(prompts, 1))
        paged = bounds.infinite_cache_hits(bounds.block_trace(prompts, TRACE_PAGE))
        lost = [t - p for t, p in zip(token, paged, strict=True) if t > 0]
        offsets = [t % TRACE_PAGE for t in token if t > 0]
        if lost != offsets:
            raise RuntimeError(f"{source}: a B={TRACE_PAGE} cache lost other than hit mod B")
        rows.append(dict(source=source, requests=len(prompts), page_size=TRACE_PAGE, offsets=offsets))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    return rows


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    df = run_cells(configs(scale), out, force=force, jobs=jobs)
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "capacity_tokens": CAPACITY_TOKENS})
    rows = trace_offsets(scale, out, force)
    (out / STUDY / "traces.json").write_text(json.dumps(rows))
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
