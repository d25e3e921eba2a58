"""``KVCacheBlock``: the metadata of one physical KV block (vLLM ``kv_cache_utils.py``).

All blocks are created once by the BlockPool; the free queue threads its links through them,
so no Python object is created per allocation or free.
"""

from __future__ import annotations

from prefixcache.backends.hashchain.hashing import BlockHashWithGroupId


class KVCacheBlock:
    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(self, block_id: int, is_null: bool = False) -> None:
        self.block_id = block_id  # index in [0, num_blocks); 0 is the null block
        self.ref_cnt = 0  # running requests whose block table holds this block
        # Set only while the block is full and registered in the hash map (``assign_hash``).
        # vLLM's is a property whose setter checks; ours is a plain slot, read per block on
        # every allocation and free, and the one writer checks.
        self.block_hash: BlockHashWithGroupId | None = None
        # Only FreeKVCacheBlockQueue touches these; both None <=> not linked.
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = is_null  # placeholder block: never cached, freed or counted

    def assign_hash(self, block_hash: BlockHashWithGroupId) -> None:
        """vLLM's ``block_hash`` setter: a block holds one hash until ``reset_hash``."""
        if self.block_hash is not None:
            raise ValueError(f"block {self.block_id} already has a hash; reset_hash() it first")
        self.block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the hash (the block was evicted from the prefix cache)."""
        self.block_hash = None

    def __repr__(self) -> str:
        # Ids, not blocks, for the links: printing a block must not walk the whole queue.
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        cached = self.block_hash.hex()[:8] if self.block_hash else None
        return (
            f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}, hash={cached}, "
            f"prev={prev_id}, next={next_id})"
        )


class RankedKVCacheBlock(KVCacheBlock):
    """Ours: a block of a pool under a ranked eviction policy (hashchain/eviction.py), with
    what the policy reads and keeps. vLLM's own LRU order, the free queue, needs none of it:
    an LRU pool's blocks are plain ``KVCacheBlock``s (a pool of 10^7 blocks creates them all)."""

    __slots__ = (
        "num_tokens",
        "last_access_time",
        "creation_time",
        "hit_count",
        "priority",
        "depth",
        "parent",
        "parent_epoch",
        "epoch",
        "num_cached_children",
        "reuse_class",
        "credited",
        "tail_tokens",
        "ghost_hit",
        "policy_state",
    )

    def __init__(self, block_id: int, is_null: bool = False, num_tokens: int = 0) -> None:
        super().__init__(block_id, is_null)
        self.num_tokens = num_tokens  # the block size
        self.last_access_time = 0
        self.creation_time = 0
        self.hit_count = 0
        self.priority = 0
        self.depth = 0  # index in the block table of the request that cached it
        self.parent: RankedKVCacheBlock | None = None  # the cached block before it in that table
        self.parent_epoch = 0  # the parent's epoch then: a re-cached parent is a stranger
        self.epoch = 0  # advances each time the block is cached
        self.num_cached_children = 0  # cached blocks whose live parent this is
        self.reuse_class: tuple = ()  # lrp: the class of the request that last freed it
        self.credited = False  # lrp: a hit since then was counted
        self.tail_tokens = 0  # tlru: the freeing request's tokens after this block
        self.ghost_hit = False  # arc, s3fifo: its hash was in the ghost when cached
        self.policy_state: tuple | None = None  # wa: (stamp, hit_count, category)
