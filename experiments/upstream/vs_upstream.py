"""Our backends against vLLM's and SGLang's own code, request by request.

    .venv-upstream/bin/python experiments/upstream/vs_upstream.py            # compare and time
    .venv-upstream/bin/python experiments/upstream/vs_upstream.py --record tests/fixtures/upstream

Every scenario of ``experiments/upstream/scenarios.py`` is replayed through vLLM 0.33.0's
KVCacheManager (hashchain) and/or SGLang 0.5.23's RadixCache + allocator (radix), and through
ours via ``make_cache``. Per request it prints whether the hit and the physical page/slot ids
agree, and per backend the time ratio ours / upstream (cache calls only, the best of 5 runs
of each side, run alternately, each with the cyclic collector off and torch on one thread).
The records compared come from one more run of each side; the timed runs record no page ids
(at page size 1 those lists are millions of ints, which slowed the calls after them).
Building a request is no cache call and is not timed, except against vLLM, whose request
constructor hashes the prompt's blocks: there both sides' constructions count.
SGLang runs in both allocator modes: ``default`` (need_sort=False, what a plain SGLang server
uses) and ``needsort`` (need_sort=True, PD disaggregation); ours gets the same ``need_sort``.
Each SGLang scenario also runs through 0.5.23's UnifiedRadixCache with the FULL component (what
its registry builds for a plain model), and the summary counts where it records what RadixCache
does. ``--record`` writes the upstream results as JSON fixtures that tests/test_upstream_fixtures.py
replays without vLLM or SGLang. Build the environment with experiments/upstream/setup_venv.sh;
without it this prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from prefixcache.experiments.bench.ops import collector_off, write_rows_csv
from prefixcache.experiments.upstream.ours import compare, replay_ours
from prefixcache.experiments.upstream.scenarios import Scenario, all_scenarios

from prefixcache import available_backends

BACKEND = {"vllm": "hashchain", "sglang": "radix"}
REPEAT = 5  # runs of each side, alternating; the best time of each is kept
OUT = Path(__file__).resolve().parents[2] / "results" / "bench" / "upstream.csv"
VERSION = {"vllm": "vllm 0.33.0 vllm/v1/core", "sglang": "sglang 0.5.23 mem_cache/radix_cache.py"}
NOTES = {
    "vllm": "KVCacheManager, one full-attention group, sha256 block hashes, driven as its scheduler does",
    "sglang": "RadixCache lru + token_to_kv_pool allocator (need_sort as in options: False is SGLang's "
    "default, True its PD-disaggregation mode), batches of one request, counter clock",
}
# (mode name, options for both the upstream driver and make_cache); "" = the only mode
MODES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "vllm": [("", {})],
    "sglang": [("default", {"need_sort": False}), ("needsort", {"need_sort": True})],
}


def without_gc(replay: Callable[[], tuple[Any, float]]) -> tuple[Any, float]:
    """``replay()`` with the cyclic collector run first and off while it runs, as ``timeit``
    times: otherwise its pauses, which grow with whatever else the process holds (a trace
    scenario's millions of ints), land on whichever side allocates more."""
    with collector_off():
        return replay()


def trace_label(sc: Scenario) -> str:
    """A trace scenario's suffix in the totals: " (trace)" at page size 16, the paper's
    headline, and the page size named otherwise (" (trace p1)")."""
    return " (trace)" if sc.page_size == 16 else f" (trace p{sc.page_size})"


def fixture_name(system: str, mode: str, scenario: str) -> str:
    return f"{system}_{mode}_{scenario}.json" if mode else f"{system}_{scenario}.json"


Records = list[dict[str, Any]]


def per_request(ops: Records, ours: Records, up: Records) -> dict[str, tuple[bool, bool]]:
    """rid -> (hit agrees, page ids agree)."""
    out: dict[str, list[bool]] = defaultdict(lambda: [True, True])
    for op, a, b in zip(ops, ours, up, strict=True):
        rid = op.get("rid")
        if rid is None:
            continue
        if "hit" in b and a.get("hit") != b["hit"]:
            out[rid][0] = False
        if "pages" in b and a.get("pages") != b["pages"]:
            out[rid][1] = False
        if "ok" in b and a.get("ok") != b["ok"]:
            out[rid][0] = out[rid][1] = False
        out[rid]  # noqa: B018 - make every request appear
    return {k: (v[0], v[1]) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="DIR", help="write upstream results as JSON fixtures into DIR")
    ap.add_argument("--only", help="substring of scenario names to run")
    ap.add_argument("--mode", help="only this SGLang allocator mode (default or needsort)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every difference")
    ap.add_argument("--out", type=Path, default=OUT, help="CSV of the totals (the paper reads it)")
    args = ap.parse_args(argv)

    from prefixcache.experiments.upstream import shim

    missing = shim.unavailable_reason()
    if len(missing) < 2:
        import torch

        # Like for like: ours runs on one core, and torch's intra-op threads oversubscribe a
        # shared machine (SGLang's paged alloc_extend_naive on 200 trace requests: 0.9 s on one
        # thread, 9.8 s on two beside other work).
        torch.set_num_threads(1)
    drivers: dict[str, Any] = {}
    if "vllm" not in missing:
        from prefixcache.experiments.upstream.vllm_driver import replay_vllm
        drivers["vllm"] = replay_vllm
    if "sglang" not in missing:
        from prefixcache.experiments.upstream.sglang_driver import replay_sglang
        drivers["sglang"] = replay_sglang
    for system, why in missing.items():
        print(f"[{system}] not available, skipped: {why}")
    if not drivers:
        print("Neither vLLM nor SGLang can be imported here; nothing to compare "
              "(build .venv-upstream with experiments/upstream/setup_venv.sh).")
        return 0

    registered = set(available_backends())
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # requests, hit ok, ids ok
    times: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # ours, upstream
    record_dir = Path(args.record) if args.record else None
    unified_same = [0, 0]  # SGLang scenario-modes where UnifiedRadixCache(FULL) records as RadixCache
    if record_dir:
        record_dir.mkdir(parents=True, exist_ok=True)

    for sc in all_scenarios():
        if args.only and args.only not in sc.name:
            continue
        scj = sc.to_json()
        first_of: dict[str, str] = {}  # system -> its first mode's fixture, which holds the scenario
        for system, (mode, options) in [(s, m) for s in sc.systems for m in MODES[s]]:
            if system not in drivers or (args.mode and mode and mode != args.mode):
                continue
            up, _ = without_gc(partial(drivers[system], scj, **options))  # recorded, compared
            if system == "sglang":  # 0.5.23's registry builds the unified tree for a plain model
                unified, _ = drivers[system](scj, unified=True, **options)
                unified_same[0] += unified == up
                unified_same[1] += 1
            run_up = partial(without_gc, partial(drivers[system], scj, record=False, **options))
            if record_dir and not sc.large:
                name = fixture_name(system, mode, sc.name)
                fixture = {"system": system, "upstream": VERSION[system], "backend": BACKEND[system],
                           "notes": NOTES[system]}
                if options:
                    fixture["options"] = options
                if system not in first_of:
                    fixture["scenario"] = scj
                    first_of[system] = name
                else:
                    fixture["scenario_in"] = first_of[system]
                fixture["records"] = up
                (record_dir / name).write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
            backend = BACKEND[system]
            label = f"{system}{'/' + mode if mode else ''}"
            key = f"{backend}{' ' + mode if mode else ''}{trace_label(sc) if sc.large else ''}"
            if backend not in registered:
                print(f"{label:15} {sc.name:22} ours: backend {backend!r} not registered yet")
                continue
            # Request construction counts only where the upstream's does cache work (vLLM's
            # hashes the prompt's blocks); SGLang's is the driver's stand-in, untimed.
            replay = partial(replay_ours, backend, scj, time_requests=system == "vllm", **options)
            try:
                ours, _ = without_gc(replay)
            except Exception as exc:  # noqa: BLE001 - report, keep comparing the rest
                print(f"{label:15} {sc.name:22} ours RAISED {type(exc).__name__}: {exc}")
                continue
            run_ours = partial(without_gc, partial(replay, record=False))
            t_up = t_ours = float("inf")
            for _ in range(REPEAT):  # alternating, so a slow spell of the machine hits both
                t_up = min(t_up, run_up()[1])
                t_ours = min(t_ours, run_ours()[1])
            times[key][0] += t_ours
            times[key][1] += t_up
            reqs = per_request(scj["ops"], ours, up)
            n_hit = sum(h for h, _ in reqs.values())
            n_ids = sum(i for _, i in reqs.values())
            t = totals[key]
            t[0] += len(reqs)
            t[1] += n_hit
            t[2] += n_ids
            bad = [rid for rid, (h, i) in reqs.items() if not (h and i)]
            print(f"{label:15} {sc.name:22} requests {len(reqs):3}  hits agree {n_hit:3}"
                  f"  ids agree {n_ids:3}"
                  f"  ours/upstream time {t_ours / t_up:6.2f}"
                  + (f"  DIFFER: {', '.join(bad)}" if bad else ""))
            diffs = compare(ours, up, scj["ops"])
            for d in diffs if args.verbose else diffs[:3]:
                print("       ", d)
            if diffs and not args.verbose and len(diffs) > 3:
                print(f"        ... {len(diffs) - 3} more (-v)")

    print()
    if unified_same[1]:
        print(f"UnifiedRadixCache(FULL) records what RadixCache does on {unified_same[0]} of "
              f"{unified_same[1]} SGLang scenario-modes")
    rows = []
    for backend, (n, h, i) in sorted(totals.items()):
        ours_t, up_t = times[backend]
        print(f"{backend:16} requests {n}: hit lengths agree {h}/{n}, page ids agree {i}/{n}; "
              f"time ours/upstream {ours_t / up_t:.2f} ({ours_t * 1e3:.1f} ms vs {up_t * 1e3:.1f} ms)")
        rows.append({"backend": backend, "requests": n, "hits_agree": h, "ids_agree": i,
                     "ours_s": ours_t, "upstream_s": up_t, "ours_over_upstream": ours_t / up_t})
    if rows and not (args.only or args.mode):  # only a full comparison stands for the paper
        write_rows_csv(args.out, rows)
        print(f"wrote {args.out}")
    if record_dir:
        print(f"fixtures written to {record_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
