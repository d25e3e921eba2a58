"""``BlockHashToBlockMap``: the prefix-cache index of the BlockPool (vLLM ``block_pool.py``)."""

from __future__ import annotations

from collections.abc import Iterator

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.hashing import BlockHashWithGroupId


class BlockHashToBlockMap:
    """key -> one block, or {block_id: block} when several physical blocks hold it.

    No de-duplication: block tables stay append-only (a block id once handed to a request is
    never rewritten), so two requests that computed the same block both keep theirs.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The first inserted block under ``key`` (dicts keep insertion order)."""
        entry = self._cache.get(key)
        if entry is None or isinstance(entry, KVCacheBlock):
            return entry
        return next(iter(entry.values()))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        entry = self._cache.get(key)
        if entry is None:
            self._cache[key] = block
        elif isinstance(entry, KVCacheBlock):
            self._cache[key] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove only block ``block_id`` from ``key``; None if it is not there."""
        entry = self._cache.get(key)
        if entry is None:
            return None
        if isinstance(entry, KVCacheBlock):
            if entry.block_id != block_id:
                return None
            del self._cache[key]
            return entry
        block = entry.pop(block_id, None)
        if not entry:
            del self._cache[key]
        elif len(entry) == 1:
            self._cache[key] = next(iter(entry.values()))
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
        self._cache.clear()
