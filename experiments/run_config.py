"""One run configuration for the CLI, its sweeps and the studies.

``RunConfig`` is what one run of one cache over one request stream is made of: the cache
(backend, pool, page size, layout, the backend's options) and the engine (scheduler, token
budget, seed, clock). It checks itself when made (``__post_init__``), each error saying what
is wrong and what is allowed, so a bad setting fails before any work; it builds the cache
(``make_cache``) and runs requests through the engine (``run``) the same way for every caller.

Each caller keeps its own JSON form of a run, whose content names the run's folder (those
folders and their files are committed results, so their names and bytes stay as they were):
the CLI's (``full_config``: DEFAULTS, resolved and checked; ``run_config`` reads it) and the
studies' cells (experiments/figures/common.py ``cell_config``).
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixcache import (
    CacheConfig,
    Engine,
    PrefixCache,
    RequestRecord,
    available_backends,
    capabilities,
    make_cache,
)
from prefixcache.cost_model import Clock, named_clock
from prefixcache.scheduler import check_scheduler, order_for

DEFAULTS: dict[str, Any] = {
    "workload": "multi-turn-chat",
    "trace": None,
    "limit": None,
    "backend": "hashchain",
    "scheduler": "fcfs",
    "capacity_tokens": 16384,
    "page_size": 16,
    "token_budget": 2048,
    "seed": 0,
    "eviction_policy": None,  # None: the backend's default (lru), written out when resolved
    "layout": None,  # a ModelLayout preset or a list of layers; None: one full-attention layer
    "arrival_scale": 1.0,  # arrival times x this, counted from the first (0.5: twice the load)
    "params": {},
    "options": {},  # the backend's own keywords (make_cache), e.g. {"use_eagle": true}
    "host_tier": None,  # HostTierConfig fields (prefixcache.tiers) or None: no host tier
    "clock": "cpu",  # the simulated clock: cpu (measured) or a GPU roofline (cost_model.named_clock)
}
OWN_KEYS = ("eviction_policy", "layout")
INTERNAL_OPTIONS = ("host_tier", "known_prompt_hashes", "clock", "attention_groups")
POWERS_OF_TWO_NOTE = (
    "vLLM's --block-size takes 1, 8, 16, 32, 64, 128 or 256 (vllm/config/cache.py BlockSize) "
    "and SGLang's kernels are built for power-of-two pages"
)


@dataclass(frozen=True)
class RunConfig:
    """One run: the cache and the engine that serve a request stream.

    options:  the backend's keywords (``make_cache``), ``eviction_policy`` and ``host_tier``
              (a ``HostTierConfig``) included; what the backend takes over the layout is
              prefixcache/capabilities.py's table, checked here.
    layout:   a ``prefixcache.layout`` preset name or a list of layers; None: one full layer.
    scheduler: an online scheduler or an offline order (``prefixcache.scheduler.scheduler_names``).
    clock:    the engine's cost model; None: the one measured on the CPU.
    """

    backend: str
    capacity_tokens: int
    page_size: int
    layout: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    scheduler: str = "fcfs"
    token_budget: int = 2048
    seed: int = 0
    clock: Clock | None = None

    def __post_init__(self) -> None:
        if self.backend not in available_backends():
            raise ValueError(f"unknown backend {self.backend!r}; valid: {', '.join(available_backends())}")
        check_scheduler(self.scheduler)
        for key in ("capacity_tokens", "page_size", "token_budget"):
            _check_int(key, getattr(self, key), minimum=1)
        _check_int("seed", self.seed, minimum=0)
        # the pool's and the layout's own errors, then what the backend takes over the layout
        capabilities.check(self.backend, self.cache_config(), self.options)

    def cache_config(self) -> CacheConfig:
        return CacheConfig(self.capacity_tokens, self.page_size, layout=self.layout)

    def make_cache(self, **internal: Any) -> PrefixCache:
        """The run's cache; ``internal``: keywords that are not settings (a trace's store of
        prompt block hashes). The dense radix cache counts instead of reading wall time, so the
        same run always breaks LRU ties the same way (its hybrid caches count already, as
        SGLang's get_and_increase_time_counter)."""
        config = self.cache_config()
        options = {**self.options, **internal}
        if self.backend == "radix" and not config.is_hybrid:
            options.setdefault("clock", itertools.count().__next__)
        try:
            return make_cache(self.backend, config, **options)
        except TypeError as e:  # an option of the wrong kind
            raise ValueError(f"{self.backend}: {e}") from None

    def run(
        self, cache: PrefixCache, requests: Any, *, progress: bool = False, total: int | None = None
    ) -> tuple[list[RequestRecord], Engine]:
        """``requests`` through the engine over ``cache``, in the scheduler's order (an offline
        order sorts them all first): the records and the engine, for its counters."""
        requests, scheduler = order_for(requests, self.scheduler)
        engine = Engine(cache, scheduler, self.token_budget, seed=self.seed, cost_model=self.clock)
        return engine.run(requests, progress=progress, total=total), engine


def run_config(cfg: dict[str, Any]) -> RunConfig:
    """The run a CLI or sweep config (``full_config``'s form) describes."""
    tier = host_tier_of(cfg)
    options = dict(cfg["options"]) | ({} if tier is None else {"host_tier": tier})
    if cfg["eviction_policy"] is not None:
        options["eviction_policy"] = cfg["eviction_policy"]
    if not isinstance(cfg["clock"], str):
        raise ValueError(f"clock must be a name (cpu, h100-llama3-8b, ...), got {cfg['clock']!r}")
    return RunConfig(
        cfg["backend"],
        cfg["capacity_tokens"],
        cfg["page_size"],
        layout=cfg["layout"],
        options=options,
        scheduler=cfg["scheduler"],
        token_budget=cfg["token_budget"],
        seed=cfg["seed"],
        clock=named_clock(cfg["clock"]),  # ValueError listing the valid names
    )


def full_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every setting of a CLI or sweep run, checked and resolved (an explicit default is the
    default), so that equal results have equal configs; ValueError listing the valid values,
    before any work."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; valid: {sorted(DEFAULTS)}")
    if overrides.get("trace") and overrides.get("workload"):
        raise ValueError("give a --trace or a --workload, not both")
    cfg = {**DEFAULTS, **overrides}
    cfg["options"] = _own_keys_out_of_options(cfg, overrides)
    if cfg["limit"] is not None:
        _check_int("limit", cfg["limit"], minimum=1, note=" (leave it out for every request)")
    cfg["arrival_scale"] = _arrival_scale(cfg["arrival_scale"])
    cfg["layout"] = _layout(cfg["layout"])
    cfg["eviction_policy"] = _eviction_policy(cfg["backend"], cfg["eviction_policy"])
    _check_option_names(cfg["backend"], cfg["options"])
    run_config(cfg)  # the run's own checks: backend, scheduler, sizes, layout, clock, host tier, options
    if cfg["page_size"] & (cfg["page_size"] - 1):
        warnings.warn(f"page size {cfg['page_size']} is not a power of two: {POWERS_OF_TWO_NOTE}; "
                      "the run models neither engine as deployed", stacklevel=2)
    if cfg["trace"]:
        if cfg["params"]:
            raise ValueError(f"--param sets workload parameters; a trace takes none (got {cfg['params']})")
        from prefixcache.experiments.inputs.traces import resolve

        trace = resolve(cfg["trace"])
        if not trace.exists():
            raise FileNotFoundError(f"trace {cfg['trace']} does not exist")
        if not trace.is_file():
            raise ValueError(f"trace {cfg['trace']} is not a file")
        cfg["workload"] = None  # the trace is the source: config.json must not name a workload
    else:
        from prefixcache.experiments.inputs.workloads import make_workload

        make_workload(cfg["workload"], **cfg["params"])
    return cfg


