"""prefixcache: vLLM's chained-hash blocks and SGLang's radix tree behind one interface."""

from prefixcache.config import CacheConfig
from prefixcache.interface import CacheStats, InvariantError, PageUsage, PrefixCache
from prefixcache.registry import available_backends, make_cache, register_backend
from prefixcache.request import MultiModalSpan, Request

__all__ = [
    "CacheConfig",
    "CacheStats",
    "InvariantError",
    "MultiModalSpan",
    "PageUsage",
    "PrefixCache",
    "Request",
    "available_backends",
    "make_cache",
    "register_backend",
]
__version__ = "0.1.0"
