"""Sweep files (``prefixcache sweep grid.toml``): a TOML schema, read strictly.

Every section and key is known; anything else is an error that names it and the valid ones,
so a typo never runs default cells in silence. ``EXAMPLE`` is what ``prefixcache sweep
--example`` prints, and a test reads it back.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECTIONS = {
    "grid": "lists of values, crossed: one cell per combination",
    "fixed": "one value per key, in every cell",
    "params": "the workload's parameters (not for traces), in every cell",
    "options": "the backend's own keywords (make_cache), in every cell",
    "host_tier": "HostTierConfig fields, in every cell (needs capacity_tokens or ratio)",
}
NESTED = ("params", "options", "host_tier")  # sections of their own, not keys of [grid]/[fixed]

EXAMPLE = '''\
# A prefixcache sweep: `prefixcache sweep this.toml --out results`.
# Cells already finished in --out are skipped, so an interrupted sweep resumes.

[grid]                        # lists, crossed: 2 x 2 x 3 = 12 cells
backend = ["hashchain", "radix"]
page_size = [1, 16]
capacity_tokens = [8192, 32768, 131072]

[fixed]                       # one value, in every cell
workload = "multi-turn-chat"  # or: trace = "traces/conversation.jsonl" (and no [params])
scheduler = "fcfs"
eviction_policy = "lru"       # lru, lfu, fifo, ..., or "my.module:MyPolicy"
token_budget = 2048
seed = 0
# limit = 1000                # only the first N requests
# arrival_scale = 0.5         # trace timestamps x 0.5 from the first: twice the load
# layout = "gemma3-like"      # a preset or a list of layers; default: one full-attention layer

[params]                      # workload parameters (prefixcache run --help lists workloads)
conversations = 8
turns = 4

# [options]                   # backend keywords, e.g. vLLM's EAGLE block drop
# use_eagle = true

# [host_tier]                 # a host KV tier: a size is required
# ratio = 2.0
# eviction_policy = "arc"     # hashchain: lru or arc
'''


Resolve = Callable[[dict[str, Any]], dict[str, Any]]


def read_sweep(path: Path, full_config: Resolve) -> list[dict[str, Any]]:
    """The cells of sweep file ``path``, each through ``full_config`` (which checks names and
    values). ValueError naming the file and what is wrong."""
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not TOML: {e}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a sweep file") from None
    try:
        return _cells(spec, full_config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _cells(spec: dict[str, Any], full_config: Resolve) -> list[dict[str, Any]]:
    unknown = sorted(set(spec) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(f'[{s}]' for s in unknown)}; "
                         f"valid: {', '.join(f'[{s}]' for s in SECTIONS)}")
    for name in SECTIONS:
        if not isinstance(spec.get(name, {}), dict):
            raise ValueError(f"{name} must be a [{name}] section, got {spec[name]!r}")
    grid, fixed = spec.get("grid", {}), spec.get("fixed", {})
    if not grid and not fixed:
        raise ValueError("no cells: give a [grid] of lists (crossed) or a [fixed] cell; "
                         "`prefixcache sweep --example` prints one")
    for key in (*grid, *fixed):
        if key in NESTED:
            raise ValueError(f"{key!r} is a section of its own: write [{key}], not {key} = ...")
    both = sorted(set(grid) & set(fixed))
    if both:
        raise ValueError(f"{', '.join(both)} in both [grid] and [fixed]")
    for key, values in grid.items():
        if not isinstance(values, list):
            raise ValueError(f"[grid] {key} = {values!r} is not a list; a single value goes in [fixed]")
        if not values:
            raise ValueError(f"[grid] {key} is an empty list: the grid has no cells")
    common = dict(fixed) | {k: dict(spec[k]) for k in NESTED if k in spec}
    return [full_config(common | dict(zip(grid, combo, strict=True)))
            for combo in itertools.product(*grid.values())]
