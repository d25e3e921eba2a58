"""Shared plumbing of the studies: cells named from their config, tidy results on disk, reuse.

A *cell* is one run of one cache over one request stream. Its config (a plain JSON dict) names
its folder, ``results/<study>/<slug>-<hash8>/``, which holds ``config.json``, ``requests``
(one row per request) and ``summary.json`` (one row of numbers). A cell whose folder already
holds the same config is read back, not re-run (kvpress/nanochat style), unless ``force``.

Two ways to drive a cache, both only through the ``PrefixCache`` contract:

* ``engine``: the simulated engine (admission, chunked prefill, decode, preemption, simulated
  clock) with a scheduler; what every synthetic-workload study uses.
* ``replay``: requests one after another (lookup, allocate, commit, release), no batching and
  no outputs: the cache-level replay Mooncake's own capacity analysis does; fast on long traces.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.analysis.metrics import block_hit_rate_of, dataclass_frame
from prefixcache.experiments.inputs.workloads import make_workload
from prefixcache.experiments.run_config import RunConfig
from prefixcache.experiments.run_store import flat_config

from prefixcache import CostModel, Engine, PrefixCache, Request
from prefixcache.cost_model import Clock, clock_from_constants, named_clock

SCALES = ("tiny", "default", "full")
REPLAY_MODES = ("replay", "chunked-replay")  # cells without an engine (and so without a clock)
# Bump when run_cell's summary gains or changes a column: stored cells of another version rerun.
SUMMARY_VERSION = 3
REPO_ROOT = Path(__file__).resolve().parents[2]
# Traces are read in place from the shared data folder (see experiments/inputs/traces.py).
MOONCAKE_TRACES = {
    "mooncake-conversation": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
}


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    return scale


# ------------------------------------------------------------------------------ tables on disk
def write_table(df: pd.DataFrame, stem: Path) -> Path:
    """Parquet if pyarrow is importable, else CSV; returns the path written."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow  # noqa: F401

        path = stem.with_suffix(".parquet")
        df.to_parquet(path, index=False)
    except ImportError:
        path = stem.with_suffix(".csv")
        df.to_csv(path, index=False)
    return path


def read_table(stem: Path) -> pd.DataFrame:
    """The table written by ``write_table(…, stem)``; FileNotFoundError if there is none."""
    for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
        path = stem.with_suffix(suffix)
        if path.exists():
            return reader(path)
    raise FileNotFoundError(f"no results table {stem}.parquet or {stem}.csv (run the study first)")


def refuse_stale_grid(results: Path, study: str, full: str, counts: list[str], target: str) -> None:
    """RuntimeError unless the committed full grid ``results/<full>/runs.csv`` holds every cell
    of this run's ``results/<study>/summary`` with the same ``counts`` (a study whose figure
    puts its default-scale cells beside the full grid's whole-trace ones)."""
    runs = pd.read_csv(results / full / "runs.csv").set_index("cell")[counts]
    mine = read_table(results / study / "summary").set_index("cell")[counts]
    shared = mine.index.intersection(runs.index)
    if len(shared) < len(mine) or not (mine.loc[shared] == runs.loc[shared]).all().all():
        raise RuntimeError(f"{results / full} is stale: {len(mine) - len(shared)} of this run's {len(mine)} "
                           f"cells are not in it or count otherwise; rerun make {target}")


# ------------------------------------------------------------------------------ cells
def cell_name(config: dict[str, Any]) -> str:
    """Readable slug of the fields that vary most, plus a hash of the whole config."""
    canon = json.dumps(config, sort_keys=True, default=str)
    digest = hashlib.sha1(canon.encode()).hexdigest()[:8]
    parts = [config.get("source", "x"), config.get("label") or config.get("backend", "x"),
             f"p{config.get('page_size', 0)}", f"c{config.get('capacity_tokens', 0)}",
             config.get("scheduler", config.get("mode", ""))]
    slug = "-".join(str(p) for p in parts if p != "")
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in slug)
    return f"{slug}-{digest}"


