"""The contract every backend implements, written once.

Life of a request, as the engine drives it::

    hit = cache.lookup(req)          # pure: how many tokens could be reused right now
    ok = cache.allocate(req, n)      # first call: pin the hit, room for n more tokens
    ...model writes KV of n tokens; engine: req.num_computed_tokens += n
    cache.commit(req)                # publish that KV for other requests
    ok = cache.allocate(req, 1)      # later calls extend (next chunk, decode)
    cache.release(req)               # finished or preempted: unpin; KV stays as cache

The public methods below validate their arguments and keep the per-request accounting that
every backend shares (``_reserved``), then call the backend's ``_hooks``. Backends only add
their index: they never repeat the contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from prefixcache.config import CacheConfig
from prefixcache.request import Request

# vLLM logs the hit rate over the most recent requests (CachingMetrics, max_recent_requests).
RECENT_REQUESTS = 1000


class InvariantError(AssertionError):
    """``check_invariants`` found the cache's bookkeeping inconsistent."""


def ensure(condition: bool, message: str) -> None:
    """Raise InvariantError(message) unless condition holds (never stripped by ``-O``)."""
    if not condition:
        raise InvariantError(message)


class PageUsage(NamedTuple):
    """Where the usable pages are; the three add up to ``config.num_usable_pages``.

    free:      hold nothing reusable.
    evictable: hold cached KV that no running request pins (reclaimable on demand).
    in_use:    pinned by at least one running request.
    """

    free: int
    evictable: int
    in_use: int


@dataclass(slots=True)
class CacheStats:
    """Prefix-cache counters, counted once per admitted request at its first ``allocate``.

    Requests resumed after preemption are counted apart: recomputing a preempted request
    mostly hits its own blocks, which would otherwise inflate the hit rate (vLLM does the same).
    """

    requests: int = 0
    queries: int = 0  # tokens looked up (the request's length at admission)
    hits: int = 0  # of those, tokens reused
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evicted_tokens: int = 0  # cached tokens dropped to make room or by evict()
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def recent_hit_rate(self) -> float:
        """Hit rate over the last RECENT_REQUESTS admitted (not resumed) requests."""
        q = sum(x for x, _ in self.recent)
        return sum(h for _, h in self.recent) / q if q else 0.0

    def record(self, req: Request, hit: int) -> None:
        if req.num_preemptions:
            self.preempted_requests += 1
            self.preempted_queries += req.num_tokens
            self.preempted_hits += hit
        else:
            self.requests += 1
            self.queries += req.num_tokens
            self.hits += hit
            self.recent.append((req.num_tokens, hit))


