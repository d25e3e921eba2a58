"""``BlockHashToBlockMap``: the prefix-cache index of the BlockPool (vLLM ``block_pool.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import attrgetter, is_

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.hashing import BlockHashWithGroupId

from prefixcache.interface import ensure

_block_hash = attrgetter("block_hash")


class BlockHashToBlockMap:
    """key -> one block, or {block_id: block} when several physical blocks hold it.

    No de-duplication: block tables stay append-only (a block id once handed to a request is
    never rewritten), so two requests that computed the same block both keep theirs.
    """

    __slots__ = ("_cache", "num_duplicated_keys", "version")

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        # Keys whose entry is a dict (>= 2 blocks). Ours: lets longest_prefix skip the
        # per-block unwrapping in the common case of no duplicates.
        self.num_duplicated_keys = 0
        # Ours: grows whenever a lookup could find other blocks (a key added, a block removed);
        # a match taken at the same version still holds. A duplicate changes no lookup.
        self.version = 0

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The first inserted block under ``key`` (dicts keep insertion order)."""
        entry = self._cache.get(key)
        if entry is None or isinstance(entry, KVCacheBlock):
            return entry
        return next(iter(entry.values()))

    def longest_prefix(
        self, keys: Sequence[BlockHashWithGroupId], limit: int, start: int = 0
    ) -> list[KVCacheBlock]:
        """``[get_one_block(k) for k in keys[start:limit]]`` up to the first miss, without a
        Python step per key: dict lookups run in C (``map``) over chunks that double in size,
        so a miss costs at most as many extra lookups as there were hits (plus the first chunk).
        """
        get = self._cache.get
        found: list[KVCacheBlock | dict[int, KVCacheBlock] | None] = []
        chunk, end = 16, min(limit, len(keys))
        while start < end:
            entries = list(map(get, keys[start : min(start + chunk, end)]))
            if None in entries:
                found += entries[: entries.index(None)]
                break
            found += entries
            start += chunk
            chunk *= 2
        if self.num_duplicated_keys:
            return [e if isinstance(e, KVCacheBlock) else next(iter(e.values())) for e in found]  # type: ignore[union-attr]
        return found  # type: ignore[return-value]

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        self.insert_many((key,), (block,))

    def insert_many(self, keys: Sequence[BlockHashWithGroupId], blocks: Sequence[KVCacheBlock]) -> None:
        """``insert(k, b)`` for each pair: the dict's own ``setdefault`` over all of them in C,
        then a Python step only for the keys that were taken already (duplicates)."""
        if len(keys) != len(blocks):
            raise ValueError(f"{len(keys)} keys for {len(blocks)} blocks")
        cache = self._cache
        entries: list[KVCacheBlock | dict[int, KVCacheBlock]] = list(map(cache.setdefault, keys, blocks))
        added = len(keys)
        if not all(map(is_, entries, blocks)):
            for key, block, entry in zip(keys, blocks, entries, strict=True):
                if entry is block:
                    continue
                added -= 1
                if isinstance(entry, KVCacheBlock):
                    cache[key] = {entry.block_id: entry, block.block_id: block}
                    self.num_duplicated_keys += 1
                else:
                    entry[block.block_id] = block
        self.version += added

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove only block ``block_id`` from ``key``; None if it is not there."""
        block = self._pop(key, block_id)
        if block is not None:
            self.version += 1
        return block

    def evict_hashed(self, blocks: Sequence[KVCacheBlock]) -> int:
        """Remove every block of ``blocks`` that carries a hash from the map and forget that
        hash; returns how many had one. Raises InvariantError if a hashed block is not in the
        map. With no duplicated key each map entry is a block, so the pops run in C (``map``)
        and are checked after; else each goes through ``_pop``."""
        hashed = [b for b in blocks if b.block_hash is not None]
        if not hashed:
            return 0
        if self.num_duplicated_keys:
            for block in hashed:
                popped = self._pop(block.block_hash, block.block_id)  # type: ignore[arg-type]
                ensure(popped is block, f"block {block.block_id} has a hash but is not in the map")
        else:
            popped_blocks = list(map(self._cache.pop, map(_block_hash, hashed), repeat(None)))
            if not all(map(is_, popped_blocks, hashed)):
                bad = next(b for b, p in zip(hashed, popped_blocks, strict=True) if p is not b)
                ensure(False, f"block {bad.block_id} has a hash but is not in the map")
        for block in hashed:
            block.block_hash = None
        self.version += len(hashed)
        return len(hashed)

    def _pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        if isinstance(entry, KVCacheBlock):
            if entry.block_id != block_id:
                return None
            del self._cache[key]
            return entry
        block = entry.pop(block_id, None)
        if len(entry) == 1:  # a dict holds >= 2 blocks, so one pop leaves >= 1
            self._cache[key] = next(iter(entry.values()))
            self.num_duplicated_keys -= 1
        return block

    def items(self) -> Iterator[tuple[BlockHashWithGroupId, KVCacheBlock]]:
        """Every (key, block) pair, duplicates included."""
        for key, entry in self._cache.items():
            if isinstance(entry, KVCacheBlock):
                yield key, entry
            else:
                for block in entry.values():
                    yield key, block

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self.version += 1
        self._cache.clear()
        self.num_duplicated_keys = 0
