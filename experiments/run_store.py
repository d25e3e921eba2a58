"""Where a run's results live, and when they count as finished.

A run is known by its content, not its file names: the digest of its resolved config (every
setting that changes a result, defaults included, so an explicit default names the same run)
and of its trace file's bytes. Its folder is ``<source>-<backend>-p<page>-cap<capacity>-...``
for people, with that digest as a short suffix for the program.

A folder is written whole or not at all: the files go to a hidden temporary folder that is
renamed into place, so an interrupted run leaves nothing that looks finished, and of two
writers of one run the second finds the first's folder and keeps it. A folder counts as
finished only when every file it owns is there and valid (``finished_summary``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from prefixcache.cost_model import named_clock

# Bumped when a run's files change meaning: folders of an older format are not "finished".
RUN_FORMAT = 3
SUMMARY_KEYS = ("requests", "rejected", "token_hit_rate", "request_hit_rate")
OTHER_RUN = "its config.json is another run's"
_TRACE_DIGESTS: dict[tuple[str, int, int], str] = {}


def trace_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of the trace file's bytes (once per process per file version)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _TRACE_DIGESTS:
        h = hashlib.sha256()
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _TRACE_DIGESTS[key] = h.hexdigest()
    return _TRACE_DIGESTS[key]


def identity(cfg: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: the resolved config with the trace named by its
    content (two copies of one trace are one run; an edited trace is another)."""
    ident = {k: v for k, v in cfg.items() if k != "trace"}
    ident["trace_sha256"] = trace_digest(cfg["trace"]) if cfg.get("trace") else None
    ident["run_format"] = RUN_FORMAT
    if "clock" in cfg:  # by its constants: a recalibrated clock is another run
        ident["clock"] = named_clock(cfg["clock"]).constants()
    return ident


