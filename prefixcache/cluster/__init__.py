"""Many replicas behind a router: ``Cluster`` (simulator.py) and the routers (routers/)."""

from prefixcache.cluster.routers import ROUTERS, ReplicaState, Route, Router, available_routers, make_router
from prefixcache.cluster.simulator import Cluster, Replica, RouteRecord
from prefixcache.cluster.text import TokenText

__all__ = [
    "ROUTERS",
    "Cluster",
    "Replica",
    "ReplicaState",
    "Route",
    "RouteRecord",
    "Router",
    "TokenText",
    "available_routers",
    "make_router",
]
