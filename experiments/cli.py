"""The prefixcache command: run, sweep, plot, trace, show, reproduce.

Every run writes one folder under --out named from its settings and the digest of its
content (the trace's bytes and every setting that changes a result; see run_store.py):
config.json, requests.parquet (or requests.csv) and summary.json. A folder whose files are
all there and valid is a finished run: it is skipped, never overwritten (--force runs again
into a new folder with a numbered suffix).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefixcache.experiments.analysis.bounds import OFFLINE_DFS, offline_schedule
from prefixcache.experiments.run_store import (
    check_writable_file,
    check_writable_folder,
    finished_summary,
    read_requests,
    read_summary,
    run_name,
    write_run,
    write_tables,
)
from prefixcache.experiments.sweep_file import EXAMPLE, SECTIONS, read_sweep

from prefixcache import (
    CacheConfig,
    Engine,
    available_backends,
    available_schedulers,
    capabilities,
    make_cache,
    make_scheduler,
)
from prefixcache.cost_model import named_clock

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
    "eviction_policy": None,  # None: the backend's default (lru), written out when resolved
    "layout": None,  # a ModelLayout preset or a list of layers; None: one full-attention layer
    "arrival_scale": 1.0,  # arrival times x this, counted from the first (0.5: twice the load)
    "params": {},
    "options": {},  # the backend's own keywords (make_cache), e.g. {"use_eagle": true}
    "host_tier": None,  # HostTierConfig fields (prefixcache.tiers) or None: no host tier
    "clock": "cpu",  # the simulated clock: cpu (measured) or a GPU roofline (cost_model.named_clock)
}
# --host-* flags of `run` -> HostTierConfig fields
HOST_FLAGS = (("--host-tokens", "capacity_tokens", int, "host tier size in tokens"),
              ("--host-ratio", "ratio", float, "host tier size as a multiple of the device pool"),
              ("--host-eviction-policy", "eviction_policy", str, "hashchain: lru or arc"),
              ("--host-write-policy", "write_policy", str,
               "radix: write_through, write_through_selective or write_back"),
              ("--host-block-size", "block_size", int, "hashchain: offloaded chunk in tokens"))
# Options with a key of their own (moved there, so that both spellings are one run), and
# options that are not settings (filled in by the program).
OWN_KEYS = ("eviction_policy", "layout")
INTERNAL_OPTIONS = ("host_tier", "known_prompt_hashes", "clock", "attention_groups")
POWERS_OF_TWO_NOTE = (
    "vLLM's --block-size takes 1, 8, 16, 32, 64, 128 or 256 (vllm/config/cache.py BlockSize) "
    "and SGLang's kernels are built for power-of-two pages"
)

INDEX_MEMORY_KEYS = ("index_bytes", "index_bytes_per_cached_token")


def scheduler_names() -> list[str]:
    """The online schedulers and the offline DFS order (the scheduling study's optimum)."""
    return [*available_schedulers(), OFFLINE_DFS]


def full_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every setting of a run, checked and resolved (an explicit default is the default), so
    that equal results have equal configs; ValueError listing the valid values, before any work."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; valid: {sorted(DEFAULTS)}")
    if overrides.get("trace") and overrides.get("workload"):
        raise ValueError("give a --trace or a --workload, not both")
    cfg = {**DEFAULTS, **overrides}
    cfg["options"] = _own_keys_out_of_options(cfg, overrides)
    if cfg["backend"] not in available_backends():
        raise ValueError(f"unknown backend {cfg['backend']!r}; valid: {', '.join(available_backends())}")
    if cfg["scheduler"] != OFFLINE_DFS:
        try:
            make_scheduler(cfg["scheduler"])
        except ValueError:
            valid = ", ".join(scheduler_names())
            raise ValueError(f"unknown scheduler {cfg['scheduler']!r}; valid: {valid}") from None
    for key in ("capacity_tokens", "page_size", "token_budget"):
        _check_int(key, cfg[key], minimum=1)
    _check_int("seed", cfg["seed"], minimum=0)
    if cfg["limit"] is not None:
        _check_int("limit", cfg["limit"], minimum=1, note=" (leave it out for every request)")
    cfg["arrival_scale"] = _arrival_scale(cfg["arrival_scale"])
    if cfg["page_size"] & (cfg["page_size"] - 1):
        warnings.warn(f"page size {cfg['page_size']} is not a power of two: {POWERS_OF_TWO_NOTE}; "
                      "the run models neither engine as deployed", stacklevel=2)
    cfg["layout"] = _layout(cfg["layout"])
    if not isinstance(cfg["clock"], str):
        raise ValueError(f"clock must be a name (cpu, h100-llama3-8b, ...), got {cfg['clock']!r}")
    named_clock(cfg["clock"])  # ValueError listing the valid names
    CacheConfig(cfg["capacity_tokens"], cfg["page_size"], layout=cfg["layout"])  # its own errors
    cfg["eviction_policy"] = _eviction_policy(cfg["backend"], cfg["eviction_policy"])
    _check_option_names(cfg["backend"], cfg["options"])
    if cfg["host_tier"] is not None:
        host_tier_of(cfg)  # bad fields or values: the tier's own ValueError, before any work
    if cfg["trace"]:
        if cfg["params"]:
            raise ValueError(f"--param sets workload parameters; a trace takes none (got {cfg['params']})")
        from prefixcache.experiments.inputs.traces import resolve

        trace = resolve(cfg["trace"])
        if not trace.exists():
            raise FileNotFoundError(f"trace {cfg['trace']} does not exist")
        if not trace.is_file():
            raise ValueError(f"trace {cfg['trace']} is not a file")
        cfg["workload"] = None  # the trace is the source: config.json must not name a workload
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        make_workload(cfg["workload"], **cfg["params"])
    return cfg


