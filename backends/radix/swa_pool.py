"""SGLang 0.5.23's hybrid-SWA KV memory: a full pool and a sliding-window pool side by side.

``SWATokenToKVPoolAllocator`` (``mem_cache/allocator/swa.py``): every allocation takes the same
number of pages from both pools and records ``full_to_swa_index_mapping`` (0 = no SWA page);
``free`` frees both, ``free_swa`` only the SWA peer (whole pages), ``available`` is the min of
the two. We keep the mapping per page (both pools page in step, so a full page's SWA peer is a
whole page). Each pool is our ``PagePool`` (page 0 reserved, SGLang's padding slot), freed in
the order given, as SGLang's ``free_segment`` / ``free_page_ids`` free, and a free group spans
both pools as the allocator's does.

Sizing is ``HybridSWAPoolConfigurator`` (``model_executor/pool_configurator.py``) in
layer-token units (every layer's token costs the same here):
``full = budget // (n_full + r * n_swa)``, ``swa = int(full * r)``, both page-aligned, and a
ValueError when the SWA pool cannot hold one window plus one page.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from prefixcache.config import CacheConfig
from prefixcache.pool import PageIds, PagePool

DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8  # SGLang's --swa-full-tokens-ratio default


class SWAPoolSizes(NamedTuple):
    full_tokens: int  # usable tokens of the full pool (padding page excluded)
    swa_tokens: int  # usable tokens of the sliding-window pool


def swa_window(config: CacheConfig) -> int:
    """The one window the SWA pool keeps. SGLang 0.5.23 has one ``sliding_window_size`` per
    model (one SWA pool, one tree window); with several windows we keep the largest (ours: the
    tree must hold the history of the widest reader)."""
    windows = [layer.window for layer in config.model_layout.layers if layer.window is not None]
    if not windows:
        raise ValueError("the layout has no sliding-window layer")
    return max(windows)


def swa_pool_sizes(
    config: CacheConfig, swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
) -> SWAPoolSizes:
    """HybridSWAPoolConfigurator's split of ``config.layer_token_budget``."""
    if not swa_full_tokens_ratio > 0:
        raise ValueError(f"swa_full_tokens_ratio must be > 0, got {swa_full_tokens_ratio!r}")
    layout = config.model_layout
    n_full, n_swa = layout.count("full"), layout.count("sliding_window")
    if n_full == 0 or n_swa == 0:
        raise ValueError(f"a hybrid SWA pool needs full and sliding-window layers, got {layout.describe()}")
    p = config.page_size
    cell = n_full + swa_full_tokens_ratio * n_swa
    full = int(config.layer_token_budget // cell) // p * p
    swa = int(full * swa_full_tokens_ratio) // p * p
    window = swa_window(config)
    if window + p >= swa:  # validate_swa_pool_size
        raise ValueError(
            f"SWA pool ({swa} tokens) cannot hold even one request: it must exceed "
            f"sliding_window_size ({window}) + page_size ({p}); raise capacity_tokens or "
            f"swa_full_tokens_ratio ({swa_full_tokens_ratio})"
        )
    return SWAPoolSizes(full, swa)


class SWAPagePool:
    """The two pools and the page mapping. Page ids are full-pool ids unless named swa."""

    def __init__(self, full_pages: int, swa_pages: int, *, page_size: int = 1) -> None:
        """full_pages / swa_pages: pages of each pool, the reserved page 0 included."""
        self.page_size = page_size
        self.full = PagePool(full_pages, page_size=page_size)
        self.swa = PagePool(swa_pages, page_size=page_size)
        self.full_to_swa: npt.NDArray[np.int64] = np.zeros(full_pages, dtype=np.int64)

    # What a request's pages need of a pool (the dense cache's ``PagePool`` has the same): the
    # full pool's counts; no ``need_sort``, so nothing is ever staged to merge.
    @property
    def num_pages(self) -> int:
        return self.full.num_pages

    @property
    def num_free(self) -> int:
        return self.full.num_free

    @property
    def num_ready(self) -> int:
        return self.available

    def would_merge(self, n: int, merge_if_over: int | None = None) -> bool:
        return False

    def free_page_ids(self) -> PageIds:
        return self.full.free_page_ids()

    def free_each(self, runs: list[PageIds]) -> None:
        """Full pages of deleted leaves, a free call each (their SWA peers went with the leaf)."""
        self.full.free_each(runs)

    @property
    def in_group(self) -> bool:
        return self.full.in_group

    def group_begin(self) -> None:
        """SGLang's ``free_group_begin`` on the SWA allocator: both pools hold their frees."""
        self.full.group_begin()
        self.swa.group_begin()

    def group_end(self) -> None:
        """``free_group_end``: the SWA pool's held frees go back first, then the full pool's."""
        self.swa.group_end()
        self.full.group_end()

    def end_group(self) -> None:
        """End the open group, if any."""
        if self.in_group:
            self.group_end()

    @property
    def available(self) -> int:
        """Pages an allocation can take now: the min of the two pools."""
        return min(self.full.num_free, self.swa.num_free)

    def alloc(self, n: int, *, merge_if_over: int | None = None) -> PageIds | None:
        """n pages from both pools, mapped; None (nothing changed) if either is short."""
        if n > self.available:
            return None
        full = self.full.alloc(n)
        swa = self.swa.alloc(n)
        assert full is not None and swa is not None
        self.full_to_swa[full] = swa
        return full

    def alloc_full_only(self, n: int) -> PageIds | None:
        """n full pages without SWA peers (their mapping stays 0)."""
        return self.full.alloc(n) if n <= self.full.num_free else None

    def free(self, pages: npt.ArrayLike) -> None:
        """Free full pages and whatever SWA peers they still have (SWA first, as SGLang)."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        self.free_swa(arr[self.full_to_swa[arr] > 0])
        self.full.free(arr)

    def free_full_only(self, pages: npt.ArrayLike) -> None:
        """Free full pages whose SWA peers are already gone (SGLang's ``free_full_segment``)."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size and (self.full_to_swa[arr] > 0).any():
            raise ValueError(f"free_full_only of full pages that still have SWA peers: {arr.tolist()[:8]}")
        self.full.free(arr)

    def free_swa(self, pages: npt.ArrayLike) -> None:
        """Free the SWA peers of full pages and clear their mapping; the full pages stay."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            return
        peers = self.full_to_swa[arr]
        if (peers == 0).any():
            raise ValueError(f"free_swa of full pages without an SWA peer: {arr[peers == 0].tolist()[:8]}")
        self.full_to_swa[arr] = 0
        self.swa.free(peers)

    def move_swa(self, src: PageIds, dst: PageIds) -> PageIds:
        """Hand the SWA peers of full pages ``src`` to full pages ``dst`` (SGLang's
        ``_set_swa``: clear the incoming mapping, set it on the kept ids); returns them."""
        peers = self.full_to_swa[src].copy()
        self.full_to_swa[src] = 0
        self.full_to_swa[dst] = peers
        return peers

    def check(self) -> None:
        """AssertionError unless both pools and the mapping agree."""
        self.full.check()
        self.swa.check()
        mapped = self.full_to_swa[self.full_to_swa > 0]
        assert len(np.unique(mapped)) == mapped.size, "an SWA page is mapped from two full pages"
        assert not any(self.swa.is_free(int(s)) for s in mapped), "a mapped SWA page is free"
        holders = np.flatnonzero(self.full_to_swa)
        assert not any(self.full.is_free(int(f)) for f in holders), "a free full page has an SWA peer"
