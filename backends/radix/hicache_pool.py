"""The host (CPU) KV pool under HiCache (SGLang 0.5.23 ``mem_cache/pool_host/base.py``).

Sizing follows ``HostKVCache.__init__``: ``hicache_size`` (here ``capacity_tokens``) if given,
else ``device tokens x hicache_ratio`` (default 2.0); then ``page_num = size // page_size + 1``
(the pool reserves a padding page when it sizes itself) and ``size = page_num x page_size``. A
pool no larger than the device pool is only a warning upstream ("L2 cache effectiveness is
reduced"), and so it is here. Every host slot is usable (upstream's ``free_slots =
arange(size)``); allocation takes from the front, frees go to the back, in whole pages.
"""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np
from prefixcache.backends.radix.tree import SlotArray

from prefixcache.tiers import HostTierConfig

DEFAULT_HICACHE_RATIO = 2.0  # server_args.hicache_ratio


def host_pool_tokens(tier: HostTierConfig, device_tokens: int, page_size: int) -> int:
    """Host slots for a device pool of ``device_tokens`` usable tokens, page-aligned as
    0.5.23 does it (one page more than ``size // page_size``)."""
    size = tier.host_tokens(device_tokens, DEFAULT_HICACHE_RATIO)
    if size < 0:
        raise ValueError(f"host tier size must be >= 0 tokens, got {size}")
    tokens = (size // page_size + 1) * page_size
    if tokens <= device_tokens:
        warnings.warn(
            f"HiCache host pool ({tokens} tokens) is smaller than the device pool "
            f"({device_tokens} tokens); L2 cache effectiveness is reduced (SGLang 0.5.23 warns, "
            "it does not refuse)",
            UserWarning,
            stacklevel=3,
        )
    return tokens


class HostPool:
    """Host slots ``[0, size)`` handed out in whole pages."""

    __slots__ = ("page_size", "size", "_free")

    def __init__(self, size: int, page_size: int) -> None:
        if size <= 0 or size % page_size:
            raise ValueError(f"host pool size must be a positive multiple of {page_size}, got {size}")
        self.page_size = page_size
        self.size = size
        self._free: deque[int] = deque(range(size // page_size))  # page ids

    @property
    def num_pages(self) -> int:
        return self.size // self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def available_size(self) -> int:
        """Free host slots (tokens), as ``HostKVCache.available_size``."""
        return len(self._free) * self.page_size

    def alloc(self, num_tokens: int) -> SlotArray | None:
        """Slots for ``num_tokens`` (a page multiple) or None, changing nothing."""
        if num_tokens % self.page_size:
            raise ValueError(f"host alloc of {num_tokens} tokens is not a multiple of {self.page_size}")
        n = num_tokens // self.page_size
        if n > len(self._free):
            return None
        pages = np.array([self._free.popleft() for _ in range(n)], dtype=np.int64)
        p = self.page_size
        return (pages[:, None] * p + np.arange(p, dtype=np.int64)).reshape(-1)

    def free(self, slots: SlotArray) -> None:
        self._free.extend(int(s) for s in slots[:: self.page_size] // self.page_size)

    def free_page_ids(self) -> list[int]:
        return list(self._free)