def run_digest(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()


def run_name(cfg: dict[str, Any]) -> str:
    """``<source>-<backend>-p<page>-cap<capacity>-<policy>-<scheduler>-b<budget>-s<seed>``, then
    what else was set (``first<N>``, the layout, ``host``, ``arrivals<x>``) and the digest's
    first 10 hex digits (options, parameters and the trace's content live there and in
    config.json)."""
    source = Path(cfg["trace"]).stem if cfg.get("trace") else cfg["workload"]
    parts = [source, cfg["backend"], f"p{cfg['page_size']}", f"cap{cfg['capacity_tokens']}"]
    if cfg.get("eviction_policy"):
        parts.append(str(cfg["eviction_policy"]).replace(":", "."))
    parts += [cfg["scheduler"], f"b{cfg['token_budget']}", f"s{cfg['seed']}"]
    if cfg.get("limit") is not None:
        parts.append(f"first{cfg['limit']}")
    if cfg.get("layout") is not None:
        parts.append(cfg["layout"] if isinstance(cfg["layout"], str) else "layout")
    if cfg.get("host_tier"):
        parts.append("host")
    if cfg.get("arrival_scale", 1.0) != 1.0:
        parts.append(f"arrivals{cfg['arrival_scale']:g}")
    if cfg.get("clock", "cpu") != "cpu":
        parts.append(cfg["clock"])
    return "-".join([*parts, run_digest(cfg)[:10]])


# ------------------------------------------------------------------------------ reading
def requests_file(folder: Path) -> Path | None:
    for name in ("requests.parquet", "requests.csv"):
        if (folder / name).is_file():
            return folder / name
    return None


def finished_summary(folder: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of ``cfg``'s finished run in ``folder``, or None when the folder is absent.
    A folder that is there but incomplete or not this run's (a file missing, empty or
    unreadable, a config of another run) is not finished: a warning names what is wrong, and
    the caller runs it again."""
    if not folder.exists():
        return None
    problem = _problem(folder, cfg)
    if problem is None:
        return dict(json.loads((folder / "summary.json").read_text()))
    warnings.warn(f"{folder} is not a finished run ({problem}); running it again", stacklevel=2)
    return None


def _problem(folder: Path, cfg: dict[str, Any]) -> str | None:
    loaded = []
    for name in ("config.json", "summary.json"):
        try:
            loaded.append(json.loads((folder / name).read_text()))
        except FileNotFoundError:
            return f"{name} is missing"
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"{name} is not valid JSON: {e}"
    stored, summary = loaded
    if not isinstance(stored, dict) or stored.get("run_digest") != run_digest(cfg):
        return OTHER_RUN
    if not isinstance(summary, dict) or not all(k in summary for k in SUMMARY_KEYS):
        return "summary.json lacks " + ", ".join(k for k in SUMMARY_KEYS if k not in (summary or {}))
    table = requests_file(folder)
    if table is None:
        return "requests.parquet is missing"
    rows = _rows(table)
    if rows != summary["requests"]:
        return f"{table.name} holds {rows} rows for {summary['requests']} requests"
    return None


def _rows(table: Path) -> int | None:
    try:
        if table.suffix == ".parquet":
            import pyarrow.parquet as pq

            return int(pq.read_metadata(table).num_rows)
        return len(pd.read_csv(table))
    except Exception:  # any unreadable table is simply not finished
        return None


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """Config fields as table columns: nested dicts and lists (a layout spelled out) become
    JSON strings, params spread out."""
    row = {k: json.dumps(v) if isinstance(v, list) else v
           for k, v in config.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in config.items() if isinstance(v, dict) and k != "params"}
    row.update({k: json.dumps(v, sort_keys=True) for k, v in nested.items()})
    row.update({f"param_{k}": v for k, v in config.get("params", {}).items()})
    return row


def read_config(folder: Path) -> dict[str, Any]:
    """The run config a folder's config.json holds (without the identity written beside it)."""
    stored = json.loads((folder / "config.json").read_text())
    return {k: v for k, v in stored.items() if k not in ("run_digest", "trace_sha256")}


def read_summary(folder: Path) -> dict[str, Any]:
    """A finished folder's summary.json; a ValueError naming the file if it is unreadable."""
    path = folder / "summary.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None


def read_requests(folder: Path, columns: list[str] | None = None) -> pd.DataFrame:
    table = requests_file(folder)
    if table is None:
        raise ValueError(f"{folder}: no requests.parquet or requests.csv")
    if table.suffix == ".parquet":
        return pd.read_parquet(table, columns=columns)
    return pd.read_csv(table, usecols=columns)


# ------------------------------------------------------------------------------ writing
def check_writable_folder(path: Path, what: str = "--out") -> None:
    """ValueError now, before any work, if ``path`` cannot hold results (a file, or a folder
    this process cannot create or write)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{what} {path} is not writable: {e.strerror or e}") from None


def check_writable_file(path: Path, what: str) -> None:
    """ValueError now if ``path`` cannot be written as a file (it is a folder, or its folder
    cannot be written)."""
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a file")
    check_writable_folder(path.parent, f"the folder of {what}")


def write_run(folder: Path, cfg: dict[str, Any], summary: dict[str, Any], df: pd.DataFrame,
              *, exist_ok: bool = True) -> Path:
    """Write a run's folder (config.json with its identity, requests.parquet, or CSV without
    pyarrow, and summary.json) atomically; returns the folder that holds the run.

    If ``folder`` exists by the time the files are ready (another writer of the same run
    finished first), that folder is kept when ``exist_ok``, else the next free ``-2``, ``-3``
    ... name is taken (a forced rerun beside the first)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        config = dict(cfg, run_digest=run_digest(cfg), trace_sha256=identity(cfg)["trace_sha256"])
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        try:
            df.to_parquet(tmp / "requests.parquet", index=False)
        except ImportError:  # no pyarrow: CSV is the documented fallback
            df.to_csv(tmp / "requests.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        target, i = folder, 1
        while True:
            try:
                os.rename(tmp, target)  # atomic; refuses a target folder that has files
                return target
            except OSError:
                if not target.exists():
                    raise
            problem = _problem(target, cfg)
            if problem is not None and problem != OTHER_RUN:  # ours replaces an incomplete one
                _remove(target)
            elif problem is None and exist_ok:
                return target  # the same run, finished by another writer first
            else:
                i += 1
                target = folder.with_name(f"{folder.name}-{i}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove(folder: Path) -> None:
    """Delete a folder without a window in which it is half there: renamed aside first (a
    concurrent writer may have removed or replaced it already)."""
    trash = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.stale")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def write_tables(table: pd.DataFrame, stem: Path) -> None:
    """``stem``.csv and .parquet, each written whole or not at all."""
    for suffix, write in ((".csv", table.to_csv), (".parquet", table.to_parquet)):
        path = stem.with_suffix(suffix)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        write(tmp, index=False)
        os.replace(tmp, path)
