"""Study: ablations of vLLM's two eviction-order choices (hashchain ``make_cache`` options).

* ``free_order``: vLLM frees a request's blocks in *reverse* (``"reverse"``), so the free
  queue evicts a chain deepest block first and shared heads survive; ``"forward"`` frees the
  head first, which strands the rest of the chain (unreachable once its head is gone).
* ``unhashed_first``: freed blocks without a hash (a partial tail) go to the *head* of the
  free queue (``True``) and are reused first; ``False`` appends them like cached blocks.

Replayed (``common.replay``) at capacities below each workload's working set, with radix-LRU
at the same page size as a reference. Skipped, with a note in the results, if the registered
hashchain backend does not accept these options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefixcache.experiments.figures.common import (
    cell_config,
    check_scale,
    run_cells,
    save_study,
    study_main,
)

from prefixcache import CacheConfig, make_cache

STUDY = "eviction"
PAGE = 16
RADIX_PAGE = "radix-LRU, page granularity"
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("vLLM (reverse, unhashed first)", "hashchain", {"free_order": "reverse", "unhashed_first": True}),
    ("forward, unhashed first", "hashchain", {"free_order": "forward", "unhashed_first": True}),
    ("reverse, unhashed last", "hashchain", {"free_order": "reverse", "unhashed_first": False}),
    ("forward, unhashed last", "hashchain", {"free_order": "forward", "unhashed_first": False}),
    ("radix-LRU", "radix", {"eviction_policy": "lru"}),
    # radix evicting exactly the pages it takes, as vLLM does (the decomposition study's switch)
    (RADIX_PAGE, "radix", {"eviction_policy": "lru", "eviction_granularity": "page"}),
]
SOURCES: dict[str, dict[str, Any]] = {
    "shared-doc-qa": dict(num_docs=64, doc_len=1000, num_requests=300, zipf_s=0.8),
    "multi-turn-chat": dict(conversations=48, turns=6, system_len=250),
    "react-agent": dict(agents=24, steps=8, system_len=500),
}
SCALE = {
    "tiny": dict(sources=["multi-turn-chat"], shrink=6, capacities=[1 << 13, 1 << 15]),
    "default": dict(sources=list(SOURCES), shrink=1, capacities=[1 << k for k in range(13, 18)]),
    "full": dict(sources=list(SOURCES), shrink=1, capacities=[1 << k for k in range(12, 20)]),
}


def options_supported() -> bool:
    try:
        make_cache("hashchain", CacheConfig(64, PAGE), free_order="forward", unhashed_first=False)
    except (TypeError, ValueError):
        return False
    return True


def configs(scale: str) -> list[dict[str, Any]]:
    s = SCALE[check_scale(scale)]
    out = []
    for source in s["sources"]:
        params = dict(SOURCES[source])
        for key in ("num_requests", "conversations", "agents"):
            if key in params:
                params[key] = max(4, params[key] // s["shrink"])
        for cap in s["capacities"]:
            for label, backend, options in VARIANTS:
                out.append(cell_config(STUDY, source=source, backend=backend, label=label, options=options,
                                       page_size=PAGE, capacity_tokens=cap, mode="replay", params=params))
    return out


def run(out: Path, scale: str = "default", force: bool = False, jobs: int = 2) -> Path:
    meta = {"scale": scale, **SCALE[scale], "sources": SOURCES}
    if not options_supported():
        save_study(pd.DataFrame(columns=["label", "source", "capacity_tokens", "hit_rate"]), out, STUDY,
                   {**meta, "skipped": "hashchain does not accept free_order / unhashed_first"})
        return out / STUDY
    df = run_cells(configs(scale), out, force=force, jobs=jobs)
    save_study(df, out, STUDY, meta)
    return out / STUDY


def main(argv: list[str] | None = None) -> int:
    return study_main(run, SCALE, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