def _check_int(key: str, value: object, *, minimum: int, note: str = "") -> None:
    """ValueError naming the setting as the command line spells it (--capacity-tokens)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        flag = "--" + key.replace("_", "-")
        raise ValueError(f"{flag} must be an int >= {minimum}{note}, got {value!r}")


def _arrival_scale(value: object) -> float:
    from prefixcache.experiments.inputs.traces import check_arrival_scale

    return check_arrival_scale(value, "--arrival-scale")


def _own_keys_out_of_options(cfg: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The options without those that have a key of their own (moved to that key)."""
    options = dict(cfg["options"] or {})
    for key in OWN_KEYS:
        if key in options:
            value = options.pop(key)
            if overrides.get(key) is not None and overrides[key] != value:
                raise ValueError(f"{key} is given twice: {overrides[key]!r} and option {value!r}")
            cfg[key] = value
    if "host_tier" in options:
        raise ValueError("a host tier is set by the --host-* flags (a [host_tier] section), not an option")
    return options


def _layout(layout: Any) -> Any:
    """A layout as config.json keeps it: a preset name, or a list of layer lists."""
    if layout is None or isinstance(layout, str):
        return layout
    if isinstance(layout, (list, tuple)):
        return [list(layer) if isinstance(layer, (list, tuple)) else layer for layer in layout]
    raise ValueError(f"layout must be a preset name or a list of layers, got {layout!r}")