class PrefixCache(ABC):
    """A prefix cache over a paged KV pool of ``config.num_pages`` pages, page 0 reserved.

    State changes only through ``allocate``, ``commit``, ``release``, ``evict`` and ``reset``.
    A request is *live* from its first successful ``allocate`` to its ``release``; while live,
    the pages it points at are pinned and never evicted. Invalid arguments raise ValueError and
    change nothing; running out of room is not an error (``allocate`` returns False).
    """

    name: ClassVar[str]

    def __init__(self, config: CacheConfig) -> None:
        if not isinstance(config, CacheConfig):
            raise ValueError(f"config must be a CacheConfig, got {type(config).__name__}")
        self.config = config
        self.page_size = config.page_size
        self.stats = CacheStats()
        # live request id -> (the Request, tokens it has room for)
        self._reserved: dict[str, tuple[Request, int]] = {}

    # ---------------------------------------------------------------- the contract
    def lookup(self, req: Request) -> int:
        """Tokens of ``req.all_token_ids`` reusable from the cache now, at most num_tokens - 1.

        Pure with respect to pinning and stats: nothing is pinned, nothing is counted. (The
        radix backend still stamps access times and may split a node, as SGLang's match does.)
        A resumed request is looked up over its prompt and output tokens alike.
        """
        self._check_request(req)
        return self._lookup(req)

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Reserve room for ``num_new_tokens`` tokens after ``req.num_computed_tokens``.

        First call for a request: find the hit, pin it, set ``req.num_computed_tokens`` to it,
        count it in ``stats``, then reserve room for ``num_new_tokens`` more tokens. Later calls
        extend the reservation to ``num_computed_tokens + num_new_tokens`` (a no-op if it is
        already that large). Evicts unpinned cache entries if needed. Returns False when there
        is no room even after eviction, and then NOTHING has changed.

        Raises ValueError if num_new_tokens is not a positive int, if the reservation would
        reach past the request's known tokens, or if the request could never fit in the pool.
        """
        # The checks are inlined: this runs once per request per engine step (decode included).
        if type(num_new_tokens) is not int or num_new_tokens < 1:
            _check_count("num_new_tokens", num_new_tokens, minimum=1)
        entry = self._reserved.get(req.request_id)
        if entry is None:
            self._check_request(req)
            ok = self._admit(req, num_new_tokens)
        else:
            if entry[0] is not req:
                self._check_request(req)  # raises: another live request has this id
            total = req.num_computed_tokens + num_new_tokens
            if total <= entry[1]:
                return True  # already room (and, below the reservation, nothing new to cache)
            self._check_fits(req, total)
            ok = self._extend(req, total)
        if ok:
            self._reserved[req.request_id] = (req, req.num_computed_tokens + num_new_tokens)
        return ok

    def commit(self, req: Request) -> None:
        """The KV of ``req.num_computed_tokens`` leading tokens is written: publish it."""
        entry = self._reserved.get(req.request_id)
        reserved = entry[1] if entry is not None and entry[0] is req else self._live(req, "commit")
        if not 0 <= req.num_computed_tokens <= reserved:
            raise ValueError(
                f"commit of {req.request_id!r} at num_computed_tokens={req.num_computed_tokens} "
                f"beyond the {reserved} tokens allocated to it"
            )
        if req.num_computed_tokens > req.num_tokens:
            raise ValueError(
                f"commit of {req.request_id!r}: num_computed_tokens={req.num_computed_tokens} "
                f"exceeds its {req.num_tokens} tokens"
            )
        self._commit(req)

    def release(self, req: Request) -> None:
        """Finished or preempted: unpin; KV of its computed tokens stays as cache.

        The request is no longer live; a later ``allocate`` admits it afresh (a resumed request
        usually hits its own blocks). The engine resets ``num_computed_tokens`` on preemption.
        """
        self._live(req, "release")
        self._release(req)
        del self._reserved[req.request_id]

    def page_table(self, req: Request) -> list[int]:
        """Physical page ids of ``req``'s KV in token order, covering its reservation.

        Token ``t`` lives in page ``page_table[t // page_size]`` at offset ``t % page_size``.
        """
        self._live(req, "page_table")
        return self._page_table(req)

    def evict(self, num_tokens: int) -> int:
        """Drop unpinned cached KV of at least ``num_tokens`` tokens if there is that much.

        Returns the number of cached tokens dropped (whole pages / whole leaves, so it may
        exceed the request; less if not enough is evictable).
        """
        _check_count("num_tokens", num_tokens, minimum=0)
        freed = self._evict(num_tokens)
        return freed

    def reset(self) -> bool:
        """Drop every cached entry and the stats. Refused (False, nothing changed) while any
        request is live, as vLLM's ``reset_prefix_cache`` refuses while blocks are in use."""
        if self._reserved:
            return False
        self._reset()
        self.stats = CacheStats()
        return True

    def reserved_tokens(self, req: Request) -> int:
        """Tokens ``req`` has room for (0 if it is not live)."""
        entry = self._reserved.get(req.request_id)
        return entry[1] if entry is not None else 0

    def is_live(self, req: Request) -> bool:
        entry = self._reserved.get(req.request_id)
        return entry is not None and entry[0] is req

    @property
    def live_requests(self) -> list[Request]:
        return [r for r, _ in self._reserved.values()]

    @abstractmethod
    def usage(self) -> PageUsage:
        """Where the usable pages are now (free / evictable / in use)."""

    def check_invariants(self) -> None:
        """Raise InvariantError unless the bookkeeping is consistent. Backends extend this."""
        u = self.usage()
        ensure(min(u) >= 0, f"negative page count in {u}")
        ensure(
            sum(u) == self.config.num_usable_pages,
            f"pages free + evictable + in use = {sum(u)} != {self.config.num_usable_pages} usable",
        )
        for rid, (req, reserved) in self._reserved.items():
            ensure(rid == req.request_id, f"live entry {rid!r} holds request {req.request_id!r}")
            ensure(
                req.num_computed_tokens <= reserved,
                f"{rid!r} computed {req.num_computed_tokens} > reserved {reserved}",
            )
            ensure(
                len(self._page_table(req)) * self.page_size >= reserved,
                f"{rid!r} page table covers fewer than its {reserved} reserved tokens",
            )

    # ---------------------------------------------------------------- backend hooks
    @abstractmethod
    def _lookup(self, req: Request) -> int: ...

    @abstractmethod
    def _admit(self, req: Request, num_new_tokens: int) -> bool:
        """First allocate: pin the hit, set num_computed_tokens, record stats (``_admitted``),
        reserve room. Use ``_check_fits`` before changing anything."""

    @abstractmethod
    def _extend(self, req: Request, total_tokens: int) -> bool:
        """Grow the live request's room to ``total_tokens`` tokens (no-op if already there)."""

    @abstractmethod
    def _commit(self, req: Request) -> None: ...

    @abstractmethod
    def _release(self, req: Request) -> None: ...

    @abstractmethod
    def _page_table(self, req: Request) -> list[int]: ...

    @abstractmethod
    def _evict(self, num_tokens: int) -> int: ...

    @abstractmethod
    def _reset(self) -> None: ...

    # ---------------------------------------------------------------- shared helpers
    def _check_fits(self, req: Request, total_tokens: int) -> None:
        """ValueError if ``total_tokens`` reaches past the request's tokens or the pool."""
        if total_tokens > req.num_tokens:
            raise ValueError(
                f"allocate for {req.request_id!r} up to token {total_tokens} reaches past its "
                f"{req.num_tokens} known tokens"
            )
        if -(-total_tokens // self.page_size) > self.config.num_usable_pages:
            raise ValueError(
                f"request {req.request_id!r} needs {total_tokens} tokens but the whole cache "
                f"holds {self.config.usable_tokens} ({self.config.num_usable_pages} usable pages "
                f"of {self.page_size})"
            )

    def _admitted(self, req: Request, hit: int) -> None:
        """Called by ``_admit`` once it has succeeded: sets computed tokens and counts stats."""
        req.num_computed_tokens = hit
        self.stats.record(req, hit)

    def _check_request(self, req: Request) -> None:
        if not isinstance(req, Request):
            raise ValueError(f"expected a Request, got {type(req).__name__}")
        entry = self._reserved.get(req.request_id)
        if entry is not None and entry[0] is not req:
            raise ValueError(f"another live request already has id {req.request_id!r}")

    def _live(self, req: Request, what: str) -> int:
        self._check_request(req)
        entry = self._reserved.get(req.request_id)
        if entry is None:
            raise ValueError(
                f"{what} of {req.request_id!r}, which is not live (never allocated or already released)"
            )
        return entry[1]


def _check_count(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