def cell_config(study: str, *, source: str, backend: str, page_size: int, capacity_tokens: int,
                mode: str = "engine", scheduler: str = "fcfs", token_budget: int = 2048,
                options: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
                label: str | None = None, limit: int | None = None, seed: int = 0,
                layout: str | None = None, chunk: int | None = None,
                clock: Clock | None = None) -> dict[str, Any]:
    """The one dict that defines a cell. ``source`` is a workload name or a trace key of
    MOONCAKE_TRACES; ``params`` the workload's keywords; ``options`` the backend's; ``layout``
    a ``prefixcache.layout`` preset name (absent for a plain model, so older cells keep their
    names); ``chunk`` the prefill chunk of a "chunked-replay" cell. Engine
    cells also record the clock (``clock``'s constants, by default the measured cost model's),
    so that a recalibration or another clock reruns them; replays have no clock."""
    config = dict(study=study, source=source, params=params or {}, limit=limit, mode=mode,
                  backend=backend, options=options or {}, label=label or backend, page_size=page_size,
                  capacity_tokens=capacity_tokens, scheduler=scheduler, token_budget=token_budget,
                  seed=seed)
    if layout is not None:
        config["layout"] = layout
    if mode == "chunked-replay":
        config["chunk"] = chunk
    elif chunk is not None:
        raise ValueError(f"chunk is for chunked-replay cells, not {mode!r}")
    if mode not in REPLAY_MODES:  # run_cell drives every other mode through the engine
        config["cost_model"] = (clock if clock is not None else CostModel.measured()).constants()
    elif clock is not None:
        raise ValueError(f"a {mode!r} cell has no clock")
    return config


def trace_arrival_scale(
    source: str, limit: int | None, cost: Clock, load: float, engines: int = 1, token_budget: int = 2048
) -> float:
    """The factor on a Mooncake trace's timestamps (counted from its first) that makes the
    prefill and decode work of its first ``limit`` requests ``load`` of what ``engines``
    engines serve with no cache, each request's work its ``saturated_request_s`` (the routing,
    tier and engine-trace studies' one rescale of a trace)."""
    from prefixcache.experiments.inputs.traces import read_mooncake

    records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
    work = sum(cost.saturated_request_s(r.input_length, r.output_length, token_budget) for r in records)
    span = records[-1].timestamp - records[0].timestamp
    return work / (load * engines) / span if span > 0 else 1.0


def make_requests(config: dict[str, Any]) -> list[Request]:
    """Fresh requests for a cell (requests are mutated by a run, so never shared)."""
    source = config["source"]
    if source in MOONCAKE_TRACES:
        from prefixcache.experiments.inputs.traces import read_mooncake, to_requests

        records = read_mooncake(MOONCAKE_TRACES[source])
        reqs = to_requests(records, limit=config["limit"], prefix=source)
        scale = config.get("arrival_scale")  # a study's rescale of the trace's clock to its load
        if scale is not None:
            for r in reqs:
                r.arrival_time *= scale
        return reqs
    reqs = make_workload(source, seed=config["seed"], **config["params"]).generate()
    return reqs[: config["limit"]] if config["limit"] else reqs


def run_config(config: dict[str, Any]) -> RunConfig:
    """The run a cell's config describes (experiments/run_config.py): its cache and engine."""
    options = dict(config["options"])
    if isinstance(options.get("host_tier"), dict):  # JSON in the cell's config
        from prefixcache.tiers import HostTierConfig

        options["host_tier"] = HostTierConfig(**options["host_tier"])
    return RunConfig(
        config["backend"],
        config["capacity_tokens"],
        config["page_size"],
        layout=config.get("layout"),
        options=options,
        scheduler=config.get("scheduler", "fcfs"),
        token_budget=config.get("token_budget", 2048),
        seed=config.get("seed", 0),
        clock=clock_from_constants(config["cost_model"]) if "cost_model" in config else None,
    )


def build_cache(config: dict[str, Any]) -> PrefixCache:
    if config["backend"] == "hashchain" and config.get("source") in MOONCAKE_TRACES:
        # The same hashes, read instead of computed, in every cell over the trace (not a setting)
        return run_config(config).make_cache(known_prompt_hashes=trace_prompt_hashes(config["source"]))
    return run_config(config).make_cache()