def _check_int(key: str, value: object, *, minimum: int, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        flag = "--" + key.replace("_", "-")
        raise ValueError(f"{flag} must be an int >= {minimum}{note}, got {value!r}")


def _arrival_scale(value: object) -> float:
    from prefixcache.experiments.inputs.traces import check_arrival_scale

    return check_arrival_scale(value, "--arrival-scale")


def _own_keys_out_of_options(cfg: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The options without those that have a key of their own (moved to that key)."""
    options = dict(cfg["options"] or {})
    for key in OWN_KEYS:
        if key in options:
            value = options.pop(key)
            if overrides.get(key) is not None and overrides[key] != value:
                raise ValueError(f"{key} is given twice: {overrides[key]!r} and option {value!r}")
            cfg[key] = value
    if "host_tier" in options:
        raise ValueError("a host tier is set by the --host-* flags (a [host_tier] section), not an option")
    return options


def _layout(layout: Any) -> Any:
    """A layout as config.json keeps it: a preset name, or a list of layer lists."""
    if layout is None or isinstance(layout, str):
        return layout
    if isinstance(layout, (list, tuple)):
        return [list(layer) if isinstance(layer, (list, tuple)) else layer for layer in layout]
    raise ValueError(f"layout must be a preset name or a list of layers, got {layout!r}")


def _eviction_policy(backend: str, name: Any) -> str | None:
    """The policy's resolved name (lru when none is given), or None for a backend without one."""
    from prefixcache.capabilities import BACKENDS_WITH_POLICIES, eviction_policies

    if backend not in BACKENDS_WITH_POLICIES:
        if name is not None:
            raise ValueError(f"backend {backend!r} takes no eviction policy; "
                             f"those that do: {', '.join(BACKENDS_WITH_POLICIES)}")
        return None
    if name is None:
        return "lru"
    if not isinstance(name, str):
        raise ValueError(f"eviction policy must be a name, got {name!r}")
    if ":" in name:
        from prefixcache.eviction import load_policy_spec

        return load_policy_spec(name)  # a user's own class, "package.module:Class"
    valid = eviction_policies(backend)
    if name.lower() not in valid:
        raise ValueError(f"unknown eviction policy {name!r} for {backend}; valid: {', '.join(valid)} "
                         "or a class as package.module:Class")
    return name.lower()


def option_names(backend: str) -> list[str] | None:
    """The keywords ``make_cache(backend, ...)`` takes that are settings of a run (None when
    a registered backend takes any keyword: then the backend itself judges them)."""
    from prefixcache.registry import backend_classes

    names: set[str] = set()
    for cls in backend_classes(backend):
        params = inspect.signature(cls).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        names.update(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    return sorted(names - set(INTERNAL_OPTIONS) - set(OWN_KEYS))


def _check_option_names(backend: str, options: dict[str, Any]) -> None:
    valid = option_names(backend)
    if valid is None:
        return
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"backend {backend!r} takes no option {', '.join(unknown)}; "
                         f"valid: {', '.join(valid) or 'none'}")


def host_tier_of(cfg: dict[str, Any]) -> Any:
    """The config's HostTierConfig, or None. A tier needs a size: the other fields alone
    (a host eviction policy, say) are an error, not a tier of the default size."""
    from prefixcache.tiers import HostTierConfig

    tier = cfg["host_tier"]
    if tier is None:
        return None
    if not isinstance(tier, dict):
        raise ValueError(f"host_tier must be a table of HostTierConfig fields, got {tier!r}")
    if tier.get("capacity_tokens") is None and tier.get("ratio") is None:
        given = ", ".join(sorted(tier)) or "nothing"
        raise ValueError(f"a host tier needs a size, --host-tokens or --host-ratio "
                         f"(capacity_tokens or ratio); got {given}")
    try:
        return HostTierConfig(**tier)
    except TypeError as e:  # an unknown field
        raise ValueError(f"host_tier: {e}") from None


def build_requests(cfg: dict[str, Any], records: Any = None) -> tuple[Any, int]:
    """The requests of a config (a lazy iterator for a trace, over ``records`` if the caller
    read them already) and how many there are, arrivals rescaled by ``arrival_scale``."""
    limit, scale = cfg["limit"], cfg.get("arrival_scale", 1.0)
    if cfg["trace"]:
        from prefixcache.experiments.inputs.traces import iter_requests, read_trace, scale_arrivals

        records = read_trace(cfg["trace"]) if records is None else records
        if not records:
            raise ValueError(f"trace {cfg['trace']} holds no requests")
        if scale != 1.0:
            records = scale_arrivals(records, scale)
        n = len(records) if limit is None else min(len(records), limit)
        reqs: Any = iter_requests(records, limit=limit, seed=cfg["seed"])
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        reqs = make_workload(cfg["workload"], seed=cfg["seed"], **cfg["params"]).generate()[:limit]
        if scale != 1.0 and reqs:
            first = reqs[0].arrival_time
            for r in reqs:
                r.arrival_time = first + (r.arrival_time - first) * scale
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
    """Run one config into its folder (or return the finished run's summary, ``skipped``).
    The folder is checked to be writable first, so no run is lost at the end; the summary's
    ``folder`` names where the run lies.

    index_memory_bytes: also measure the cache's bookkeeping deeply (pympler walks every
    object: minutes for a multi-million-token pool, so only on request)."""
    check_writable_folder(out_root)
    folder = out_root / run_name(cfg)
    if not force and (done := finished_summary(folder, cfg)) is not None:
        return dict(done, skipped=True, folder=str(folder))
    summary, df = simulate(cfg, progress=progress, index_memory_bytes=index_memory_bytes)
    folder = write_run(folder, cfg, summary, df, exist_ok=not force)
    return dict(summary, folder=str(folder))


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
    if cfg["eviction_policy"] is not None:
        options["eviction_policy"] = cfg["eviction_policy"]
    if cfg["trace"]:  # read once: the requests and the hash store both come from it
        from prefixcache.experiments.inputs.traces import read_trace

        trace_records = read_trace(cfg["trace"])
    else:
        trace_records = None
    known_hashes = prompt_hash_store(cfg, trace_records)
    if known_hashes is not None:  # the same hashes, read instead of computed: not a setting
        options["known_prompt_hashes"] = known_hashes
    config = CacheConfig(cfg["capacity_tokens"], cfg["page_size"], layout=cfg.get("layout"))
    try:
        cache = make_cache(cfg["backend"], config, **options)
    except TypeError as e:  # an option of the wrong kind
        raise ValueError(f"{cfg['backend']}: {e}") from None
    requests, total = build_requests(cfg, trace_records)
    requests, scheduler = offline_schedule(requests, cfg["scheduler"])
    clock = named_clock(cfg["clock"])
    engine = Engine(cache, scheduler, cfg["token_budget"], seed=cfg["seed"], cost_model=clock)
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
    summary.update(over_all_requests(records))
    if not engine.time_cache_ops:  # not measured (Engine's time_cache_ops): no number, not 0
        summary["cache_op_us_per_request"] = None
    if summary["rejected"]:
        warnings.warn(
            f"{run_name(cfg)}: {summary['rejected']} of {len(records)} requests are larger than the "
            f"cache ({cache.config.usable_tokens} usable tokens) and never ran; token_hit_rate is over "
            f"the {summary['admitted']} admitted, token_hit_rate_all over all {len(records)}",
            stacklevel=2,
        )
    summary.update(
        config=run_name(cfg),
        wall_s=wall,
        prompt_tokens_per_s=summary["prompt_tokens"] / wall if wall else None,
        steps=engine.step_count,
        simulated_s=engine.clock,
        clock=engine.cost_model.source,
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


def over_all_requests(records: Sequence[Any]) -> dict[str, Any]:
    """The summary's numbers over every request, a rejected one counting as a miss (the
    study's request set is then the same in every cell whatever the capacity), beside the
    usual rates over the admitted ones; and the TTFT median."""
    prompt = sum(r.prompt_tokens for r in records)
    ran = [r for r in records if not r.rejected]
    ttft = [r.first_token_time - r.arrival_time for r in ran if r.first_token_time is not None]
    return {
        "admitted": len(ran),
        "token_hit_rate_all": sum(r.hit_tokens for r in ran) / prompt if prompt else 0.0,
        "request_hit_rate_all": sum(r.hit_tokens > 0 for r in ran) / len(records) if records else 0.0,
        "ttft_p50_s": float(np.median(ttft)) if ttft else None,
    }


# ------------------------------------------------------------------------------ commands
def cmd_run(args: argparse.Namespace) -> int:
    given = vars(args)
    tier = {f: given[f"host_{f}"] for _, f, _, _ in HOST_FLAGS if given[f"host_{f}"] is not None}
    nested = ("params", "options", "host_tier")
    plain = {k: v for k, v in given.items() if k in DEFAULTS and v is not None and k not in nested}
    if isinstance(plain.get("layout"), str) and plain["layout"].lstrip().startswith("["):
        plain["layout"] = _json_value(plain["layout"], "--layout")
    nested_values = {"params": _parse_params(args.param), "options": _parse_params(args.option, "--option"),
                     "host_tier": tier or None}
    cfg = full_config(plain | nested_values)
    s = execute(cfg, Path(args.out), force=args.force, index_memory_bytes=args.index_memory,
                progress=sys.stderr.isatty())
    state = "skipped (finished earlier)" if s.get("skipped") else f"{s['wall_s']:.2f}s"
    print(f"{Path(s['folder']).name}: {summary_line(s)} [{state}]")
    return 0


def summary_line(s: dict[str, Any]) -> str:
    ran = s["requests"] - s["rejected"]
    line = (
        f"token hit rate {s['token_hit_rate']:.1%}, request hit rate {s['request_hit_rate']:.1%} "
        f"of {ran} requests, prefill computed {s['prefill_tokens_computed']}, preemptions {s['preemptions']}"
    )
    if s.get("ttft_p50_s") is not None:
        line += f", TTFT p50 {s['ttft_p50_s']:.3g} s p99 {s['ttft_p99_s']:.3g} s"
    if s["rejected"]:
        line += (f"; {s['rejected']} rejected (larger than the cache): token hit rate over all "
                 f"{s['requests']} requests {s['token_hit_rate_all']:.1%}")
    return line


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.example:
        print(EXAMPLE, end="")
        return 0
    if args.grid is None:
        raise ValueError("name a sweep file (prefixcache sweep --example prints one)")
    out = Path(args.out)
    grid = Path(args.grid)
    if not grid.exists():
        raise FileNotFoundError(f"sweep file {grid} does not exist")
    cells = read_sweep(grid, full_config)
    check_writable_folder(out)
    stem = out / f"{grid.stem}-sweep"
    for suffix in (".csv", ".parquet"):
        check_writable_file(stem.with_suffix(suffix), "the sweep table")
    runs = {run_name(c): c for c in cells}  # equal configs (an explicit default) are one run
    todo = [c for name, c in runs.items() if finished_summary(out / name, c) is None]
    print(f"sweep: {len(cells)} cells, {len(runs) - len(todo)} finished, {len(todo)} to run")
    for _ in _run_cells(todo, out, args.executor, args.jobs, args.address):
        pass
    table = sweep_table(cells, out)
    write_tables(table, stem)
    print(f"sweep table: {stem}.csv and .parquet ({len(table)} cells)")
    return 0


def _run_cells(
    todo: list[dict[str, Any]], out: Path, executor: str, jobs: int, address: str | None = None
) -> Iterator[dict[str, Any]]:
    """Each cell's summary as it finishes (its folder written here, by the driver, and its
    line printed above the progress bar, which advances per finished cell)."""
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), unit="cell", disable=len(todo) < 2 or None) as bar:
        for cfg, summary, df, caught in _simulations(todo, executor, jobs, address):
            for message in caught:  # a worker's warnings, shown here, one line each
                warnings.warn(message, stacklevel=1)
            folder = write_run(out / run_name(cfg), cfg, summary, df)
            bar.write(f"{folder.name}: {summary_line(summary)}")
            bar.update(1)
            yield summary


def _simulate_cell(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame, list[str]]:
    """One cell in a worker, its warnings returned to the driver (a worker's stderr would
    print them in its own format, between the driver's lines)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary, df = simulate(cfg)
    return cfg, summary, df, list(dict.fromkeys(str(w.message) for w in caught))


def _simulations(
    todo: list[dict[str, Any]], executor: str, jobs: int, address: str | None
) -> Iterator[tuple[dict[str, Any], dict[str, Any], pd.DataFrame, list[str]]]:
    """(config, summary, requests, warnings) per cell, in the order cells finish."""
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
    its summary, read back from the cell's folder, and ``token_hit_rate_common``: the rate
    over the requests every cell of the same request set admitted (a warning says when the
    cells admitted different sets: a capacity too small for some prompts drops them)."""
    from prefixcache.experiments.figures.common import flat_config

    table = pd.DataFrame([flat_config(cfg) | read_summary(out / run_name(cfg)) for cfg in cells])
    table["token_hit_rate_common"] = common_set_rates(cells, out)
    return table


def common_set_rates(cells: list[dict[str, Any]], out: Path) -> list[float]:
    """Each cell's token hit rate over the requests that every cell with its request set
    (same trace or workload, parameters, seed and limit) admitted."""
    from prefixcache.experiments.run_store import identity

    columns = ["request_id", "rejected", "prompt_tokens", "hit_tokens"]
    frames = [read_requests(out / run_name(c), columns) for c in cells]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cells):
        ident = identity(c)
        source = [ident["trace_sha256"], c["workload"], c["params"], c["seed"], c["limit"]]
        groups.setdefault(json.dumps(source, sort_keys=True, default=str), []).append(i)
    rates = [0.0] * len(cells)
    for members in groups.values():
        admitted = [frozenset(frames[i].loc[~frames[i]["rejected"], "request_id"]) for i in members]
        common = frozenset.intersection(*admitted)
        if len(set(admitted)) > 1:
            sizes = sorted({len(a) for a in admitted})
            warnings.warn(
                f"cells over one request set admitted different requests ({sizes[0]} to {sizes[-1]} "
                f"of {len(frames[members[0]])}; some prompts exceed the smaller caches): compare "
                f"token_hit_rate_common, the rate over the {len(common)} that every cell admitted",
                stacklevel=2,
            )
        for i in members:
            f = frames[i][frames[i]["request_id"].isin(common)]
            prompt = int(f["prompt_tokens"].sum())
            rates[i] = float(f["hit_tokens"].sum()) / prompt if prompt else 0.0
    return rates


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
    check_writable_file(Path(args.out), "--out")
    snap = structures.run_requests(prompts, args.page_size)
    path = structures.draw(snap, args.page_size, Path(args.out))
    for i, (h, r) in enumerate(zip(snap.hits["hashchain"], snap.hits["radix"], strict=True)):
        print(f"request {i}: {len(prompts[i])} tokens, hit hashchain {h}, radix {r}")
    print(f"wrote {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """A sweep table as a picture (experiments/plot.py): one line per --hue, 95% CIs where
    cells repeat (over seeds)."""
    from prefixcache.experiments.plot import plot_sweep

    out = Path(args.out) if args.out else Path(args.table).with_suffix(f".{args.y}.png")
    check_writable_file(out, "--out")
    path = plot_sweep(args.table, args.x, args.y, hue=args.hue, col=args.col, out=out)
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
        if not sep or not key:
            raise ValueError(f"{flag} expects key=value, got {item!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _json_value(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} {text!r} is not JSON: {e}") from None


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefixcache", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    from prefixcache.experiments.inputs.workloads import available_workloads

    def one_of(names: Sequence[str], default: object) -> str:
        return f"one of: {', '.join(names)} (default: {default})"

    r = sub.add_parser(
        "run",
        help="one workload (or trace) x backend x config",
        epilog="What each backend takes over each layout (prefixcache/capabilities.py):\n"
        + capabilities.summary(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    r.add_argument("--eviction-policy", dest="eviction_policy",
                   help="lru (default) or another the backend takes over the layout (listed below), or a "
                   "class of your own as package.module:Class")
    r.add_argument("--layout", help="the model's layers: a preset (e.g. gemma3-like) or a JSON list such "
                   'as [["sliding_window", 1024], ["full"]] (default: one full-attention layer)')
    r.add_argument("--arrival-scale", dest="arrival_scale", type=float,
                   help="arrival times x this, counted from the first: 0.5 is twice the load (default: 1)")
    r.add_argument("--clock", help="the simulated clock: cpu (measured on this CPU, default) or a GPU "
                   "roofline: h100-llama3-8b, h200-llama3-8b (prefixcache/roofline.py)")
    r.add_argument("--param", action="append", help="workload parameter key=value (repeatable)")
    r.add_argument("--option", action="append",
                   help="backend option key=value (JSON value), e.g. use_eagle=true (repeatable; "
                   "an unknown key is an error listing the backend's keys)")
    for flag, field, kind, what in HOST_FLAGS:
        r.add_argument(flag, dest=f"host_{field}", type=kind, help=f"{what} (default: no host tier)")
    r.add_argument("--out", default="results", help="folder of run folders (default: results)")
    r.add_argument("--force", action="store_true", help="run again into a new folder")
    r.add_argument(
        "--index-memory", action="store_true", help="measure the index's bytes deeply (slow on big pools)"
    )
    s = sub.add_parser("sweep", help="a grid of runs from a TOML file (resumable)")
    sections = "; ".join(f"[{k}] {v}" for k, v in SECTIONS.items())
    s.add_argument("grid", nargs="?", help=f"TOML file: {sections}. --example prints one")
    s.add_argument("--example", action="store_true", help="print a commented sweep file and exit")
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
    pl = sub.add_parser("plot", help="draw a sweep table: --y against --x, one line per --hue")
    pl.add_argument("table", help="a sweep table (.csv or .parquet, as prefixcache sweep writes)")
    pl.add_argument("--x", required=True, help="column on the x axis, e.g. capacity_tokens")
    pl.add_argument("--y", required=True, help="column on the y axis, e.g. token_hit_rate")
    pl.add_argument("--hue", help="column whose values get one line each, e.g. backend")
    pl.add_argument("--col", help="column whose values get one panel each, e.g. page_size")
    pl.add_argument("--out", help="image file (default: the table's name with .<y>.png)")
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


EXTRAS = {"seaborn": "paper", "matplotlib": "paper", "pympler": "paper", "ray": "ray",
          "zmq": "events", "msgspec": "events"}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"run": cmd_run, "sweep": cmd_sweep, "plot": cmd_plot, "trace": cmd_trace,
                "show": cmd_show, "reproduce": cmd_reproduce}
    with one_line_warnings():
        try:
            rc = commands[args.command](args)
            sys.stdout.flush()  # here, so that a closed pipe is caught below
            return rc
        except (ValueError, FileNotFoundError) as e:
            print(f"prefixcache {args.command}: error: {e}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as e:
            if e.name not in EXTRAS:
                raise
            print(f"prefixcache {args.command}: error: this needs {e.name}, which the base install "
                  f"lacks: pip install 'prefixcache[{EXTRAS[e.name]}]'", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `prefixcache trace ... | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except KeyboardInterrupt:
            print(f"prefixcache {args.command}: interrupted; finished runs are kept, the run in "
                  "progress was not written (run the command again to resume)", file=sys.stderr)
            return 130


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Warnings as ``prefixcache: warning: ...``, one line, without the source line."""
    saved = warnings.formatwarning
    warnings.formatwarning = lambda message, *_a, **_k: f"prefixcache: warning: {message}\n"  # type: ignore[assignment]
    try:
        yield
    finally:
        warnings.formatwarning = saved
