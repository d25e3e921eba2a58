"""Study: waiting-queue order against the optimal hit rate (SGLang's Fig. 13 analogue).

Schedulers: FCFS (vLLM's default), LPM (SGLang's longest-prefix-match with in-batch dedup),
DFS-weight (SGLang's), and ``dfs-offline``: FCFS over the requests pre-sorted in DFS order of
their token trie, i.e. the order SGLang's Theorem 3.1 proves optimal when run one at a time.
The optimum itself is computed, not run: the infinite-cache hit rate of the DFS order over
whole pages (``bounds.infinite_cache_hits``); with a cache at least as large as the longest
request, DFS order run sequentially reaches it.

Independent requests all arrive at time 0 so that the queue has something to order; dependent
ones (chat turns, thoughts, agent steps) arrive in waves behind their parents. Each workload runs
at two capacities: ``ample`` (twice its unique tokens) and ``tight`` (a quarter of them, never
below twice its longest request). Both backends at their native page size: radix 1, hashchain 16.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis import bounds
from prefixcache.experiments.figures.common import (
    cell_config,
    cell_name,
    check_scale,
    make_requests,
    run_cells,
    save_study,
    study_main,
)

from prefixcache.scheduler import dfs_weight_order

STUDY = "scheduling"
SCHEDULERS = ["fcfs", "lpm", "dfs-weight", "dfs-offline"]
BACKENDS = [("radix", 1), ("hashchain", 16)]
# Analogues of SGLang's benchmarks, shuffled so that arrival order is not already DFS order.
# Short outputs: the order of prefills is what is studied, and decode steps only cost time.
WORKLOADS: dict[str, dict[str, Any]] = {
    "generated-shared-prefix": dict(num_groups=8, prompts_per_group=12, shuffle=True, output_len=4),
    "few-shot": dict(tasks=6, requests_per_task=16, output_len=4),
    "shared-doc-qa": dict(num_docs=12, num_requests=96, output_len=4),
    "rag": dict(num_docs=24, num_requests=96, output_len=4),
    "prefix-repetition": dict(num_requests=96, num_prefixes=12, output_len=4),
    # Dependent requests (where SGLang's Fig. 13 sits furthest below optimal): a turn, a thought
    # or an agent step arrives think_time_s after its parent, so each wave waits together.
    "multi-turn-chat": dict(conversations=16, turns=4, answer_len=16),
    "tree-of-thought": dict(trees=4, branching=3, depth=2, thought_len=32),
    "react-agent": dict(agents=8, steps=4, action_len=16),
}
CAPACITY = {"ample": 2.0, "tight": 0.25}
SCALE = {
    "tiny": dict(workloads=["generated-shared-prefix", "multi-turn-chat"], seeds=2, shrink=4),
    "default": dict(workloads=list(WORKLOADS), seeds=5, shrink=1),
    "full": dict(workloads=list(WORKLOADS), seeds=10, shrink=1),
}


def params_of(workload: str, shrink: int) -> dict[str, Any]:
    p = dict(WORKLOADS[workload])
    for key in ("prompts_per_group", "requests_per_task", "num_requests", "conversations", "agents"):
        if key in p:
            p[key] = max(4, p[key] // shrink)
    return p


def sizes(workload: str, params: dict[str, Any], seed: int) -> tuple[int, int]:
    """(unique prompt tokens, longest request in tokens) of the workload."""
    reqs = make_requests(dict(source=workload, params=params, seed=seed, limit=None))
    trace = bounds.block_trace([r.prompt_token_ids for r in reqs], 1)
    unique = len({k for keys in trace.inserts for k in keys})
    return unique, max(r.num_prompt_tokens + r.max_new_tokens for r in reqs)


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    out = []
    for wl in s["workloads"]:
        params = params_of(wl, s["shrink"])
        for seed in range(s["seeds"]):
            unique, longest = sizes(wl, params, seed)
            for cap_name, frac in CAPACITY.items():
                cap = max(int(unique * frac), 2 * longest)
                cap = -(-cap // 64) * 64
                for backend, page in BACKENDS:
                    for sched in SCHEDULERS:
                        c = cell_config(STUDY, source=wl, backend=backend, page_size=page,
                                        capacity_tokens=cap, scheduler=sched, params=params, seed=seed)
                        c["capacity_name"] = cap_name
                        out.append(c)
    return out


def optimum_rows(scale: str, out_root: Path, force: bool) -> list[dict[str, Any]]:
    """The DFS-order infinite-cache hit rate per workload, seed and page size (answers that a
    later request extends count as cached, as the engine caches them)."""
    s = SCALE[scale]
    rows = []
    for wl in s["workloads"]:
        params = params_of(wl, s["shrink"])
        for seed in range(s["seeds"]):
            key = dict(study=STUDY, source=wl, params=params, seed=seed, kind="optimum", limit=None)
            path = out_root / STUDY / f"{cell_name(key)}.json"
            if path.exists() and not force:
                rows += json.loads(path.read_text())
                continue
            reqs = dfs_weight_order(make_requests(key))
            prompts = [list(r.prompt_token_ids) for r in reqs]
            # What each request leaves cached: its prompt and its planned answer but the last
            # token (a chat turn, a thought, an agent step that a child request extends).
            left = [p + list(r.planned_output_ids or ())[:-1] for p, r in zip(prompts, reqs, strict=True)]
            total = sum(len(p) for p in prompts)
            new = []
            for backend, page in BACKENDS:
                hits = sum(bounds.infinite_cache_hits(bounds.block_trace(prompts, page, left)))
                new.append(dict(study=STUDY, source=wl, seed=seed, backend=backend, page_size=page,
                                scheduler="optimal", hit_rate=hits / total, hit_tokens=hits,
                                prompt_tokens=total, requests=len(prompts)))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(new, indent=1))
            rows += new
    return rows


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    df = run_cells(configs(scale), out, force=force, jobs=jobs)
    df = pd.concat([df, pd.DataFrame(optimum_rows(scale, out, force))], ignore_index=True)
    save_study(df, out, STUDY, {"scale": scale, **SCALE[scale], "workloads": WORKLOADS, "capacity": CAPACITY})
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
