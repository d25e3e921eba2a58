"""Routers by name, each a small module after the system it models (see each docstring)."""

from __future__ import annotations

from typing import Any

from prefixcache.cluster.routers.base import ReplicaState, Route, Router
from prefixcache.cluster.routers.dynamo import DynamoKV
from prefixcache.cluster.routers.llmd import LLMD
from prefixcache.cluster.routers.preble import PrebleE2
from prefixcache.cluster.routers.production_stack import ProductionStackPrefixAware
from prefixcache.cluster.routers.ray_serve import RayServePrefixAffinity
from prefixcache.cluster.routers.sglang import SGLangCacheAware
from prefixcache.cluster.routers.simple import Oracle, RoundRobin, SessionAffinity

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobin, SessionAffinity, SGLangCacheAware, DynamoKV, LLMD, ProductionStackPrefixAware,
                RayServePrefixAffinity, PrebleE2, Oracle)
}


def available_routers() -> list[str]:
    return sorted(ROUTERS)


def make_router(name: str, num_replicas: int, **options: Any) -> Router:
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; valid: {', '.join(available_routers())}") from None
    return cls(num_replicas, **options)


__all__ = ["ROUTERS", "ReplicaState", "Route", "Router", "available_routers", "make_router"]
