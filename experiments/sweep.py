"""A sweep: a grid of CLI configs from a TOML file (sweep_file.py), run where they are not
finished (joblib processes here, or Ray), each into its own folder, then one tidy table.

The driver writes every folder (a Ray worker may sit on another machine); a worker runs
``runs.simulate`` and hands back the summary, the requests and its warnings.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from prefixcache.experiments import runs
from prefixcache.experiments.run_config import full_config
from prefixcache.experiments.run_store import (
    check_writable_file,
    check_writable_folder,
    finished_summary,
    flat_config,
    read_requests,
    read_summary,
    run_name,
    write_run,
    write_tables,
)
from prefixcache.experiments.sweep_file import read_sweep

T = TypeVar("T")


def run_sweep(grid: Path, out: Path, *, executor: str, jobs: int, address: str | None) -> Path:
    """Every cell of ``grid`` into ``out`` (finished ones are kept), then the sweep table
    (``<grid>-sweep.csv`` and ``.parquet``); returns the table's stem."""
    if not grid.exists():
        raise FileNotFoundError(f"sweep file {grid} does not exist")
    cells = read_sweep(grid, full_config)
    check_writable_folder(out)
    stem = out / f"{grid.stem}-sweep"
    for suffix in (".csv", ".parquet"):
        check_writable_file(stem.with_suffix(suffix), "the sweep table")
    named = {run_name(c): c for c in cells}  # equal configs (an explicit default) are one run
    todo = [c for name, c in named.items() if finished_summary(out / name, c) is None]
    print(f"sweep: {len(cells)} cells, {len(named) - len(todo)} finished, {len(todo)} to run")
    for _ in _run_cells(todo, out, executor, jobs, address):
        pass
    table = sweep_table(cells, out)
    write_tables(table, stem)
    print(f"sweep table: {stem}.csv and .parquet ({len(table)} cells)")
    return stem


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
            bar.write(f"{folder.name}: {runs.summary_line(summary)}")
            bar.update(1)
            yield summary


def _simulate_cell(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame, list[str]]:
    """One cell in a worker, its warnings returned to the driver (a worker's stderr would
    print them in its own format, between the driver's lines)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary, df = runs.simulate(cfg)
    return cfg, summary, df, list(dict.fromkeys(str(w.message) for w in caught))


def _simulations(
    todo: list[dict[str, Any]], executor: str, jobs: int, address: str | None
) -> Iterator[tuple[dict[str, Any], dict[str, Any], pd.DataFrame, list[str]]]:
    """(config, summary, requests, warnings) per cell, in the order cells finish."""
    if executor == "ray":
        for _, result in ray_as_completed(_simulate_cell, [(c,) for c in todo], jobs, address):
            yield result
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


def ray_as_completed(
    fn: Callable[..., T], argsets: Sequence[tuple[Any, ...]], jobs: int, address: str | None
) -> Iterator[tuple[int, T]]:
    """``fn(*args)`` for each of ``argsets`` as a Ray task (``ray_session``), yielding
    (index into ``argsets``, result) as each finishes: the one Ray loop of the sweeps and
    studies, so that a caller can save or print every result as it comes back."""
    with ray_session(address, num_cpus=jobs) as ray:
        task = ray.remote(fn)
        refs = [task.remote(*args) for args in argsets]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield index[done[0]], ray.get(done[0])


def sweep_table(cells: list[dict[str, Any]], out: Path) -> pd.DataFrame:
    """One tidy row per cell of the grid: its config (workload parameters as ``param_*``) and
    its summary, read back from the cell's folder, and ``token_hit_rate_common``: the rate
    over the requests every cell of the same request set admitted (a warning says when the
    cells admitted different sets: a capacity too small for some prompts drops them)."""
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
