"""The hashchain backend's host tier: what ``HashChainCache`` calls at each of its hooks, so the
backend only forwards (see connector.py for how the hooks map onto vLLM's engine step), and what
the engine asks of a tier (``prefixcache.tiers.HostTier``), as ``HashChainCache.host_tier``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prefixcache.backends.hashchain.block_match import BlockMatch
from prefixcache.backends.hashchain.kv_cache_coordinator import KVCacheBlocks
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager
from prefixcache.backends.hashchain.offload.connector import OffloadingConnectorScheduler
from prefixcache.backends.hashchain.offload.spec import OffloadSpec

from prefixcache.interface import CacheStats, PageUsage
from prefixcache.request import Request
from prefixcache.tiers import HostTier, HostTierConfig


class DelayedCachingKVCacheManager(KVCacheManager):
    """``KVCacheManager`` with vLLM's ``allocate_slots(delay_cache_blocks=True)``: blocks an
    async load will fill are not cached (no other request hits them) until the load is
    acknowledged (vLLM ``_update_waiting_for_remote_kv``), or at the latest when it computes."""

    _delay = False

    def allocate_slots(
        self, request: Request, num_new_tokens: int, *args: Any, delay_cache_blocks: bool = False
    ) -> Any:
        self._delay = delay_cache_blocks
        try:
            return super().allocate_slots(request, num_new_tokens, *args)
        finally:
            self._delay = False

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        if not self._delay:
            super().cache_blocks(request, num_tokens)


class OffloadingTier(HostTier):
    """Given the backend's manager and what it reads of the backend (its stats, whether a
    request is live and its reserved tokens), not the backend itself: the backend is given a
    tier, as vLLM's scheduler is given a KV connector."""

    load_overlapped = False  # vLLM loads asynchronously: compute starts a step later

    def __init__(
        self,
        config: HostTierConfig,
        manager: KVCacheManager,
        *,
        capacity_tokens: int,
        page_size: int,
        hash_block_size: int,
        stats: Callable[[], CacheStats],
        is_live: Callable[[Request], bool],
        reserved_tokens: Callable[[Request], int],
        ack_delay: int,
    ) -> None:
        kinds = [m.spec.kind for m in manager.coordinator.single_type_managers]
        if kinds != ["full"]:
            raise ValueError(
                f"the hashchain host tier supports a dense layout only (one full-attention group); "
                f"got groups {kinds}"
            )
        super().__init__(config)
        spec = OffloadSpec.from_config(config, capacity_tokens, page_size, hash_block_size)
        self.manager = manager
        self.is_live = is_live
        self.reserved_tokens = reserved_tokens
        self.connector = OffloadingConnectorScheduler(spec, manager.hasher, stats, ack_delay)
        self.connector.on_load_done = self._load_done

    @property
    def version(self) -> int:
        return self.connector.version

    def with_host_part(self, match: BlockMatch) -> BlockMatch:
        """The GPU match plus what the host adds (vLLM's external hit) or ``pending``."""
        req = match.request
        external = self.connector.lookup(req, match.tokens)
        if external is None:
            return replace(match, pending=True)
        # A full-prompt external hit: vLLM loads every token and recomputes the last one.
        host = min(external, req.num_tokens - 1 - match.tokens)
        return replace(match, host_tokens=host, external_tokens=external if host else 0)

    def allocate_slots(self, req: Request, num_new_tokens: int, match: BlockMatch) -> KVCacheBlocks | None:
        """Admission: slots for the host part too (loaded now, cached once the load is done).

        ``num_new_tokens == 0`` with a host part is vLLM's async load (``Scheduler.schedule``:
        ``num_new_tokens = 0`` when ``load_kv_async``): blocks for exactly the GPU hit and the
        external tokens, ``allocate_slots(num_external_computed_tokens=...)``, the rest allocated
        once the load is done. More reserves those tokens now as well (a caller's choice)."""
        assert isinstance(self.manager, DelayedCachingKVCacheManager)
        if num_new_tokens == 0:
            assert match.host_tokens > 0, "an admission with nothing to load reserves a token at least"
            num_slots = match.external_tokens  # a full-prompt hit: its last token too, as vLLM
        else:
            num_slots = num_new_tokens + match.host_tokens
        new_blocks = self.manager.allocate_slots(
            req, num_slots, match.tokens, match.blocks, match.shared_prefix_boundary,
            delay_cache_blocks=match.host_tokens > 0,
        )  # fmt: skip
        if new_blocks is not None:
            self.connector.on_admit(req, match.tokens, match.external_tokens, self._block_ids(req))
            self.admitted(req, match.host_tokens)
        return new_blocks

    def _load_done(self, req: Request, num_loaded_tokens: int) -> None:
        """vLLM caches the loaded blocks when the load is reported (``_update_waiting_for_remote_kv``:
        one BlockStored), then schedules the request, whose allocation caches the blocks of its
        next tokens (a second BlockStored). Blocks reserved past the load at admission (a caller
        that reserved more than the load) are cached now, as that second call."""
        self.manager.cache_blocks(req, num_loaded_tokens)
        reserved = min(self.reserved_tokens(req), req.num_tokens)
        if reserved > num_loaded_tokens:
            self.manager.cache_blocks(req, reserved)

    def _block_ids(self, req: Request) -> list[int]:
        return [b.block_id for b in self.manager.get_blocks(req.request_id)[0]]

    def on_commit(self, req: Request) -> None:
        self.manager.cache_blocks(req, req.num_computed_tokens)  # no-op unless its load was not acked
        self.connector.on_commit(req, self.manager.get_blocks(req.request_id)[0])

    def on_release(self, req: Request) -> None:
        self.released(req)
        self.connector.on_release(req)

    def busy(self) -> bool:
        return self.connector.busy()

    def reset(self) -> None:
        self.connector.reset()

    def check_invariants(self, live: set[str]) -> None:
        self.check_usage()
        self.connector.check_invariants(live)

    # ---------------------------------------------------------------- what the engine asks
    def load_pending(self, req: Request) -> bool:
        return self.is_live(req) and self.connector.load_in_flight(req.request_id)

    def advance_transfers(self) -> None:
        self.connector.advance()

    def usage(self) -> PageUsage:
        return self.connector.host_usage()

    def num_pages(self) -> int:
        return self.connector.spec.num_chunks

    def metrics(self) -> dict[str, int]:
        return dict(self.connector.metrics)
