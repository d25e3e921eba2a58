"""vLLM v1 automatic prefix caching: chained block hashes, a block pool and an LRU free queue.

Files follow the article's layers, named as vLLM names them: hashing (hash_block_tokens,
NONE_HASH, extra keys, BlockHasher), block (KVCacheBlock), free_queue (FreeKVCacheBlockQueue),
hash_map and block_pool (BlockPool), single_type_kv_cache_manager (FullAttentionManager,
SlidingWindowManager), mamba_manager (MambaManager, "align"), kv_cache_coordinator (Unitary /
Hybrid), kv_cache_planning (KV-cache groups and pool from a layout), kv_cache_manager
(KVCacheManager), and backend (HashChainCache, the PrefixCache adapter).
"""

from prefixcache.backends.hashchain.backend import HashChainCache
from prefixcache.backends.hashchain.hashing import HASH_FUNCTIONS, BlockHasher, get_hash_fn

__all__ = ["HASH_FUNCTIONS", "BlockHasher", "HashChainCache", "get_hash_fn"]
