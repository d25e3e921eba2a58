"""The ``prefixcache`` command: run, sweep, trace, reproduce.

Every run writes one folder under ``--out`` named from its config (``config.json``,
``requests.parquet`` or ``requests.csv``, ``summary.json``). A folder that already holds a
summary is a finished run: it is skipped, never overwritten (``--force`` runs again into a new
folder with a numbered suffix).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixcache import (
    CacheConfig,
    Engine,
    available_backends,
    available_schedulers,
    make_cache,
    make_scheduler,
)

DEFAULTS: dict[str, Any] = {
    "workload": "multi-turn-chat",
    "trace": None,
    "limit": None,
    "backend": "hashchain",
    "scheduler": "fcfs",
    "capacity_tokens": 16384,
    "page_size": 16,
    "token_budget": 2048,
    "seed": 0,
    "params": {},
}


INDEX_MEMORY_KEYS = ("index_bytes", "index_bytes_per_cached_token")


def run_name(cfg: dict[str, Any]) -> str:
    source = Path(cfg["trace"]).stem if cfg.get("trace") else cfg["workload"]
    name = (
        f"{source}-{cfg['backend']}-{cfg['scheduler']}-cap{cfg['capacity_tokens']}"
        f"-p{cfg['page_size']}-b{cfg['token_budget']}-s{cfg['seed']}"
    )
    extra = {k: cfg[k] for k in ("params", "limit") if cfg.get(k)}
    if extra:
        name += "-" + hashlib.sha1(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:8]
    return name


def full_config(overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; valid: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **overrides}
    # Fail early, listing the valid names, before any work starts.
    if cfg["backend"] not in available_backends():
        raise ValueError(f"unknown backend {cfg['backend']!r}; valid: {', '.join(available_backends())}")
    make_scheduler(cfg["scheduler"])
    if not cfg["trace"]:
        from prefixcache.experiments.inputs.workloads import make_workload

        make_workload(cfg["workload"], **cfg["params"])
    return cfg


def build_requests(cfg: dict[str, Any]) -> Any:
    if cfg["trace"]:
        from prefixcache.experiments.inputs.traces import iter_requests, read_trace

        records = read_trace(cfg["trace"])
        n = len(records) if cfg["limit"] is None else min(len(records), cfg["limit"])
        return iter_requests(records, limit=cfg["limit"], seed=cfg["seed"]), n
    from prefixcache.experiments.inputs.workloads import make_workload

    reqs = make_workload(cfg["workload"], seed=cfg["seed"], **cfg["params"]).generate()
    return reqs, len(reqs)


def execute(
    cfg: dict[str, Any],
    out_root: Path,
    *,
    force: bool = False,
    progress: bool = True,
    index_memory_bytes: bool = False,
) -> dict[str, Any]:
    """Run one config into its folder (or return the finished run's summary).

    index_memory_bytes: also measure the cache's bookkeeping deeply (pympler walks every
    object: minutes for a multi-million-token pool, so only on request)."""
    from prefixcache.experiments.analysis.metrics import (
        granularity_loss,
        index_memory,
        records_frame,
        summarize,
    )

    folder = out_root / run_name(cfg)
    if (folder / "summary.json").exists():
        if not force:
            return dict(json.loads((folder / "summary.json").read_text()), skipped=True)
        folder = next(
            p for i in itertools.count(2) if not (p := folder.with_name(f"{folder.name}-{i}")).exists()
        )
    cache = make_cache(cfg["backend"], CacheConfig(cfg["capacity_tokens"], cfg["page_size"]))
    engine = Engine(cache, cfg["scheduler"], cfg["token_budget"], seed=cfg["seed"])
    requests, total = build_requests(cfg)
    t0 = time.perf_counter()
    records = engine.run(requests, progress=progress, total=total)
    wall = time.perf_counter() - t0
    summary = summarize(records, page_size=cfg["page_size"], peak_pages_in_use=engine.peak_pages_in_use)
    summary.update(
        config=run_name(cfg),
        wall_s=wall,
        prompt_tokens_per_s=summary["prompt_tokens"] / wall if wall else None,
        steps=engine.step_count,
        simulated_s=engine.clock,
        cache_hit_rate=cache.stats.hit_rate,
    )
    summary.update(index_memory(cache) if index_memory_bytes else dict.fromkeys(INDEX_MEMORY_KEYS))
    if (
        isinstance(requests, list) and summary["prompt_tokens"] <= 200_000
    ):  # token-level trie: small runs only
        summary["granularity_loss_tokens"] = granularity_loss(
            [r.prompt_token_ids for r in requests], cfg["page_size"]
        )[0]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    df = records_frame(records, engine.cost_model)
    try:
        df.to_parquet(folder / "requests.parquet", index=False)
    except ImportError:  # no pyarrow: CSV is the documented fallback
        df.to_csv(folder / "requests.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


# ------------------------------------------------------------------------------ commands
def cmd_run(args: argparse.Namespace) -> int:
    cfg = full_config(
        {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None and k != "params"}
        | {"params": _parse_params(args.param)}
    )
    s = execute(cfg, Path(args.out), force=args.force, index_memory_bytes=args.index_memory)
    state = "skipped (finished earlier)" if s.get("skipped") else f"{s['wall_s']:.2f}s"
    print(
        f"{run_name(cfg)}: token hit rate {s['token_hit_rate']:.1%}, request hit rate "
        f"{s['request_hit_rate']:.1%}, prefill computed {s['prefill_tokens_computed']}, "
        f"preemptions {s['preemptions']} [{state}]"
    )
    return 0


def sweep_configs(path: Path) -> list[dict[str, Any]]:
    """``[grid]`` lists are crossed; ``[fixed]`` values and ``[params]`` apply to every cell."""
    spec = tomllib.loads(path.read_text())
    grid = {k: v if isinstance(v, list) else [v] for k, v in spec.get("grid", {}).items()}
    fixed = dict(spec.get("fixed", {}))
    fixed["params"] = dict(spec.get("params", {}))
    keys = list(grid)
    return [
        full_config(fixed | dict(zip(keys, combo, strict=True)))
        for combo in itertools.product(*grid.values())
    ]


def cmd_sweep(args: argparse.Namespace) -> int:
    out = Path(args.out)
    cells = sweep_configs(Path(args.grid))
    todo = [c for c in cells if not (out / run_name(c) / "summary.json").exists()]
    print(f"sweep: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run")
    if args.executor == "ray":
        try:
            import ray
        except ImportError:
            raise ValueError(
                "--executor ray needs ray (pip install 'prefixcache[ray]'); use joblib"
            ) from None
        task = ray.remote(execute)
        results = ray.get([task.remote(c, out, progress=False) for c in todo])
    else:
        from joblib import Parallel, delayed
        from tqdm.auto import tqdm

        results = Parallel(n_jobs=args.jobs, return_as="generator")(
            delayed(execute)(c, out, progress=False) for c in todo
        )
        results = list(tqdm(results, total=len(todo), unit="cell", disable=len(todo) < 2))
    for s in results:
        print(f"{s['config']}: token hit rate {s['token_hit_rate']:.1%}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from prefixcache.experiments.inputs.traces import (
        MOONCAKE_BLOCK,
        infinite_cache_block_hit_rate,
        read_trace,
    )

    records = read_trace(args.path)
    blocks = [h for r in records for h in r.hash_ids]
    span = records[-1].timestamp - records[0].timestamp if records else 0.0
    print(f"trace            {args.path}")
    print(f"requests         {len(records)} over {span:.0f} s")
    for what, lengths in (
        ("prompt tokens", [r.input_length for r in records]),
        ("output tokens", [r.output_length for r in records]),
    ):
        print(f"{what:<16} {sum(lengths)} (mean {_mean(lengths):.0f})")
    if not blocks:
        print("sharing          none recorded (no hash ids: lengths and arrivals only)")
        return 0
    seen: set[int] = set()
    sharing = 0
    for r in records:
        sharing += bool(r.hash_ids) and r.hash_ids[0] in seen
        seen.update(r.hash_ids)
    print(f"blocks           {len(blocks)} of {MOONCAKE_BLOCK} tokens, {len(seen)} distinct")
    print(f"sharing          {sharing / len(records):.1%} of requests reuse an earlier first block")
    print(f"infinite-cache block hit rate {infinite_cache_block_hit_rate(records):.1%}")
    print(f"note: {MOONCAKE_BLOCK}-token blocks; the trace cannot tell designs apart below that granularity")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Every study, figure and table of the paper (experiments/figures/reproduce.py)."""
    from prefixcache.experiments.figures import reproduce

    argv = ["--scale", args.scale, "--out", args.out, "--paper", args.paper]
    return reproduce.main(argv + ["--force"] * args.force + ["--no-pdf"] * args.no_pdf)


