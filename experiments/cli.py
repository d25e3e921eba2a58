"""The ``prefixcache`` command: run, sweep, trace, show, reproduce.

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
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis.bounds import OFFLINE_DFS, offline_schedule

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
    "options": {},  # the backend's own keywords (make_cache), e.g. {"use_eagle": true}
    "host_tier": None,  # HostTierConfig fields (prefixcache.tiers) or None: no host tier
}
# --host-* flags of `run` -> HostTierConfig fields
HOST_FLAGS = (("--host-tokens", "capacity_tokens", int, "host tier size in tokens"),
              ("--host-ratio", "ratio", float, "host tier size as a multiple of the device pool"),
              ("--host-eviction-policy", "eviction_policy", str, "hashchain: lru or arc"),
              ("--host-write-policy", "write_policy", str,
               "radix: write_through, write_through_selective or write_back"),
              ("--host-block-size", "block_size", int, "hashchain: offloaded chunk in tokens"))


INDEX_MEMORY_KEYS = ("index_bytes", "index_bytes_per_cached_token")


def run_name(cfg: dict[str, Any]) -> str:
    source = Path(cfg["trace"]).stem if cfg.get("trace") else cfg["workload"]
    name = (
        f"{source}-{cfg['backend']}-{cfg['scheduler']}-cap{cfg['capacity_tokens']}"
        f"-p{cfg['page_size']}-b{cfg['token_budget']}-s{cfg['seed']}"
    )
    if cfg.get("limit") is not None:
        name += f"-first{cfg['limit']}"
    if cfg.get("params"):
        name += "-" + hashlib.sha1(json.dumps(cfg["params"], sort_keys=True).encode()).hexdigest()[:8]
    if cfg.get("options"):
        name += "-opt" + hashlib.sha1(json.dumps(cfg["options"], sort_keys=True).encode()).hexdigest()[:8]
    if cfg.get("host_tier"):
        name += "-host" + hashlib.sha1(json.dumps(cfg["host_tier"], sort_keys=True).encode()).hexdigest()[:8]
    return name


def scheduler_names() -> list[str]:
    """The online schedulers and the offline DFS order (the scheduling study's optimum)."""
    return [*available_schedulers(), OFFLINE_DFS]


def full_config(overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; valid: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **overrides}
    # Fail early, listing the valid names, before any work starts.
    if cfg["backend"] not in available_backends():
        raise ValueError(f"unknown backend {cfg['backend']!r}; valid: {', '.join(available_backends())}")
    if cfg["scheduler"] != OFFLINE_DFS:
        try:
            make_scheduler(cfg["scheduler"])
        except ValueError:
            valid = ", ".join(scheduler_names())
            raise ValueError(f"unknown scheduler {cfg['scheduler']!r}; valid: {valid}") from None
    if cfg["host_tier"] is not None:
        host_tier_of(cfg)  # bad fields or values: the tier's own ValueError, before any work
    limit = cfg["limit"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"--limit must be an int >= 1 (leave it out for every request), got {limit!r}")
    if cfg["trace"]:
        if cfg["params"]:
            raise ValueError(f"--param sets workload parameters; a trace takes none (got {cfg['params']})")
        cfg["workload"] = None  # the trace is the source: config.json must not name a workload
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        make_workload(cfg["workload"], **cfg["params"])
    return cfg


def host_tier_of(cfg: dict[str, Any]) -> Any:
    """The config's HostTierConfig, or None."""
    from prefixcache.tiers import HostTierConfig

    tier = cfg["host_tier"]
    if tier is None:
        return None
    if not isinstance(tier, dict):
        raise ValueError(f"host_tier must be a table of HostTierConfig fields, got {tier!r}")
    try:
        return HostTierConfig(**tier)
    except TypeError as e:  # an unknown field
        raise ValueError(f"host_tier: {e}") from None


def build_requests(cfg: dict[str, Any], records: Any = None) -> tuple[Any, int]:
    """The requests of a config (a lazy iterator for a trace, over ``records`` if the caller
    read them already) and how many there are."""
    limit = cfg["limit"]
    if cfg["trace"]:
        from prefixcache.experiments.inputs.traces import iter_requests, read_trace

        records = read_trace(cfg["trace"]) if records is None else records
        if not records:
            raise ValueError(f"trace {cfg['trace']} holds no requests")
        n = len(records) if limit is None else min(len(records), limit)
        reqs: Any = iter_requests(records, limit=limit, seed=cfg["seed"])
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        reqs = make_workload(cfg["workload"], seed=cfg["seed"], **cfg["params"]).generate()[:limit]
        n = len(reqs)
    if cfg["scheduler"] == OFFLINE_DFS:  # an offline order needs every request up front
        reqs = list(reqs)
    return reqs, n


def prompt_hash_store(cfg: dict[str, Any], records: Any) -> Any:
    """A hashchain trace run's store of prompt block hashes over the trace's ``records``
    (experiments/inputs/trace_hashes.py), shared by every cell and rerun over the same trace
    and hash settings; None otherwise."""
    if not cfg["trace"] or cfg["backend"] != "hashchain":
        return None
    from prefixcache.experiments.inputs.trace_hashes import TracePromptHashes

    return TracePromptHashes(records)


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
    folder = out_root / run_name(cfg)
    if (folder / "summary.json").exists():
        if not force:
            return dict(json.loads((folder / "summary.json").read_text()), skipped=True)
        folder = next(
            p for i in itertools.count(2) if not (p := folder.with_name(f"{folder.name}-{i}")).exists()
        )
    summary, df = simulate(cfg, progress=progress, index_memory_bytes=index_memory_bytes)
    write_run(folder, cfg, summary, df)
    return summary


def simulate(
    cfg: dict[str, Any], *, progress: bool = False, index_memory_bytes: bool = False
) -> tuple[dict[str, Any], pd.DataFrame]:
    """One config's run, touching no file: (its summary, one row per request). What a sweep's
    workers run (a Ray worker may sit on another machine, so the driver writes the folder)."""
    from prefixcache.experiments.analysis.metrics import (
        granularity_loss,
        index_memory,
        records_frame,
        summarize,
    )

    tier = host_tier_of(cfg)
    options = dict(cfg["options"]) | ({} if tier is None else {"host_tier": tier})
    if cfg["trace"]:  # read once: the requests and the hash store both come from it
        from prefixcache.experiments.inputs.traces import read_trace

        trace_records = read_trace(cfg["trace"])
    else:
        trace_records = None
    known_hashes = prompt_hash_store(cfg, trace_records)
    if known_hashes is not None:  # the same hashes, read instead of computed: not a setting
        options["known_prompt_hashes"] = known_hashes
    try:
        cache = make_cache(cfg["backend"], CacheConfig(cfg["capacity_tokens"], cfg["page_size"]), **options)
    except TypeError as e:  # an option the backend does not take
        raise ValueError(f"{cfg['backend']}: {e}") from None
    requests, total = build_requests(cfg, trace_records)
    requests, scheduler = offline_schedule(requests, cfg["scheduler"])
    engine = Engine(cache, scheduler, cfg["token_budget"], seed=cfg["seed"])
    t0 = time.perf_counter()
    records = engine.run(requests, progress=progress, total=total)
    wall = time.perf_counter() - t0
    if known_hashes is not None:
        known_hashes.save()
    summary = summarize(records, page_size=cfg["page_size"], peak_pages_in_use=engine.peak_pages_in_use)
    if summary["rejected"] == len(records):
        raise ValueError(
            f"{run_name(cfg)}: all {len(records)} requests are larger than the cache "
            f"({cache.config.usable_tokens} usable tokens); raise --capacity-tokens"
        )
    if summary["rejected"]:
        warnings.warn(
            f"{run_name(cfg)}: {summary['rejected']} of {len(records)} requests are larger than the "
            f"cache ({cache.config.usable_tokens} usable tokens) and were dropped; every rate "
            "leaves them out",
            stacklevel=2,
        )
    summary.update(
        config=run_name(cfg),
        wall_s=wall,
        prompt_tokens_per_s=summary["prompt_tokens"] / wall if wall else None,
        steps=engine.step_count,
        simulated_s=engine.clock,
        cache_hit_rate=cache.stats.hit_rate,
    )
    if tier is not None:
        st = cache.stats
        summary.update(host_hit_rate=st.host_hit_rate, loaded_tokens=st.loaded_tokens,
                       stored_tokens=st.stored_tokens, host_evicted_tokens=st.host_evicted_tokens,
                       load_wait_s=engine.load_wait_s, **cache.tier_metrics())
    summary.update(index_memory(cache) if index_memory_bytes else dict.fromkeys(INDEX_MEMORY_KEYS))
    if (
        isinstance(requests, list) and summary["prompt_tokens"] <= 200_000
    ):  # token-level trie: small runs only
        summary["granularity_loss_tokens"] = granularity_loss(
            [r.prompt_token_ids for r in requests], cfg["page_size"]
        )[0]
    return summary, records_frame(records, engine.cost_model)


def write_run(folder: Path, cfg: dict[str, Any], summary: dict[str, Any], df: pd.DataFrame) -> None:
    """A run's folder: config.json, requests.parquet (CSV without pyarrow), summary.json last
    (its presence marks the run finished)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    try:
        df.to_parquet(folder / "requests.parquet", index=False)
    except ImportError:  # no pyarrow: CSV is the documented fallback
        df.to_csv(folder / "requests.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=float))


# ------------------------------------------------------------------------------ commands
def cmd_run(args: argparse.Namespace) -> int:
    given = vars(args)
    tier = {f: given[f"host_{f}"] for _, f, _, _ in HOST_FLAGS if given[f"host_{f}"] is not None}
    nested = ("params", "options", "host_tier")
    plain = {k: v for k, v in given.items() if k in DEFAULTS and v is not None and k not in nested}
    nested_values = {"params": _parse_params(args.param), "options": _parse_params(args.option, "--option"),
                     "host_tier": tier or None}
    cfg = full_config(plain | nested_values)
    s = execute(cfg, Path(args.out), force=args.force, index_memory_bytes=args.index_memory)
    state = "skipped (finished earlier)" if s.get("skipped") else f"{s['wall_s']:.2f}s"
    print(f"{run_name(cfg)}: {summary_line(s)} [{state}]")
    return 0


def summary_line(s: dict[str, Any]) -> str:
    ran = s["requests"] - s["rejected"]
    line = (
        f"token hit rate {s['token_hit_rate']:.1%}, request hit rate {s['request_hit_rate']:.1%} "
        f"of {ran} requests, prefill computed {s['prefill_tokens_computed']}, preemptions {s['preemptions']}"
    )
    if s["rejected"]:
        line += f", {s['rejected']} rejected (larger than the cache, left out of every rate)"
    return line


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
    grid = Path(args.grid)
    cells = sweep_configs(grid)
    todo = [c for c in cells if not (out / run_name(c) / "summary.json").exists()]
    print(f"sweep: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run")
    for s in _run_cells(todo, out, args.executor, args.jobs, args.address):
        print(f"{s['config']}: {summary_line(s)}")
    table = sweep_table(cells, out)
    stem = out / f"{grid.stem}-sweep"
    table.to_csv(stem.with_suffix(".csv"), index=False)
    table.to_parquet(stem.with_suffix(".parquet"), index=False)
    print(f"sweep table: {stem}.csv and .parquet ({len(table)} cells)")
    return 0


def _run_cells(
    todo: list[dict[str, Any]], out: Path, executor: str, jobs: int, address: str | None = None
) -> Iterator[dict[str, Any]]:
    """Each cell's summary as it finishes (its folder written here, by the driver), the
    progress bar advancing per finished cell."""
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), unit="cell", disable=len(todo) < 2) as bar:
        for cfg, summary, df in _simulations(todo, executor, jobs, address):
            write_run(out / run_name(cfg), cfg, summary, df)
            bar.update(1)
            yield summary


def _simulate_cell(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    return (cfg, *simulate(cfg))


def _simulations(
    todo: list[dict[str, Any]], executor: str, jobs: int, address: str | None
) -> Iterator[tuple[dict[str, Any], dict[str, Any], pd.DataFrame]]:
    """(config, summary, requests) per cell, in the order cells finish."""
    if executor == "ray":
        with ray_session(address, num_cpus=jobs) as ray:
            task = ray.remote(_simulate_cell)
            pending = [task.remote(c) for c in todo]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        return
    if address is not None:
        raise ValueError("--address names a Ray cluster: it needs --executor ray")
    from joblib import Parallel, delayed

    parallel = Parallel(n_jobs=jobs, return_as="generator_unordered")
    yield from parallel(delayed(_simulate_cell)(c) for c in todo)


@contextmanager
def ray_session(address: str | None, num_cpus: int) -> Iterator[Any]:
    """Ray for one sweep: the running session if there is one, else ``ray.init(address)`` for
    a cluster (every node needs prefixcache installed) or a local Ray with ``num_cpus``
    workers; a session started here is shut down at the end."""
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs ray (pip install 'prefixcache[ray]'); use joblib") from None
    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        ray.init(address=address, logging_level="WARNING")
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def sweep_table(cells: list[dict[str, Any]], out: Path) -> pd.DataFrame:
    """One tidy row per cell of the grid: its config (workload parameters as ``param_*``) and
    its summary, read back from the cell's folder."""
    from prefixcache.experiments.figures.common import flat_config

    return pd.DataFrame(
        [flat_config(cfg) | json.loads((out / run_name(cfg) / "summary.json").read_text()) for cfg in cells]
    )


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


def cmd_show(args: argparse.Namespace) -> int:
    """Draw both index structures after a small request list (the paper's Fig. 1 by default)."""
    from prefixcache.experiments.figures import structures

    prompts = structures.parse_requests(args.requests) if args.requests else structures.WALKTHROUGH
    if args.page_size < 1:
        raise ValueError(f"--page-size must be >= 1, got {args.page_size}")
    snap = structures.run_requests(prompts, args.page_size)
    path = structures.draw(snap, args.page_size, Path(args.out))
    for i, (h, r) in enumerate(zip(snap.hits["hashchain"], snap.hits["radix"], strict=True)):
        print(f"request {i}: {len(prompts[i])} tokens, hit hashchain {h}, radix {r}")
    print(f"wrote {path}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Every study, figure and table of the paper (experiments/figures/reproduce.py)."""
    from prefixcache.experiments.figures import reproduce

    argv = ["--scale", args.scale, "--out", args.out, "--paper", args.paper]
    return reproduce.main(argv + ["--force"] * args.force + ["--no-pdf"] * args.no_pdf)


# ------------------------------------------------------------------------------ plumbing
def _parse_params(items: Sequence[str] | None, flag: str = "--param") -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} expects key=value, got {item!r}")
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
    from prefixcache.experiments.inputs.workloads import available_workloads

    def one_of(names: Sequence[str], default: object) -> str:
        return f"one of: {', '.join(names)} (default: {default})"

    r = sub.add_parser("run", help="one workload (or trace) x backend x config")
    r.add_argument("--workload", help=one_of(available_workloads(), DEFAULTS["workload"]))
    r.add_argument("--trace", help="trace file (Mooncake .jsonl or Azure .csv) instead of a workload")
    r.add_argument("--limit", type=int, help="only the first N requests, N >= 1 (default: all)")
    r.add_argument("--backend", help=one_of(available_backends(), DEFAULTS["backend"]))
    r.add_argument("--scheduler", help=one_of(scheduler_names(), DEFAULTS["scheduler"]))
    for flag, key, what in (
        ("--capacity-tokens", "capacity_tokens", "KV pool size in tokens"),
        ("--page-size", "page_size", "tokens per page (block)"),
        ("--token-budget", "token_budget", "tokens computed per engine step"),
        ("--seed", "seed", "seed of workload generation and simulated outputs"),
    ):
        r.add_argument(flag, dest=key, type=int, help=f"{what} (default: {DEFAULTS[key]})")
    r.add_argument("--param", action="append", help="workload parameter key=value (repeatable)")
    r.add_argument("--option", action="append",
                   help="backend option key=value (JSON value), e.g. use_eagle=true (repeatable)")
    for flag, field, kind, what in HOST_FLAGS:
        r.add_argument(flag, dest=f"host_{field}", type=kind, help=f"{what} (default: no host tier)")
    r.add_argument("--out", default="results", help="folder of run folders (default: results)")
    r.add_argument("--force", action="store_true", help="run again into a new folder")
    r.add_argument(
        "--index-memory", action="store_true", help="measure the index's bytes deeply (slow on big pools)"
    )
    s = sub.add_parser("sweep", help="a grid of runs from a TOML file (resumable)")
    s.add_argument("grid", help="TOML file: [grid] lists are crossed, [fixed] and [params] apply to all")
    s.add_argument(
        "--jobs", type=int, default=2, help="parallel cells: joblib processes or local Ray CPUs (default: 2)"
    )
    s.add_argument(
        "--executor", choices=["joblib", "ray"], default="joblib", help="where cells run (default: joblib)"
    )
    s.add_argument(
        "--address",
        help="Ray cluster to run on (e.g. ray://head:10001 or auto; with --executor ray; "
        "default: a local Ray with --jobs CPUs)",
    )
    s.add_argument("--out", default="results", help="run folders and the sweep table (default: results)")
    t = sub.add_parser("trace", help="inspect a trace")
    t.add_argument("path")
    sh = sub.add_parser("show", help="draw both index structures after a small request list")
    sh.add_argument("--requests", help='token ids, requests split by ";" (default: the seed walkthrough)')
    sh.add_argument("--page-size", dest="page_size", type=int, default=4,
                    help="hashchain block size (default: 4)")
    sh.add_argument("--out", default="structures.png", help="image file (default: structures.png)")
    rp = sub.add_parser("reproduce", help="run every study and make every figure and table of the paper")
    scales = ["tiny", "default", "full"]
    rp.add_argument("--scale", choices=scales, default="default", help="study size (default: default)")
    rp.add_argument("--force", action="store_true", help="re-run results already stored")
    rp.add_argument("--out", default="results", help="results folder (default: results)")
    rp.add_argument(
        "--paper", default="paper", help="paper folder: figures/, generated/, main.tex (default: paper)"
    )
    rp.add_argument("--no-pdf", action="store_true", help="skip the LaTeX build")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"run": cmd_run, "sweep": cmd_sweep, "trace": cmd_trace, "show": cmd_show,
                "reproduce": cmd_reproduce}
    try:
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"prefixcache {args.command}: error: {e}", file=sys.stderr)
        return 2
