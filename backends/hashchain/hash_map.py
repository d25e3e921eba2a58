"""``BlockHashToBlockMap``: the prefix-cache index of the BlockPool (vLLM ``block_pool.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.hashing import BlockHashWithGroupId

from prefixcache.interface import ensure


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

    def insert_many(self, keys: Iterable[BlockHashWithGroupId], blocks: Iterable[KVCacheBlock]) -> None:
        """``insert(k, b)`` for each pair: one C call per block unless the key is taken."""
        cache = self._cache
        setdefault = cache.setdefault
        for key, block in zip(keys, blocks, strict=True):
            entry = setdefault(key, block)
            if entry is block:
                self.version += 1
                continue
            if isinstance(entry, KVCacheBlock):
                cache[key] = {entry.block_id: entry, block.block_id: block}
                self.num_duplicated_keys += 1
            else:
                entry[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove only block ``block_id`` from ``key``; None if it is not there."""
        block = self._pop(key, block_id)
        if block is not None:
            self.version += 1
        return block

    def evict_hashed(self, blocks: Iterable[KVCacheBlock]) -> int:
        """Remove every block of ``blocks`` that carries a hash from the map and forget that
        hash (one C ``dict.pop`` per block for the allocation path, measured against ``pop``
        per block in tests/bench); returns how many had one. Raises InvariantError if a
        hashed block is not in the map."""
        cache = self._cache
        evicted = 0
        for block in blocks:
            key = block.block_hash
            if key is None:
                continue
            entry = cache.pop(key, None)
            if entry is not block:  # a duplicated key, or a broken map: the general path
                if entry is not None:
                    cache[key] = entry
                popped = self._pop(key, block.block_id)
                ensure(popped is block, f"block {block.block_id} has a hash but is not in the map")
            block.reset_hash()
            evicted += 1
        self.version += evicted
        return evicted

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