_PROMPT_HASHES: dict[str, Any] = {}  # source -> its store, one per process


def trace_prompt_hashes(source: str) -> Any:
    """The trace's store of prompt block hashes (experiments/inputs/trace_hashes.py) for the
    requests ``make_requests`` names after the source; built once per process."""
    if source not in _PROMPT_HASHES:
        from prefixcache.experiments.inputs.trace_hashes import TracePromptHashes
        from prefixcache.experiments.inputs.traces import read_mooncake

        records = read_mooncake(MOONCAKE_TRACES[source])
        _PROMPT_HASHES[source] = TracePromptHashes(records, prefix=source)
    return _PROMPT_HASHES[source]


def save_prompt_hashes() -> None:
    """Write what this process's stores gained (cells in other processes read it later)."""
    for store in _PROMPT_HASHES.values():
        store.save()


def reset_requests(reqs: Sequence[Request]) -> None:
    """Make prompt-only replay requests reusable by another cell: nothing computed. (Each
    cache keeps its own per-request state; a request whose planned answer a replay appended is
    not reusable: its tokens grew.)"""
    if any(r.num_output_tokens for r in reqs):
        raise ValueError("replay requests with appended outputs cannot be shared between cells")
    for r in reqs:
        r.num_computed_tokens = 0
        r.num_preemptions = 0


def cache_planned_answer(cache: PrefixCache, r: Request) -> bool:
    """A planned answer that the next turn repeats: its KV (all but the last token, which is
    never fed back) is cached as a decode would leave it. True if it was."""
    planned = r.planned_output_ids
    if not (isinstance(planned, tuple) and len(planned) > 1 and r.num_output_tokens == 0):
        return False
    r.append_output_token_ids(planned)
    if not cache.allocate(r, len(planned) - 1):
        return False
    r.num_computed_tokens = r.num_tokens - 1
    cache.commit(r)
    return True


def replay(cache: PrefixCache, reqs: Sequence[Request]) -> pd.DataFrame:
    """Requests one at a time: lookup, allocate the rest of the prompt, commit, then (if the
    workload planned one) the answer, release. No batching, no engine clock."""
    rows = []
    usable = cache.config.usable_tokens
    for r in reqs:
        if r.num_tokens > usable:
            rows.append((r.request_id, r.num_prompt_tokens, 0, True, 0))
            continue
        t0 = time.perf_counter_ns()
        match = cache.lookup(r)
        if not cache.allocate(r, r.num_tokens - match.tokens, match):
            raise RuntimeError(f"replay: {r.request_id} does not fit in an otherwise idle cache")
        hit = r.num_computed_tokens
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
        cache_planned_answer(cache, r)
        cache.release(r)
        rows.append((r.request_id, r.num_prompt_tokens, hit, False, time.perf_counter_ns() - t0))
    cols = ["request_id", "prompt_tokens", "hit_tokens", "rejected", "cache_op_ns"]
    return pd.DataFrame(rows, columns=cols)


def replay_chunked(cache: PrefixCache, reqs: Sequence[Request], chunk: int) -> pd.DataFrame:
    """``replay`` with the prompt prefilled ``chunk`` tokens per step (allocate, compute,
    commit), as an engine's token budget cuts it (and as the cache's ``prefill_chunking`` aligns
    it), so that a sliding-window layer can free what leaves its window mid-prompt. Also
    records the peak memory each request pinned (``memory_in_use``: it runs alone)."""
    rows = []
    usable = cache.config.usable_tokens
    for r in reqs:
        if r.num_tokens > usable:
            rows.append((r.request_id, r.num_prompt_tokens, 0, True, 0, 0))
            continue
        t0 = time.perf_counter_ns()
        match = cache.lookup(r)
        chunking = cache.prefill_chunking
        step = chunking.chunk(r, match.tokens, min(chunk, r.num_tokens - match.tokens), chunk, match)
        if not cache.allocate(r, step, match):
            raise RuntimeError(f"replay: {r.request_id} does not fit in an otherwise idle cache")
        hit, peak = r.num_computed_tokens, 0
        while step:
            r.num_computed_tokens += step
            cache.commit(r)
            peak = max(peak, cache.memory_in_use())
            start = r.num_computed_tokens
            step = chunking.chunk(r, start, min(chunk, r.num_tokens - start), chunk)
            if step and not cache.allocate(r, step):
                raise RuntimeError(f"replay: {r.request_id} ran out of pages mid-prompt in an idle cache")
        if cache_planned_answer(cache, r):
            peak = max(peak, cache.memory_in_use())
        cache.release(r)
        rows.append((r.request_id, r.num_prompt_tokens, hit, False, time.perf_counter_ns() - t0, peak))
    cols = ["request_id", "prompt_tokens", "hit_tokens", "rejected", "cache_op_ns", "peak_units"]
    return pd.DataFrame(rows, columns=cols)


