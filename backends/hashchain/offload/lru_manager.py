"""vLLM 0.33's ``LRUCachePolicy`` (``kv_offload/cpu/policies/lru.py``): recency as ranks in a
lazy min-heap of the evictable chunks.

A rank is ``(order, -position)``. A request gets one provisional order at its first access and
its chunks rank by token position under it, so its tail chunks sort (and are evicted) before
its head. When the request finishes, its chunks get fresh orders tail first, head last: the
head ends most recent. A lookup touches nothing. Heap entries whose rank is stale (the chunk
was re-ranked, pinned or dropped) are skipped when popped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from prefixcache.backends.hashchain.offload.chunk import (
    ChunkStatus,
    OffloadKey,
    ReqContext,
    order_request_keys,
)

Rank = tuple[int, int]


class LRUCachePolicy:
    name = "lru"

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._ranks: dict[OffloadKey, Rank] = {}
        self._evictable: set[OffloadKey] = set()
        self._heap: list[tuple[Rank, OffloadKey]] = []
        self._next_rank = 0
        self._generation = 0  # a clear() gives every request a new rank

    def _request_rank(self, ctx: ReqContext) -> int:
        if ctx.lru_rank is None or ctx.lru_rank[0] != self._generation:
            self._next_rank += 1
            ctx.lru_rank = (self._generation, self._next_rank)
        return ctx.lru_rank[1]

    def _rebuild_heap(self) -> None:
        self._heap = [(self._ranks[k], k) for k in self._evictable]
        heapq.heapify(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) >= max(64, 2 * len(self._evictable)):
            self._rebuild_heap()

    def _update_heap(self, updated: Sequence[OffloadKey]) -> None:
        if not updated:
            return
        if len(updated) >= max(64, len(self._evictable) // 4):
            self._rebuild_heap()  # linear beats k pushes for a long prefix (as vLLM)
        else:
            for key in updated:
                heapq.heappush(self._heap, (self._ranks[key], key))
            self._maybe_compact()

    def _renew(self, keys: Iterable[OffloadKey]) -> None:
        """A fresh order for each key, in the order given (later = more recent)."""
        updated = []
        for key in keys:
            if key in self.chunks:
                self._next_rank += 1
                self._ranks[key] = (self._next_rank, 0)
                if key in self._evictable:
                    updated.append(key)
        self._update_heap(updated)

    # ------------------------------------------------------------ the policy interface
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.chunks[key] = chunk
        position = ctx.key_positions.get(key)
        if position is None:
            self._next_rank += 1
            self._ranks[key] = (self._next_rank, 0)
        else:
            self._ranks[key] = (self._request_rank(ctx), -position)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self._ranks[key], key))

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._ranks.pop(key, None)
        self._evictable.discard(key)

    def touch(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        self._renew(reversed(list(keys)))

    def on_store_miss(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        self.touch(keys, ctx)  # vLLM's default hook; the keys are not cached, so a no-op

    def on_request_access(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        request_rank = self._request_rank(ctx)
        updated = []
        for key in keys:
            position = ctx.key_positions.get(key)
            if position is None or key not in self.chunks:
                continue
            rank = (request_rank, -position)
            if self._ranks[key] >= rank:
                continue
            self._ranks[key] = rank
            if key in self._evictable:
                updated.append(key)
        self._update_heap(updated)

    def on_request_finished(
        self,
        keys: Sequence[OffloadKey],
        inserted_only: set[OffloadKey],
        reused: set[OffloadKey],
        ctx: ReqContext,
    ) -> None:
        self._renew(reversed(order_request_keys(keys, ctx)))

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Exactly n unpinned chunks, least recent first, none of ``protected``; None (and
        nothing changed) if there are fewer."""
        if n == 0:
            return []
        selected: list[tuple[tuple[Rank, OffloadKey], ChunkStatus]] = []
        chosen: set[OffloadKey] = set()
        deferred: list[tuple[Rank, OffloadKey]] = []
        while self._heap and len(selected) < n:
            entry = heapq.heappop(self._heap)
            rank, key = entry
            if key not in self._evictable or self._ranks.get(key) != rank or key in chosen:
                continue  # stale entry
            if key in protected:
                deferred.append(entry)
                continue
            selected.append((entry, self.chunks[key]))
            chosen.add(key)
        for entry in deferred:
            heapq.heappush(self._heap, entry)
        if len(selected) < n:
            for entry, _ in selected:
                heapq.heappush(self._heap, entry)
            return None
        out = []
        for (_, key), chunk in selected:
            self._evictable.remove(key)
            del self.chunks[key]
            del self._ranks[key]
            out.append((key, chunk))
        self._maybe_compact()
        return out

    def clear(self) -> None:
        self.chunks.clear()
        self._ranks.clear()
        self._evictable.clear()
        self._heap.clear()
        self._next_rank = 0
        self._generation += 1

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)
        heapq.heappush(self._heap, (self._ranks[key], key))
        self._maybe_compact()

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.remove(key)

    def check(self) -> None:
        assert set(self._ranks) == set(self.chunks), "LRU ranks and chunks disagree"
        assert self._evictable <= set(self.chunks), "an evictable key that is not cached"
        live = {(self._ranks[k], k) for k in self._evictable}
        assert live <= set(self._heap), "an evictable chunk missing from the heap"
