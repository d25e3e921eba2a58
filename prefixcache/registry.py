"""Backends by name. Modules are imported only when a backend is made, so the core never
imports a backend (and a backend's heavy imports cost nothing until used)."""

from __future__ import annotations

import importlib
from typing import Any

from prefixcache.config import CacheConfig
from prefixcache.interface import PrefixCache

_BACKENDS: dict[str, str] = {
    "none": "prefixcache.backends.none:NoCache",
    "hashchain": "prefixcache.backends.hashchain:HashChainCache",
    "radix": "prefixcache.backends.radix:make_radix_cache",
}


def register_backend(name: str, target: str) -> None:
    """Register ``"package.module:ClassName"`` (or a function of the same call: config and
    keywords) under ``name`` (one line per new backend)."""
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:ClassName', got {target!r}")
    _BACKENDS[name] = target


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def make_cache(name: str, config: CacheConfig, **options: Any) -> PrefixCache:
    """Build backend ``name`` over ``config``; ``options`` are the backend's own keywords."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(available_backends())}") from None
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config, **options)  # type: ignore[no-any-return]
