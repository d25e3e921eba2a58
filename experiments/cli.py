"""The prefixcache command: run, sweep, plot, trace, show, reproduce.

This module parses the command line (``build_parser``) and hands each subcommand its
arguments (commands.py does the work). Every run writes one folder under --out named from its
settings and the digest of its content (the trace's bytes and every setting that changes a
result; see run_store.py): config.json, requests.parquet (or requests.csv) and summary.json.
A folder whose files are all there and valid is a finished run: it is skipped, never
overwritten (--force runs again into a new folder with a numbered suffix).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefixcache.experiments import commands
from prefixcache.experiments.run_config import DEFAULTS
from prefixcache.experiments.sweep_file import SECTIONS

from prefixcache import available_backends, capabilities
from prefixcache.scheduler import scheduler_names

# --host-* flags of `run` -> HostTierConfig fields
HOST_FLAGS = (("--host-tokens", "capacity_tokens", int, "host tier size in tokens"),
              ("--host-ratio", "ratio", float, "host tier size as a multiple of the device pool"),
              ("--host-eviction-policy", "eviction_policy", str, "hashchain: lru or arc"),
              ("--host-write-policy", "write_policy", str,
               "radix: write_through, write_through_selective or write_back"),
              ("--host-block-size", "block_size", int, "hashchain: offloaded chunk in tokens"))
# Options with a key of their own (moved there, so that both spellings are one run), and
# options that are not settings (filled in by the program).


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


def run_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The config keys ``run``'s arguments set (those left out keep DEFAULTS')."""
    tier = {f: given[f"host_{f}"] for _, f, _, _ in HOST_FLAGS if given[f"host_{f}"] is not None}
    nested = ("params", "options", "host_tier")
    plain = {k: v for k, v in given.items() if k in DEFAULTS and v is not None and k not in nested}
    if isinstance(plain.get("layout"), str) and plain["layout"].lstrip().startswith("["):
        plain["layout"] = _json_value(plain["layout"], "--layout")
    nested_values = {"params": _parse_params(given["param"]),
                     "options": _parse_params(given["option"], "--option"), "host_tier": tier or None}
    return plain | nested_values


def call(args: argparse.Namespace) -> int:
    """The subcommand ``args`` names, called with its arguments (``run``: its config's keys)."""
    given = {k: v for k, v in vars(args).items() if k != "command"}
    if args.command == "run":
        overrides = run_overrides(given)
        return commands.run(overrides, Path(args.out), force=args.force, index_memory=args.index_memory)
    return getattr(commands, args.command)(**given)  # type: ignore[no-any-return]


EXTRAS = {"seaborn": "paper", "matplotlib": "paper", "pympler": "paper", "ray": "ray",
          "zmq": "events", "msgspec": "events"}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with one_line_warnings():
        try:
            rc = call(args)
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
