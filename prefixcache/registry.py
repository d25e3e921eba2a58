"""Backends by name. Modules are imported only when a backend is made, so the core never
imports a backend (and a backend's heavy imports cost nothing until used)."""

from __future__ import annotations

import importlib
from typing import Any

import prefixcache.capabilities as capabilities
from prefixcache.config import CacheConfig
from prefixcache.interface import PrefixCache

_BACKENDS: dict[str, str] = {
    "none": "prefixcache.backends.none:NoCache",
    "hashchain": "prefixcache.backends.hashchain:HashChainCache",
    "radix": "prefixcache.backends.radix:make_radix_cache",
}


# Backends made by a function that picks one of several classes: the classes whose keywords
# the function passes on (what ``backend_classes`` reports).
_BUILDS: dict[str, tuple[str, ...]] = {
    "radix": (
        "prefixcache.backends.radix:RadixPrefixCache",
        "prefixcache.backends.radix.hicache_backend:HiCacheRadixPrefixCache",
    ),
}


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def backend_classes(name: str) -> list[Any]:
    """What ``make_cache(name, ...)`` may call with its options: the backend's class, or the
    classes its factory chooses between (ValueError for an unknown name)."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(available_backends())}")
    return [_load(t) for t in _BUILDS.get(name, (_BACKENDS[name],))]


def register_backend(name: str, target: str) -> None:
    """Register ``"package.module:ClassName"`` (or a function of the same call: config and
    keywords) under ``name`` (one line per new backend)."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:ClassName', got {target!r}")
    _BACKENDS[name] = target
    _BUILDS.pop(name, None)


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def make_cache(name: str, config: CacheConfig, **options: Any) -> PrefixCache:
    """Build backend ``name`` over ``config``; ``options`` are the backend's own keywords. A
    mix of layout, host tier and options the capability table refuses is a ValueError saying
    what that mix takes (prefixcache/capabilities.py)."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(available_backends())}") from None
    capabilities.check(name, config, options)
    return _load(target)(config, **options)  # type: ignore[no-any-return]
