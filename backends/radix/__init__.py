"""SGLang's RadixCache (python/sglang/srt/mem_cache/radix_cache.py), 0.5.23 semantics."""

from prefixcache.backends.radix.backend import RadixPrefixCache, extra_key, mm_values, request_key
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import MatchResult, RadixCache
from prefixcache.backends.radix.tree import TreeNode

from prefixcache.eviction import POLICIES, make_policy

__all__ = [
    "POLICIES",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "RadixPrefixCache",
    "TreeNode",
    "make_policy",
    "mm_values",
    "extra_key",
    "request_key",
]