def _eviction_policy(backend: str, name: Any) -> str | None:
    """The policy's resolved name (lru when none is given), or None for a backend without one
    (whether the backend takes it over the layout: RunConfig's check, from the table)."""
    if backend not in available_backends():
        return name  # RunConfig names the unknown backend
    if backend not in capabilities.BACKENDS_WITH_POLICIES:
        if name is not None:
            raise ValueError(f"backend {backend!r} takes no eviction policy; "
                             f"those that do: {', '.join(capabilities.BACKENDS_WITH_POLICIES)}")
        return None
    if name is None:
        return "lru"
    if not isinstance(name, str):
        raise ValueError(f"eviction policy must be a name, got {name!r}")
    if ":" in name:
        from prefixcache.eviction import load_policy_spec

        return load_policy_spec(name)  # a user's own class, "package.module:Class"
    return name.lower()


def option_names(backend: str) -> list[str] | None:
    """The keywords ``make_cache(backend, ...)`` takes that are settings of a run (None when
    a registered backend takes any keyword: then the backend itself judges them)."""
    from prefixcache.registry import backend_classes

    names: set[str] = set()
    for cls in backend_classes(backend):
        params = inspect.signature(cls).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        names.update(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    return sorted(names - set(INTERNAL_OPTIONS) - set(OWN_KEYS))


def _check_option_names(backend: str, options: dict[str, Any]) -> None:
    valid = option_names(backend)
    if valid is None:
        return
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"backend {backend!r} takes no option {', '.join(unknown)}; "
                         f"valid: {', '.join(valid) or 'none'}")


def host_tier_of(cfg: dict[str, Any]) -> Any:
    """The config's HostTierConfig, or None. A tier needs a size: the other fields alone
    (a host eviction policy, say) are an error, not a tier of the default size."""
    from prefixcache.tiers import HostTierConfig

    tier = cfg["host_tier"]
    if tier is None:
        return None
    if not isinstance(tier, dict):
        raise ValueError(f"host_tier must be a table of HostTierConfig fields, got {tier!r}")
    if tier.get("capacity_tokens") is None and tier.get("ratio") is None:
        given = ", ".join(sorted(tier)) or "nothing"
        raise ValueError(f"a host tier needs a size, --host-tokens or --host-ratio "
                         f"(capacity_tokens or ratio); got {given}")
    try:
        return HostTierConfig(**tier)
    except TypeError as e:  # an unknown field
        raise ValueError(f"host_tier: {e}") from None
