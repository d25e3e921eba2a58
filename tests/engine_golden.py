"""The engine's per-request results on fixed runs, recorded from the engine of c2d2b27 (before
the batched step): ``tests/fixtures/engine/golden_c2d2b27.json.gz``; test_engine_golden.py checks that
today's engine gives the same rows, totals and cache state.

Runs: every built-in workload and the first requests of both Mooncake traces, through
hashchain B=16, radix p16 and radix p1, in an ample and a tight pool (the tight ones evict and
preempt). Radix stamps a counter clock, so a run is deterministic on any machine.

Record (only against the commit the fixture names; it must run on that commit's code)::

    python tests/engine_golden.py tests/fixtures/engine/golden_c2d2b27.json.gz
"""

from __future__ import annotations

import gzip
import itertools
import json
import sys
from dataclasses import fields
from typing import Any

from prefixcache.experiments.inputs.traces import iter_requests, read_mooncake, resolve
from prefixcache.experiments.inputs.workloads import available_workloads, make_workload

from prefixcache import CacheConfig, Engine, Request, make_cache
from prefixcache.records import RequestRecord

RECORDED_AT = "c2d2b27"
BACKENDS = (("hashchain", 16), ("radix", 16), ("radix", 1))
WORKLOAD_CAPACITIES = {"ample": 1 << 17, "tight": 12_288}
# (trace, requests, {label: capacity}): tight evicts and preempts, ample holds the slice
TRACES = (
    ("mooncake_conversation_trace.jsonl", 160, {"ample": 1 << 22, "tight": 1 << 17}),
    ("mooncake_synthetic_trace.jsonl", 120, {"ample": 1 << 22, "tight": 1 << 17}),
)
BUDGETS = {"workload": 512, "trace": 2048}


def cells() -> list[tuple[str, str, int, str, int]]:
    """(source, backend, page, capacity label, capacity) of every recorded run."""
    out = []
    for backend, page in BACKENDS:
        for name in available_workloads():
            out += [(name, backend, page, label, cap) for label, cap in WORKLOAD_CAPACITIES.items()]
        for trace, _, caps in TRACES:
            out += [(trace, backend, page, label, cap) for label, cap in caps.items()]
    return out


def _requests(source: str) -> tuple[list[Request], list[list[int]]]:
    """The run's requests and the prompts its probes look up afterwards."""
    for trace, limit, _ in TRACES:
        if source == trace:
            records = read_mooncake(resolve(trace))
            reqs = list(iter_requests(records, limit=limit))
            probes = [list(r.prompt_token_ids) for r in iter_requests(records, limit=limit)][::8]
            return reqs, probes
    reqs = make_workload(source, seed=1).generate()
    return reqs, [list(r.prompt_token_ids) for r in make_workload(source, seed=1).generate()]


def run_cell(source: str, backend: str, page: int, capacity: int) -> dict[str, Any]:
    """One run's rows (every record field but the wall time), totals and cache state."""
    options: dict[str, Any] = {"clock": itertools.count().__next__} if backend == "radix" else {}
    cache = make_cache(backend, CacheConfig(capacity // page, page), **options)
    is_trace = source.endswith(".jsonl")
    engine = Engine(cache, "fcfs", token_budget=BUDGETS["trace" if is_trace else "workload"])
    reqs, prompts = _requests(source)
    records = engine.run(reqs)
    rows = [[getattr(r, f.name) for f in fields(r) if f.name != "cache_op_ns"] for r in records]
    totals = [engine.clock, engine.step_count, engine.prefill_tokens, engine.decode_tokens,
              engine.peak_pages_in_use]
    probes = []
    for i, prompt in enumerate(prompts):
        m: Any = cache.lookup(Request(f"probe{i}", prompt))
        pages = [b.block_id for b in m.blocks[0]] if hasattr(m, "blocks") else m.indices.tolist()
        probes.append([m.tokens, pages[:4], pages[-4:]])
    pool = getattr(cache, "block_pool", None)
    free_order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()][:64] if pool else []
    stats = cache.stats
    return {"rows": rows, "totals": totals, "usage": list(cache.usage()),
            "stats": [stats.requests, stats.queries, stats.hits, stats.preempted_requests,
                      stats.evicted_tokens],
            "probes": probes, "free_order": free_order}


def key(source: str, backend: str, page: int, label: str) -> str:
    return f"{source}/{backend}-p{page}/{label}"


def main(out: str) -> None:
    fields_ = [f.name for f in fields(RequestRecord) if f.name != "cache_op_ns"]
    golden: dict[str, Any] = {"recorded_at": RECORDED_AT, "fields": fields_}
    runs = {}
    for source, backend, page, label, cap in cells():
        runs[key(source, backend, page, label)] = run_cell(source, backend, page, cap)
        print(key(source, backend, page, label), flush=True)
    golden["runs"] = runs
    with gzip.open(out, "wt") as f:
        json.dump(golden, f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1])
