"""Where a cache made with ``kv_events=True`` queues vLLM's KV events (``prefixcache.kv_events``:
BlockStored, BlockRemoved, AllBlocksCleared), for a router or publisher to drain.

A cache exposes its sink as ``PrefixCache.kv_events``, None when events are off (vLLM's
``enable_kv_cache_events``): hashchain's is its ``KVCacheManager``, radix's the tree's
``RadixEventRecorder``. Kept apart from kv_events.py, which needs msgspec.
"""

from __future__ import annotations

from typing import Protocol


class KVEventSink(Protocol):
    def take_events(self) -> list[object]:
        """The events queued since the last call, oldest first; the queue is left empty (what
        vLLM's engine drains from its ``KVCacheManager`` each step, SGLang's scheduler from its
        tree)."""
        ...
