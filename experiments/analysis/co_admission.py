"""Why a tight cache can beat an ample one on radix: requests admitted in the same step cannot
hit each other (radix publishes KV at the end of prefill), and a tight pool admits fewer per
step. Replays the scheduling study's stored radix-LPM cells at their own token budget and at a
smaller one, and prints the mean hit rate per (workload, capacity, budget). Reads
``results/scheduling/*/config.json`` (run ``make reproduce`` first); writes nothing.

    python -m prefixcache.experiments.analysis.co_admission [--budget 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from prefixcache.experiments.figures.common import build_cache, make_requests

from prefixcache import Engine, make_scheduler

WORKLOADS = ("shared-doc-qa", "prefix-repetition", "few-shot")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--budget", type=int, default=256, help="the smaller token budget per step")
    a = ap.parse_args(argv)
    rates: dict[tuple[str, str, int], list[float]] = {}
    for source in WORKLOADS:
        for path in sorted((a.results / "scheduling").glob(f"{source}-radix-*-lpm-*/config.json")):
            config = json.loads(path.read_text())
            for budget in (config["token_budget"], a.budget):
                engine = Engine(build_cache(config), make_scheduler("lpm"), budget)
                records = engine.run(make_requests(config))
                rate = sum(r.hit_tokens for r in records) / sum(r.prompt_tokens for r in records)
                rates.setdefault((source, config["capacity_name"], budget), []).append(rate)
    if not rates:
        folder = a.results / "scheduling"
        raise SystemExit(f"no radix LPM scheduling cells under {folder}: run make reproduce")
    for (source, capacity, budget), values in sorted(rates.items()):
        print(f"{source:18s} {capacity:6s} budget {budget:5d}: hit rate {statistics.mean(values):.3f} "
              f"over {len(values)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
