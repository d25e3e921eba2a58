"""vLLM v1 automatic prefix caching: chained block hashes, a block pool and an LRU free queue.

Files follow the article's layers: hashing (hash_block_tokens, NONE_HASH, extra keys), block
(KVCacheBlock), free_queue (FreeKVCacheBlockQueue), block_pool (BlockPool), manager
(KVCacheManager), cache (the PrefixCache adapter).
"""

from prefixcache.backends.hashchain.cache import HashChainCache

__all__ = ["HashChainCache"]
