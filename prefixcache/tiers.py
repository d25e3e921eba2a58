"""A host-memory (CPU) tier under the device pool: its configuration, the object a cache is
given for it (``HostTier``), and its link.

Both designs keep copies of device KV in host memory and load them back on a hit, but they
key, store and load differently (REFERENCE-tiers.md): vLLM's OffloadingConnector stores
chunks of ``block_size`` tokens keyed by the chained block hash as blocks fill, and loads
them asynchronously (compute starts a step later); SGLang's HiCache backs up radix-tree nodes
on a hit-count threshold or at eviction, and loads them at admission, overlapped layer by
layer with the same forward pass. One ``HostTierConfig`` describes either; a field left None
takes the design's own default, and a field the design has no use for must stay None.

A cache made with a tier exposes it as ``PrefixCache.host_tier`` (None without one), as vLLM's
scheduler is given a KV connector: the engine reads it once and calls it only when it exists,
so a cache without a tier pays nothing for the option.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from prefixcache.config import check_positive_int
from prefixcache.invariants import check_usage
from prefixcache.pool import PageUsage
from prefixcache.request import Request

HASHCHAIN_EVICTION_POLICIES = ("lru", "arc")  # vLLM kv_offload CPU managers
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")  # SGLang HiCache
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # hicache_storage_prefetch_policy
STORAGE_FIELDS = ("prefetch_policy", "prefetch_threshold", "storage_pages_per_step", "step_time_s")


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """The host tier a backend is made with (``make_cache(..., host_tier=HostTierConfig(...))``).

    capacity_tokens:     host KV slots, in tokens of KV in every layer (the unit of
                         ``CacheConfig.capacity_tokens``). None: ``ratio`` x the device pool.
    ratio:               host size as a multiple of the device pool when capacity_tokens is
                         None (SGLang's ``hicache_ratio``, default 2.0).
    eviction_policy:     vLLM's CPU manager, "lru" (default) or "arc"; hashchain only.
    write_policy:        SGLang's ``hicache_write_policy``; radix only.
    block_size:          vLLM's offloaded chunk in tokens, a multiple of the GPU block
                         (extra_config ``block_size``); hashchain only; None: one GPU block.
    store_threshold:     vLLM: store a chunk only once it was offered this many times (0 off).
    offload_prompt_only: vLLM 0.33 default True: decode blocks are not offloaded.
    load_back_threshold: SGLang: a host hit shorter than this many tokens is recomputed (10).
    storage:             SGLang's L3 storage tier under the host pool (radix only; None/False
                         off). The four fields below need it:
    prefetch_policy:     ``hicache_storage_prefetch_policy``: "best_effort", "wait_complete" or
                         "timeout" (0.5.23's default).
    prefetch_threshold:  an L3 prefetch shorter than this many tokens is revoked (256).
    storage_pages_per_step: L3 pages reaching the host per engine step (our clock is engine
                         steps; default one ``STORAGE_BATCH_SIZE`` batch of 128 pages).
    step_time_s:         the engine step time assumed to turn the "timeout" policy's seconds
                         into steps (default 0.02 s).
    """

    capacity_tokens: int | None = None
    ratio: float | None = None
    eviction_policy: str | None = None
    write_policy: str | None = None
    block_size: int | None = None
    store_threshold: int | None = None
    offload_prompt_only: bool | None = None
    load_back_threshold: int | None = None
    storage: bool | None = None
    prefetch_policy: str | None = None
    prefetch_threshold: int | None = None
    storage_pages_per_step: int | None = None
    step_time_s: float | None = None

    def __post_init__(self) -> None:
        if self.capacity_tokens is not None:
            check_positive_int("host_tier.capacity_tokens", self.capacity_tokens)
            if self.ratio is not None:
                raise ValueError("give the host tier capacity_tokens or ratio, not both")
        if self.ratio is not None and not (isinstance(self.ratio, int | float) and self.ratio > 0):
            raise ValueError(f"host_tier.ratio must be a positive number, got {self.ratio!r}")
        if self.eviction_policy is not None and self.eviction_policy not in HASHCHAIN_EVICTION_POLICIES:
            raise ValueError(
                f"unknown host eviction_policy {self.eviction_policy!r}; valid: "
                f"{', '.join(HASHCHAIN_EVICTION_POLICIES)}"
            )
        if self.write_policy is not None and self.write_policy not in WRITE_POLICIES:
            valid = ", ".join(WRITE_POLICIES)
            raise ValueError(f"unknown write_policy {self.write_policy!r}; valid: {valid}")
        if self.block_size is not None:
            check_positive_int("host_tier.block_size", self.block_size)
        for name in ("store_threshold", "load_back_threshold"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"host_tier.{name} must be an int >= 0, got {value!r}")
        self._check_storage_fields()

    def _check_storage_fields(self) -> None:
        if self.storage is not None and not isinstance(self.storage, bool):
            raise ValueError(f"host_tier.storage must be a bool, got {self.storage!r}")
        if not self.storage:
            given = [n for n in STORAGE_FIELDS if getattr(self, n) is not None]
            if given:
                raise ValueError(f"host_tier.{', '.join(given)} need(s) the L3 tier: set storage=True")
        if self.prefetch_policy is not None and self.prefetch_policy not in PREFETCH_POLICIES:
            valid = ", ".join(PREFETCH_POLICIES)
            raise ValueError(f"unknown prefetch_policy {self.prefetch_policy!r}; valid: {valid}")
        value = self.prefetch_threshold
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"host_tier.prefetch_threshold must be an int >= 0, got {value!r}")
        if self.storage_pages_per_step is not None:
            check_positive_int("host_tier.storage_pages_per_step", self.storage_pages_per_step)
        step = self.step_time_s
        if step is not None and (isinstance(step, bool) or not isinstance(step, int | float) or not step > 0):
            raise ValueError(f"host_tier.step_time_s must be a positive number, got {step!r}")

    def host_tokens(self, device_tokens: int, default_ratio: float) -> int:
        """Host slots for a device pool of ``device_tokens`` (before page alignment)."""
        if self.capacity_tokens is not None:
            return self.capacity_tokens
        return int(device_tokens * (self.ratio if self.ratio is not None else default_ratio))

    def reject_fields(self, design: str, names: tuple[str, ...]) -> None:
        """ValueError if any of ``names`` (fields another design owns) was set."""
        given = [n for n in names if getattr(self, n) is not None]
        if given:
            raise ValueError(f"the {design} host tier has no {', '.join(given)} (another design's option)")


class HostTier(ABC):
    """A cache's host tier (hashchain: vLLM's offloading connector, offload/; radix: SGLang's
    HiCache, hicache_tier.py). Its hits show in the cache's matches (``Match.host_tokens``,
    ``pending``); these are what the engine asks of it beside the request lifecycle.

    It remembers what each live request's admission loaded (``loaded_tokens``): the backend
    calls ``admitted`` as an admission succeeds and ``released`` as the request is released.
    """

    load_overlapped: ClassVar[bool]  # SGLang: in the same forward; vLLM: async, a step later

    def __init__(self, config: HostTierConfig) -> None:
        self.config = config
        self._loaded: dict[str, int] = {}  # request id -> tokens its admission loaded (if any)

    def loaded_tokens(self, req: Request) -> int:
        """Tokens the live ``req``'s admission loaded from the host tier (0 if not live)."""
        return self._loaded.get(req.request_id, 0)

    def admitted(self, req: Request, loaded: int) -> None:
        """``req`` is live, its admission having loaded ``loaded`` tokens from this tier."""
        if loaded:
            self._loaded[req.request_id] = loaded

    def released(self, req: Request) -> None:
        """``req`` is no longer live."""
        self._loaded.pop(req.request_id, None)

    def load_pending(self, req: Request) -> bool:
        """Whether the live ``req``'s load from the host tier is still unacknowledged: vLLM's
        request waits (WAITING_FOR_REMOTE_KVS) and its loaded blocks are cached only once the
        connector reports the load finished (``advance_transfers``). False for a request that
        loaded nothing or is not live, and where loads finish in the admitting forward
        (SGLang's, the default)."""
        return False

    @abstractmethod
    def usage(self) -> PageUsage:
        """Where the tier's pages are (free / evictable / in use: held by a transfer in flight
        or, where the design pins them, by a request)."""

    @abstractmethod
    def num_pages(self) -> int:
        """Pages ``usage`` accounts for."""

    def enqueue(self, req: Request) -> None:  # noqa: B027 (a no-op by default, not abstract)
        """``req`` joined the waiting queue (SGLang starts an L3 prefetch here). No-op by
        default; changes nothing a lookup would see until a later ``advance_transfers``."""

    def transfers_in_flight(self) -> bool:
        """Whether a copy between tiers is still under way (a step with nothing to compute is
        then waiting, not stuck). False by default."""
        return False

    @abstractmethod
    def advance_transfers(self) -> None:
        """An engine step has passed: stores started in earlier steps complete (and become
        visible to lookups, as each design acknowledges them). The engine calls it at the start
        of every step."""

    @abstractmethod
    def metrics(self) -> dict[str, int]:
        """The tier's counters under the design's own names (vLLM's
        ``external_prefix_cache_*``, SGLang's ``cached_tokens{cache_source}``)."""

    def check_usage(self) -> None:
        """Raise InvariantError unless ``usage`` adds up (the backends' ``check_invariants``
        call it, then check their own bookkeeping)."""
        check_usage("host", self.usage(), self.num_pages())


# Llama-3-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (REFERENCE-tiers.md section 6).
LLAMA3_8B_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
# One direction of PCIe Gen5 x16 as measured on H100 by the vLLM blog (about 50 GB/s).
MEASURED_PCIE5_BYTES_PER_S = 50e9
# Per-transfer setup (a copy launch); an assumption, not a measured figure: configurable.
ASSUMED_TRANSFER_LATENCY_S = 10e-6


@dataclass(frozen=True, slots=True)
class HostLink:
    """The device<->host link: time to move KV of ``n`` tokens = latency + bytes / bandwidth.

    Loads share the link one after another (the engine queues them); stores run on the other
    direction and never hold up compute in either design, so only their bytes are counted.
    """

    bytes_per_token: int = LLAMA3_8B_BYTES_PER_TOKEN
    bandwidth_bytes_per_s: float = MEASURED_PCIE5_BYTES_PER_S
    latency_s: float = ASSUMED_TRANSFER_LATENCY_S

    def __post_init__(self) -> None:
        check_positive_int("bytes_per_token", self.bytes_per_token)
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be positive, got {self.bandwidth_bytes_per_s!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s!r}")

    def transfer_time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.latency_s + num_tokens * self.bytes_per_token / self.bandwidth_bytes_per_s
