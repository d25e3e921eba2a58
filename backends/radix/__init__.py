"""SGLang's radix cache (``mem_cache/unified_radix_cache.py``), 0.5.23 semantics: one tree with
FULL and the layout's component (SWA or MAMBA) as 0.5.23's ``mem_cache/registry.py`` picks it
(backend.py), HiCache's host tier on top (hicache_backend.py)."""

from typing import Any

from prefixcache.backends.radix.backend import RadixPrefixCache
from prefixcache.backends.radix.key import RadixKey, extra_key, mm_values, request_key
from prefixcache.backends.radix.radix_cache import MatchResult, RadixCache
from prefixcache.backends.radix.tree import TreeNode

from prefixcache import capabilities
from prefixcache.config import CacheConfig
from prefixcache.eviction import POLICIES, make_policy
from prefixcache.interface import PrefixCache


def make_radix_cache(config: CacheConfig, **options: Any) -> PrefixCache[Any]:
    """The cache ``make_cache("radix", config)`` builds: ``RadixPrefixCache``, whose tree takes
    the layout's component; ``host_tier=HostTierConfig(...)`` (not None) gets SGLang 0.5.23's
    HiCache on top (hicache_backend.py; full attention only). A mix the capability table
    refuses is a ValueError saying what it takes."""
    capabilities.check("radix", config, options)
    if options.get("host_tier") is not None:
        from prefixcache.backends.radix.hicache_backend import HiCacheRadixPrefixCache

        return HiCacheRadixPrefixCache(config, **options)
    options.pop("host_tier", None)
    return RadixPrefixCache(config, **options)

__all__ = [
    "POLICIES",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "RadixPrefixCache",
    "TreeNode",
    "make_policy",
    "make_radix_cache",
    "mm_values",
    "extra_key",
    "request_key",
]
