"""vLLM 0.33's ``ARCCachePolicy`` (``kv_offload/cpu/policies/arc.py``): Adaptive Replacement.

T1 holds chunks used once, T2 chunks reused; B1 / B2 remember what was evicted from each.
A store that misses on a key in B1 grows T1's target (recency pays), one in B2 shrinks it.
A ready chunk a finished request reused moves T1 -> T2 (or to T2's MRU end); a chunk the
request only stored keeps its list and moves to its MRU end. Eviction takes T1's LRU end
while T1 is at or above target, else T2's, falling back to the other list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from prefixcache.backends.hashchain.offload.chunk import (
    ChunkStatus,
    OffloadKey,
    ReqContext,
    order_request_keys,
)


class ARCCachePolicy:
    name = "arc"

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self.target_t1_size = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, ctx: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> None:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._adapt_to_ghost_hit(key)

    def on_request_access(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        return

    def touch(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                # A chunk being stored was not used twice: it stays in T1, as MRU.
                (self.t2 if chunk.is_ready else self.t1)[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt_to_ghost_hit(key)

    def on_request_finished(
        self,
        keys: Sequence[OffloadKey],
        inserted_only: set[OffloadKey],
        reused: set[OffloadKey],
        ctx: ReqContext,
    ) -> None:
        for key in reversed(order_request_keys(keys, ctx)):
            if key in inserted_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        picked: list[tuple[OffloadKey, ChunkStatus, bool]] = []  # (key, chunk, from T1)
        virtual_t1 = len(self.t1)
        t1_iter, t2_iter = iter(self.t1.items()), iter(self.t2.items())

        def next_candidate(
            entries: Iterator[tuple[OffloadKey, ChunkStatus]],
        ) -> tuple[OffloadKey, ChunkStatus] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        for _ in range(n):
            found: tuple[OffloadKey, ChunkStatus, bool] | None = None
            if virtual_t1 >= int(self.target_t1_size):
                entry = next_candidate(t1_iter)
                if entry is not None:
                    found, virtual_t1 = (*entry, True), virtual_t1 - 1
            if found is None:
                entry = next_candidate(t2_iter)
                if entry is not None:
                    found = (*entry, False)
            if found is None:
                entry = next_candidate(t1_iter)
                if entry is None:
                    return None  # nothing changed yet
                found, virtual_t1 = (*entry, True), virtual_t1 - 1
            picked.append(found)
        out = []
        for key, chunk, from_t1 in picked:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return out

    def clear(self) -> None:
        for d in (self.t1, self.t2, self.b1, self.b2):
            d.clear()
        self.target_t1_size = 0.0

    def mark_evictable(self, key: OffloadKey) -> None:
        return

    def mark_non_evictable(self, key: OffloadKey) -> None:
        return

    def check(self) -> None:
        assert not set(self.t1) & set(self.t2), "a chunk in both T1 and T2"
        assert len(self.b1) <= self.cache_capacity and len(self.b2) <= self.cache_capacity, (
            "ghost lists overgrown"
        )