def run_engine(
    cache: PrefixCache, reqs: Sequence[Request], config: dict[str, Any]
) -> tuple[pd.DataFrame, Engine]:
    records, engine = run_config(config).run(cache, reqs)
    df = dataclass_frame(records)
    df["ttft_s"] = df["first_token_time"] - df["arrival_time"]
    df["latency_s"] = df["finish_time"] - df["arrival_time"]
    return df, engine


def run_cell(config: dict[str, Any], out_root: Path, *, force: bool = False,
             requests: Sequence[Request] | None = None) -> dict[str, Any]:
    """Run (or read back) one cell; returns its summary row (config fields + numbers)."""
    folder = out_root / config["study"] / cell_name(config)
    summary_path = folder / "summary.json"
    if not force and summary_path.exists():
        stored = json.loads((folder / "config.json").read_text())
        row = json.loads(summary_path.read_text())
        # Same config and a summary written by this code's schema: a cell from before a new
        # column was added would leave that column empty and the figures quietly different.
        same = stored == json.loads(json.dumps(config, default=str))
        if same and row.get("summary_version") == SUMMARY_VERSION:
            return dict(row)
    t0 = time.perf_counter()
    if requests is None:
        requests = make_requests(config)
    else:
        reset_requests(requests)
    cache = build_cache(config)
    summary: dict[str, Any] = {}
    if config["mode"] == "replay":
        df = replay(cache, requests)
    elif config["mode"] == "chunked-replay":
        df = replay_chunked(cache, requests, config["chunk"])
        fit = df[~df["rejected"]]
        peak = fit["peak_units"]
        summary.update(peak_units_mean=float(peak.mean()),
                       peak_units_per_prompt_token=float(peak.sum() / fit["prompt_tokens"].sum()),
                       layer_token_budget=cache.config.layer_token_budget)
    else:
        df, engine = run_engine(cache, requests, config)
        save_prompt_hashes()
        done = df[~df["rejected"]]
        summary.update(
            sim_seconds=engine.clock, steps=engine.step_count,
            ttft_mean_s=float(done["ttft_s"].mean()), ttft_p50_s=float(done["ttft_s"].median()),
            ttft_p90_s=float(done["ttft_s"].quantile(0.9)),
            ttft_p99_s=float(done["ttft_s"].quantile(0.99)),
            wait_p50_s=float((done["admission_time"] - done["arrival_time"]).median()),
            wait_p99_s=float((done["admission_time"] - done["arrival_time"]).quantile(0.99)),
            latency_mean_s=float(done["latency_s"].mean()),
            throughput_tok_s=float((done["prompt_tokens"].sum() + done["output_tokens"].sum())
                                   / max(engine.clock, 1e-9)),
            prefill_tokens=engine.prefill_tokens, preemptions=int(df["preemptions"].sum()),
            peak_pages_in_use=engine.peak_pages_in_use, peak_waiting=engine.peak_waiting,
        )
        if cache.host_tier is not None:  # only tiered cells: the others keep their columns
            st = cache.stats
            summary.update(host_hits=st.host_hits, host_hit_rate=st.host_hit_rate,
                           loaded_tokens=st.loaded_tokens, stored_tokens=st.stored_tokens,
                           host_evicted_tokens=st.host_evicted_tokens, load_wait_s=engine.load_wait_s,
                           **{f"tier_{k}": v for k, v in cache.host_tier.metrics().items()})
    stats = cache.stats
    ran = df[~df["rejected"]]
    # The cheap part of check_invariants (the full check costs seconds on a 1M-token pool and
    # is the property tests' job): every usable page is accounted for.
    if sum(cache.usage()) != cache.num_usable_pages():
        raise RuntimeError(f"{cell_name(config)}: page accounting broken after the run: {cache.usage()}")
    tier = cache.host_tier
    if tier is not None and sum(host := tier.usage()) != tier.num_pages():
        raise RuntimeError(f"{cell_name(config)}: host page accounting broken after the run: {host}")
    summary.update(
        requests=int(len(df)), rejected=int(df["rejected"].sum()), queries=stats.queries,
        hits=stats.hits, hit_rate=stats.hit_rate, evicted_tokens=stats.evicted_tokens,
        prompt_tokens=int(df["prompt_tokens"].sum()), hit_tokens=int(df["hit_tokens"].sum()),
        block_hit_rate=block_hit_rate_of(ran["prompt_tokens"], ran["hit_tokens"], config["page_size"]),
        cache_op_s=float(df["cache_op_ns"].sum()) * 1e-9, wall_s=time.perf_counter() - t0,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    write_table(df, folder / "requests")
    row = {**flat_config(config), **summary, "cell": folder.name, "summary_version": SUMMARY_VERSION}
    summary_path.write_text(json.dumps(row, indent=2, default=str))
    return row


def run_cells(configs: Sequence[dict[str, Any]], out_root: Path, *, force: bool = False,
              jobs: int = 2, group: Callable[[dict[str, Any]], Any] | None = None,
              executor: str = "joblib", address: str | None = None) -> pd.DataFrame:
    """Run every cell (``jobs`` processes); cells with equal ``group(config)`` run in one
    process in order, sharing one request list (replay only: trace requests are costly to build).
    ``executor`` "ray" runs each group as a Ray task (``jobs`` CPUs of a local Ray, or the
    cluster at ``address``, whose workers must see ``out_root``); a worker writes its cells'
    folders, so a run cut short keeps every finished cell and the next run skips them."""
    from joblib import Parallel, delayed

    groups: dict[Any, list[dict[str, Any]]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(group(c) if group else i, []).append(c)
    batches = list(groups.values())
    if executor == "ray":
        return pd.DataFrame([row for rows in _ray_groups(batches, out_root, force, group is not None,
                                                          jobs, address) for row in rows])
    if executor != "joblib":
        raise ValueError(f"unknown executor {executor!r}; valid: joblib, ray")
    if address is not None:
        raise ValueError("--address names a Ray cluster: it needs --executor ray")
    if jobs <= 1 or len(batches) == 1:
        results = [_run_group(b, out_root, force, group is not None) for b in batches]
    else:
        results = Parallel(n_jobs=jobs)(delayed(_run_group)(b, out_root, force, group is not None)
                                        for b in batches)
    return pd.DataFrame([row for rows in results for row in rows])


def _ray_groups(batches: list[list[dict[str, Any]]], out_root: Path, force: bool, share: bool, jobs: int,
                address: str | None) -> list[list[dict[str, Any]]]:
    """``_run_group`` of every batch as a Ray task; the rows in the batches' order, each
    finished cell's line printed as it comes back."""
    from prefixcache.experiments.sweep import ray_as_completed

    results: list[list[dict[str, Any]]] = [[] for _ in batches]
    argsets = [(b, out_root.resolve(), force, share) for b in batches]
    t0 = time.perf_counter()
    for finished, (i, rows) in enumerate(ray_as_completed(_run_group, argsets, jobs, address), 1):
        results[i] = rows
        progress = f"{finished}/{len(batches)}, {time.perf_counter() - t0:.0f} s"
        for row in rows:
            print(f"  {row['cell']}: {row['wall_s']:.0f} s ({progress})", flush=True)
    return results


def _run_group(
    configs: list[dict[str, Any]], out_root: Path, force: bool, share: bool
) -> list[dict[str, Any]]:
    shared: list[Request] | None = None
    rows = []
    for c in configs:
        if share and c["mode"] in REPLAY_MODES:
            folder = out_root / c["study"] / cell_name(c)
            if force or not (folder / "summary.json").exists():
                shared = shared if shared is not None else make_requests(c)
            rows.append(run_cell(c, out_root, force=force, requests=shared))
        else:
            rows.append(run_cell(c, out_root, force=force))
    return rows


def save_study(df: pd.DataFrame, out_root: Path, study: str, meta: dict[str, Any]) -> None:
    """The study's tidy table (one row per cell) and its scale/config, which figures read."""
    write_table(df, out_root / study / "summary")
    (out_root / study / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
    print(f"{study}: {len(df)} cells -> {out_root / study}")


def study_main(run: Callable[..., Path], scales: Sequence[str], doc: str | None,
               argv: list[str] | None, default_clock: str | None = None,
               more: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """The command line every study script shares: --scale, --out, --force, --jobs; with
    ``default_clock``, also --clock (a ``cost_model.named_clock`` name), for the engine studies
    whose clock is a parameter (passed to ``run`` as ``clock=``); ``more`` adds a study's own
    options (e.g. ``executor_options``), each passed to ``run`` as a keyword of its name."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--scale", default="default", choices=list(scales))
    ap.add_argument("--out", default="results")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    if default_clock is not None:
        ap.add_argument("--clock", default=default_clock,
                        help=f"the simulated clock (default {default_clock}; cpu)")
    shared = set(vars(ap.parse_args([])))  # the options above
    if more is not None:
        more(ap)
    a = ap.parse_args(argv)
    extra = {k: v for k, v in vars(a).items() if k not in shared}
    if extra.get("address") and extra.get("executor") != "ray":
        ap.error("--address names a Ray cluster: it needs --executor ray")
    if default_clock is None:
        run(Path(a.out), a.scale, a.force, a.jobs, **extra)
        return 0
    try:
        named_clock(a.clock)
    except ValueError as e:
        ap.error(str(e))
    run(Path(a.out), a.scale, a.force, a.jobs, clock=a.clock, **extra)
    return 0


def executor_options(ap: argparse.ArgumentParser) -> None:
    """--executor and --address, for a study whose ``run`` passes them to ``run_cells``."""
    ap.add_argument("--executor", choices=["joblib", "ray"], default="joblib",
                    help="where cells run: joblib processes here (default) or Ray tasks")
    ap.add_argument("--address", default=None, help="a Ray cluster (with --executor ray)")


# A study's default scale run under the CPU-measured clock (``--clock cpu --out results/cpu_clock``)
# for the paper's comparison of the two clocks: committed (see .gitignore), never run by reproduce.
CPU_CLOCK_RESULTS = "cpu_clock"


def clock_text(constants: dict[str, Any]) -> str:
    """How a paper line names the clock a study's cells ran under: e.g. "Llama-3-8B on an H100
    SXM (roofline)" or "measured on a CPU"."""
    clock = clock_from_constants(constants)
    if isinstance(clock, CostModel):
        return "measured on a CPU"
    return f"{clock.model.name} on an {clock.gpu.name} (roofline)"


def clock_label(constants: dict[str, Any]) -> str:
    """A figure axis's short name of the clock: e.g. "H100 SXM roofline" or "CPU-measured"."""
    clock = clock_from_constants(constants)
    return "CPU-measured" if isinstance(clock, CostModel) else f"{clock.gpu.name} roofline"


def other_clock_macros(values: dict[str, str], prefix: str, word: str = "Cpu") -> dict[str, str]:
    """``values`` (macro name -> text) renamed for the other clock's run: ``<prefix>Rest`` becomes
    ``<prefix><word>Rest`` (e.g. ``tierConvHit`` -> ``tierCpuConvHit``)."""
    stray = [k for k in values if not k.startswith(prefix)]
    if stray:
        raise ValueError(f"every macro must start with {prefix!r}: {stray}")
    return {prefix + word + k[len(prefix):]: v for k, v in values.items()}