# ------------------------------------------------------------------------------ plumbing
def _parse_params(items: Sequence[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param expects key=value, got {item!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefixcache", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one workload (or trace) x backend x config")
    r.add_argument("--workload", help="built-in workload name")
    r.add_argument("--trace", help="trace file (Mooncake .jsonl or Azure .csv) instead of a workload")
    r.add_argument("--limit", type=int, help="first N trace requests")
    r.add_argument("--backend")
    r.add_argument("--scheduler", help=f"one of {', '.join(available_schedulers())}")
    r.add_argument("--capacity-tokens", dest="capacity_tokens", type=int)
    r.add_argument("--page-size", dest="page_size", type=int)
    r.add_argument("--token-budget", dest="token_budget", type=int)
    r.add_argument("--seed", type=int)
    r.add_argument("--param", action="append", help="workload parameter key=value (repeatable)")
    r.add_argument("--out", default="results")
    r.add_argument("--force", action="store_true", help="run again into a new folder")
    r.add_argument(
        "--index-memory", action="store_true", help="measure the index's bytes deeply (slow on big pools)"
    )
    s = sub.add_parser("sweep", help="a grid of runs from a TOML file (resumable)")
    s.add_argument("grid")
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--executor", choices=["joblib", "ray"], default="joblib")
    s.add_argument("--out", default="results")
    t = sub.add_parser("trace", help="inspect a trace")
    t.add_argument("path")
    rp = sub.add_parser("reproduce", help="run every study and make every figure and table of the paper")
    rp.add_argument("--scale", choices=["tiny", "default", "full"], default="default")
    rp.add_argument("--force", action="store_true", help="re-run results already stored")
    rp.add_argument("--out", default="results")
    rp.add_argument("--paper", default="paper", help="paper folder (figures/, generated/, main.tex)")
    rp.add_argument("--no-pdf", action="store_true", help="skip the LaTeX build")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"run": cmd_run, "sweep": cmd_sweep, "trace": cmd_trace, "reproduce": cmd_reproduce}
    try:
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"prefixcache {args.command}: error: {e}", file=sys.stderr)
        return 2
