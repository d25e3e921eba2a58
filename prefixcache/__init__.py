"""prefixcache: vLLM's chained-hash blocks and SGLang's radix tree behind one interface."""

from prefixcache.capabilities import eviction_policies
from prefixcache.config import CacheConfig
from prefixcache.cost_model import CostModel
from prefixcache.engine import Engine
from prefixcache.eviction import load_policy_spec, register_policy
from prefixcache.interface import (
    CacheStats,
    KVGroup,
    LiveRequest,
    Match,
    PageUsage,
    PrefixCache,
)
from prefixcache.invariants import InvariantError
from prefixcache.layout import PRESETS as LAYOUT_PRESETS
from prefixcache.layout import LayerSpec, ModelLayout
from prefixcache.records import RequestRecord
from prefixcache.registry import available_backends, make_cache, register_backend
from prefixcache.request import MultiModalSpan, Request
from prefixcache.roofline import RooflineClock
from prefixcache.scheduler import Schedule, Scheduler, available_schedulers, make_scheduler
from prefixcache.synthesis import hashes_to_token_ids, simulated_tokens

__all__ = [
    "CacheConfig",
    "CacheStats",
    "CostModel",
    "Engine",
    "InvariantError",
    "KVGroup",
    "LAYOUT_PRESETS",
    "LayerSpec",
    "LiveRequest",
    "Match",
    "ModelLayout",
    "MultiModalSpan",
    "PageUsage",
    "PrefixCache",
    "Request",
    "RequestRecord",
    "RooflineClock",
    "Schedule",
    "Scheduler",
    "available_backends",
    "available_schedulers",
    "eviction_policies",
    "hashes_to_token_ids",
    "load_policy_spec",
    "make_cache",
    "make_scheduler",
    "register_backend",
    "register_policy",
    "simulated_tokens",
]
__version__ = "0.1.0"
