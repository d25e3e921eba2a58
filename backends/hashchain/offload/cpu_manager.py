"""vLLM 0.33's ``CPUOffloadingManager`` (``kv_offload/cpu/manager.py``): the CPU chunk pool,
ref counts and the store / load protocol; a policy (LRU or ARC) orders and evicts.

    lookup         MISS / HIT / HIT_PENDING (stored, store not acknowledged)
    prepare_load   pins ready chunks (ref_cnt += 1) for a load; complete_load unpins
    prepare_store  keys not yet cached get fresh chunks (ref_cnt -1: not readable), evicting
                   unpinned chunks if the pool is full; None if that is impossible (the store
                   is dropped); ``store_threshold`` >= 2: only keys offered that many times
    complete_store the store is acknowledged: ref_cnt 0, readable and evictable
Recency is committed per request (``on_request_finished``), never by a lookup.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from prefixcache.backends.hashchain.offload.arc_manager import ARCCachePolicy
from prefixcache.backends.hashchain.offload.chunk import ChunkStatus, LookupResult, OffloadKey, ReqContext
from prefixcache.backends.hashchain.offload.lru_manager import LRUCachePolicy

POLICIES = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}
MAX_TRACKER_SIZE = 64_000  # vLLM's max_tracker_size default (store_threshold's offer counts)


@dataclass(slots=True)
class PrepareStoreOutput:
    keys_to_store: list[OffloadKey]
    chunk_ids: list[int]  # where each goes (vLLM's CPULoadStoreSpec)
    evicted_keys: list[OffloadKey]


class CPUOffloadingManager:
    def __init__(self, num_chunks: int, cache_policy: str = "lru", store_threshold: int = 0) -> None:
        if cache_policy not in POLICIES:
            raise ValueError(f"unknown host eviction_policy {cache_policy!r}; valid: {', '.join(POLICIES)}")
        self.num_chunks = num_chunks
        self.policy: LRUCachePolicy | ARCCachePolicy = POLICIES[cache_policy](num_chunks)
        self._num_allocated = 0  # chunk ids handed out fresh so far (0 .. num_chunks)
        self._free_list: list[int] = []  # ids freed by evictions, reused last-in first-out
        self.num_evictable = 0  # ref_cnt == 0
        self.num_write_pending = 0  # ref_cnt == -1
        self.store_threshold = store_threshold
        self.counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None

    # ---------------------------------------------------------------- chunk pool
    def num_free_chunks(self) -> int:
        return len(self._free_list) + self.num_chunks - self._num_allocated

    def _allocate(self, n: int) -> list[int]:
        fresh = min(n, self.num_chunks - self._num_allocated)
        ids = list(range(self._num_allocated, self._num_allocated + fresh))
        self._num_allocated += fresh
        ids += [self._free_list.pop() for _ in range(n - fresh)]
        return ids

    # ---------------------------------------------------------------- per request
    def _record_access(
        self, keys: Iterable[OffloadKey], ctx: ReqContext, reused: Collection[OffloadKey] = ()
    ) -> None:
        new = [k for k in keys if k not in ctx.seen]
        assert not (new and ctx.finished), "new keys observed after the request finished"
        ctx.seen.update(new)
        ctx.seen_keys += new
        if new:
            self.policy.on_request_access(new, ctx)
        # Re-reading a chunk this request inserted is not a second access.
        ctx.reused_keys.update(k for k in reused if k not in ctx.inserted_keys)

    def _record_offers(self, keys: list[OffloadKey]) -> None:
        """store_threshold: count each offer; the table forgets its LRU entries past its size."""
        assert self.counts is not None
        protected = set()
        for key in keys:
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
                protected.add(key)
        num_unprotected = len(self.counts) - len(protected)
        for key in keys:
            if key in self.counts:
                continue
            if len(self.counts) >= MAX_TRACKER_SIZE:
                if num_unprotected == 0:
                    continue
                self.counts.popitem(last=False)
                num_unprotected -= 1
            self.counts[key] = 1

    # ---------------------------------------------------------------- the protocol
    def lookup(self, key: OffloadKey) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: list[OffloadKey], ctx: ReqContext) -> list[int]:
        ids = []
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.is_ready, f"load of a chunk not ready: {key!r}"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
            ids.append(chunk.chunk_id)
        self._record_access(keys, ctx, reused=keys)
        return ids

    def complete_load(self, keys: Iterable[OffloadKey]) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0, f"complete_load of an unpinned chunk {key!r}"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(self, keys: list[OffloadKey], ctx: ReqContext) -> PrepareStoreOutput | None:
        if self.counts is not None:
            self._record_offers(keys)
        to_store: list[OffloadKey] = []
        ready_existing: list[OffloadKey] = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                ready_existing.append(key)
        if self.counts is not None:
            to_store = [k for k in to_store if self.counts.get(k, 0) >= self.store_threshold]
        misses = [k for k in to_store if k not in ctx.store_miss_keys]
        if misses:
            self.policy.on_store_miss(misses, ctx)  # ARC learns from its ghost lists here
            ctx.store_miss_keys.update(misses)
        recorded = set(to_store) | set(ready_existing)
        self._record_access((k for k in keys if k in recorded), ctx, reused=ready_existing)
        if not to_store:
            return PrepareStoreOutput([], [], [])
        num_to_evict = len(to_store) - self.num_free_chunks()
        evicted: list[OffloadKey] = []
        if num_to_evict > 0:
            if num_to_evict > self.num_evictable:
                return None
            # A chunk of this very offer stays cached.
            victims = self.policy.evict(num_to_evict, set(keys))
            if victims is None:
                return None
            self.num_evictable -= len(victims)
            for key, chunk in victims:
                self._free_list.append(chunk.chunk_id)
                evicted.append(key)
        ids = self._allocate(len(to_store))
        for key, chunk_id in zip(to_store, ids, strict=True):
            self.policy.insert(key, ChunkStatus(chunk_id), ctx)
        self.num_write_pending += len(to_store)
        ctx.inserted_keys.update(to_store)
        return PrepareStoreOutput(to_store, ids, evicted)

    def complete_store(self, keys: Iterable[OffloadKey]) -> list[OffloadKey]:
        """The store is acknowledged; returns the keys that became readable."""
        done = []
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is not None and not chunk.is_ready:
                chunk.ref_cnt = 0
                self.num_write_pending -= 1
                self.num_evictable += 1
                self.policy.mark_evictable(key)
                done.append(key)
        return done

    def on_request_finished(self, ctx: ReqContext) -> None:
        if ctx.finished:
            return
        ctx.finished = True
        self.policy.on_request_finished(
            ctx.seen_keys, ctx.inserted_keys - ctx.reused_keys, ctx.reused_keys, ctx
        )

    def reset_cache(self) -> None:
        self.policy.clear()
        self.num_evictable = self.num_write_pending = 0
        self._free_list.clear()
        self._num_allocated = 0

    # ---------------------------------------------------------------- accounting
    def chunk_statuses(self) -> list[ChunkStatus]:
        if isinstance(self.policy, LRUCachePolicy):
            return list(self.policy.chunks.values())
        return [*self.policy.t1.values(), *self.policy.t2.values()]

    def check_invariants(self) -> None:
        chunks = self.chunk_statuses()
        ids = [c.chunk_id for c in chunks] + self._free_list
        assert len(ids) == len(set(ids)) == self._num_allocated, "a CPU chunk id lost or held twice"
        assert all(0 <= i < self.num_chunks for i in ids), "a CPU chunk id out of range"
        assert self.num_evictable == sum(1 for c in chunks if c.ref_cnt == 0), "num_evictable is off"
        assert self.num_write_pending == sum(1 for c in chunks if c.ref_cnt == -1), "num_write_pending is off"
        self.policy.check()
