"""SGLang's RadixCache (python/sglang/srt/mem_cache/radix_cache.py), 0.5.23 semantics; for a
hybrid layout, its UnifiedRadixCache with the SWA component (swa_backend.py) or the Mamba
component (mamba_backend.py), as 0.5.23's ``mem_cache/registry.py`` picks them."""

from typing import Any

from prefixcache.backends.radix.backend import RadixPrefixCache
from prefixcache.backends.radix.key import RadixKey, extra_key, mm_values, request_key
from prefixcache.backends.radix.radix_cache import MatchResult, RadixCache
from prefixcache.backends.radix.swa_backend import SWARadixPrefixCache
from prefixcache.backends.radix.tree import TreeNode

from prefixcache import capabilities
from prefixcache.config import CacheConfig
from prefixcache.eviction import POLICIES, make_policy
from prefixcache.interface import PrefixCache


def make_radix_cache(config: CacheConfig, **options: Any) -> PrefixCache[Any]:
    """The cache ``make_cache("radix", config)`` builds: a layout with Mamba layers gets the
    Mamba cache (which refuses sliding-window layers beside them, as we do not model FULL +
    SWA + MAMBA), one with sliding-window layers the SWA cache, every other the dense
    RadixCache, byte-for-byte as before layouts existed. ``host_tier=HostTierConfig(...)``
    (not None) gets SGLang 0.5.23's HiCache (hicache_backend.py; full attention only). A mix
    the capability table refuses is a ValueError saying what it takes."""
    capabilities.check("radix", config, options)
    if options.get("host_tier") is not None:
        from prefixcache.backends.radix.hicache_backend import HiCacheRadixPrefixCache

        return HiCacheRadixPrefixCache(config, **options)
    options.pop("host_tier", None)
    if config.is_hybrid and config.model_layout.count("mamba"):
        from prefixcache.backends.radix.mamba_backend import MambaRadixPrefixCache

        return MambaRadixPrefixCache(config, **options)
    if config.is_hybrid:
        return SWARadixPrefixCache(config, **options)
    return RadixPrefixCache(config, **options)

__all__ = [
    "POLICIES",
    "MatchResult",
    "RadixCache",
    "RadixKey",
    "RadixPrefixCache",
    "SWARadixPrefixCache",
    "TreeNode",
    "make_policy",
    "make_radix_cache",
    "mm_values",
    "extra_key",
    "request_key",
]
