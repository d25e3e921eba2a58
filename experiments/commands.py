"""What each ``prefixcache`` subcommand does, given its parsed arguments (cli.py parses them):
``run`` one config into its folder, ``sweep`` a grid of them, ``plot`` a sweep table,
``trace`` a trace's statistics, ``show`` both index structures, ``reproduce`` the paper.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prefixcache.experiments.run_config import full_config
from prefixcache.experiments.run_store import check_writable_file
from prefixcache.experiments.runs import execute, summary_line
from prefixcache.experiments.sweep import run_sweep
from prefixcache.experiments.sweep_file import EXAMPLE


def run(overrides: dict[str, Any], out: Path, *, force: bool, index_memory: bool) -> int:
    """One config (DEFAULTS with ``overrides``) into its folder under ``out``."""
    cfg = full_config(overrides)
    s = execute(cfg, out, force=force, index_memory_bytes=index_memory, progress=sys.stderr.isatty())
    state = "skipped (finished earlier)" if s.get("skipped") else f"{s['wall_s']:.2f}s"
    print(f"{Path(s['folder']).name}: {summary_line(s)} [{state}]")
    return 0


def sweep(grid: str | None, example: bool, jobs: int, executor: str, address: str | None, out: str) -> int:
    if example:
        print(EXAMPLE, end="")
        return 0
    if grid is None:
        raise ValueError("name a sweep file (prefixcache sweep --example prints one)")
    run_sweep(Path(grid), Path(out), executor=executor, jobs=jobs, address=address)
    return 0


def trace(path: str) -> int:
    from prefixcache.experiments.inputs.traces import (
        MOONCAKE_BLOCK,
        infinite_cache_block_hit_rate,
        read_trace,
    )

    records = read_trace(path)
    blocks = [h for r in records for h in r.hash_ids]
    span = records[-1].timestamp - records[0].timestamp if records else 0.0
    print(f"trace            {path}")
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


def show(requests: str | None, page_size: int, out: str) -> int:
    """Draw both index structures after a small request list (the paper's Fig. 1 by default)."""
    from prefixcache.experiments.figures import structures

    prompts = structures.parse_requests(requests) if requests else structures.WALKTHROUGH
    if page_size < 1:
        raise ValueError(f"--page-size must be >= 1, got {page_size}")
    check_writable_file(Path(out), "--out")
    snap = structures.run_requests(prompts, page_size)
    path = structures.draw(snap, page_size, Path(out))
    for i, (h, r) in enumerate(zip(snap.hits["hashchain"], snap.hits["radix"], strict=True)):
        print(f"request {i}: {len(prompts[i])} tokens, hit hashchain {h}, radix {r}")
    print(f"wrote {path}")
    return 0


def plot(table: str, x: str, y: str, hue: str | None, col: str | None, out: str | None) -> int:
    """A sweep table as a picture (experiments/plot.py): one line per --hue, 95% CIs where
    cells repeat (over seeds)."""
    from prefixcache.experiments.plot import plot_sweep

    image = Path(out) if out else Path(table).with_suffix(f".{y}.png")
    check_writable_file(image, "--out")
    path = plot_sweep(table, x, y, hue=hue, col=col, out=image)
    print(f"wrote {path}")
    return 0


def reproduce(scale: str, force: bool, out: str, paper: str, no_pdf: bool) -> int:
    """Every study, figure and table of the paper (experiments/figures/reproduce.py)."""
    from prefixcache.experiments.figures import reproduce

    argv = ["--scale", scale, "--out", out, "--paper", paper]
    return reproduce.main(argv + ["--force"] * force + ["--no-pdf"] * no_pdf)


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
