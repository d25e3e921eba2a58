"""The contract every backend implements, written once.

Life of a request, as the engine drives it::

    m = cache.lookup(req)            # pure: a Match, m.tokens reusable right now
    ok = cache.allocate(req, n, m)   # first call: pin the match, room for n more tokens
    ...model writes KV of n tokens; engine: req.num_computed_tokens += n
    cache.commit(req)                # publish that KV for other requests
    ok = cache.allocate(req, 1)      # later calls extend (next chunk, decode)
    cache.release(req)               # finished or preempted: unpin; KV stays as cache

The match flows forward (vLLM hands ``get_computed_blocks``' blocks to ``allocate_slots``;
SGLang keeps ``match_prefix``'s node on the request): nothing looks the same prefix up twice
for one decision. The public methods below validate their arguments and keep one live record
per request (``LiveRequest``: the request, its reservation, the backend's state); the
backend's ``_hooks`` return what the base needs. Backends only add their index.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, NamedTuple, TypeVar

from prefixcache.config import CacheConfig
from prefixcache.invariants import check_usage, ensure
from prefixcache.kv_event_sink import KVEventSink
from prefixcache.pool import PageUsage
from prefixcache.prefill_chunking import TAKE_ALL, PrefillChunking
from prefixcache.request import Request
from prefixcache.tiers import HostTier


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One set of layers whose KV a backend keeps under one page table (``page_tables``).

    kind:      "full", "sliding_window" or "mamba" (``prefixcache.layout.LAYER_KINDS``).
    window:    tokens a sliding-window layer attends to, itself included (else None).
    pool:      the index space the group's page ids live in. Groups with the same pool share
               ids (vLLM: one block pool for every group; SGLang: a "full" and a "swa" pool).
    page_size: tokens per page of that pool (a mamba group: tokens per state checkpoint).
    num_pages: ids in that pool, page 0 (the null / padding page) included.
    layers:    the model layers (indices into ``config.model_layout.layers``) reading it.
    """

    kind: str
    window: int | None
    pool: str
    page_size: int
    num_pages: int
    layers: tuple[int, ...]


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
    revalidated_matches: int = 0  # matches handed to allocate after the index changed
    # Cached tokens left unreachable when the block before them was evicted (waste: a chain
    # hits only up to its first missing block). Radix evicts leaves only: always 0 there.
    orphaned_tokens: int = 0
    # The host tier (``prefixcache.tiers``; all 0 without one). ``hits`` counts device hits
    # only; ``host_hits`` the tokens after them loaded from the host at admission.
    host_hits: int = 0
    preempted_host_hits: int = 0
    loaded_tokens: int = 0  # host -> device, every admission (resumed requests included)
    stored_tokens: int = 0  # device -> host copies started
    host_evicted_tokens: int = 0  # host copies dropped

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def host_hit_rate(self) -> float:
        return self.host_hits / self.queries if self.queries else 0.0

    def record(self, req: Request, hit: int, host_hit: int = 0) -> None:
        self.loaded_tokens += host_hit
        if req.num_preemptions:
            self.preempted_requests += 1
            self.preempted_queries += req.num_tokens
            self.preempted_hits += hit
            self.preempted_host_hits += host_hit
        else:
            self.requests += 1
            self.queries += req.num_tokens
            self.hits += hit
            self.host_hits += host_hit


S = TypeVar("S")


@dataclass(frozen=True, slots=True, eq=False)
class Match:
    """What ``lookup`` found for one request, handed to its first ``allocate``.

    tokens:     leading tokens of the request reusable now (whole pages, <= num_tokens - 1).
    num_tokens: the request's length when it was looked up; a longer request needs a new match.
    version:    the backend's index version then: an unchanged version proves the match still
                holds; a changed one makes ``allocate`` revalidate it (never trust it blindly).
    Backends subclass it with what they found (blocks per group, a tree node).
    """

    cache: PrefixCache
    request: Request
    num_tokens: int
    tokens: int
    version: int

    # A host tier's part (``prefixcache.tiers``); backends with a tier override these two.
    @property
    def host_tokens(self) -> int:
        """Tokens right after ``tokens`` that the host tier holds and the first ``allocate``
        loads into device pages (``tokens + host_tokens <= num_tokens - 1``; 0 without a tier,
        or when the design would recompute them, e.g. SGLang's load_back_threshold)."""
        return 0

    @property
    def pending(self) -> bool:
        """The host copies this request would load are still being stored: the scheduler
        retries it later instead of admitting it now (vLLM's lookup returning None)."""
        return False

    @property
    def external_tokens(self) -> int:
        """The host hit as the design counts it (vLLM's ``num_external_computed_tokens``, the
        slots an async load reserves): ``host_tokens``, or one more when the whole prompt is on
        the host (vLLM loads its last token too and recomputes it). 0 without a tier."""
        return self.host_tokens

    @property
    def shared_prefix_boundary(self) -> int:
        """vLLM 0.33's ``shared_prefix_boundary`` (hybrid models with sliding-window groups): the
        junction, in tokens, where one group's hit ran past the joint hit; the scheduler hands
        it back with the allocation so sparse retention hashes that window tail. 0: none (every
        other design and model)."""
        return 0


class BatchAllocation(NamedTuple):
    """What ``allocate_batch`` did: the leading ``done`` requests got their room; ``evicted``
    names, by index in the batch, each whose step evicted cached tokens, and how many."""

    done: int
    evicted: tuple[tuple[int, int], ...]


@dataclass(slots=True, eq=False)
class LiveRequest(Generic[S]):
    """The one record of a live request: the request, the tokens it has room for, and the
    backend's own state for it (dropped with the record at release)."""

    request: Request
    reserved: int
    state: S
    computed: int = 0  # num_computed_tokens at admission or as handed to commit: never goes back


class PrefixCache(ABC, Generic[S]):
    """A prefix cache over a paged KV pool of ``config.num_pages`` pages, page 0 reserved.

    State changes only through ``allocate`` (and its decode shortcuts ``advance_in_place`` and
    ``take_decode_pages``), ``commit``, ``release``, ``evict`` and ``reset``.
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
        self._live: dict[str, LiveRequest[S]] = {}
        self._fit_limit: int | None = None  # _largest_fit(), once the backend is built

    # ---------------------------------------------------------------- the contract
    def lookup(self, req: Request) -> Match:
        """The longest reusable prefix of ``req.all_token_ids`` now, as a Match (``.tokens``).

        Pure with respect to pinning and stats: nothing is pinned, nothing is counted. (The
        radix backend still stamps access times and may split a node, as SGLang's match does.)
        A resumed request is looked up over its prompt and output tokens alike.
        """
        self._check_request(req)
        return self._match(req)

    def allocate(self, req: Request, num_new_tokens: int, match: Match | None = None) -> bool:
        """Reserve room for ``num_new_tokens`` tokens after ``req.num_computed_tokens``.

        First call for a request: take ``match`` (or look the request up now if None), pin
        it, set ``req.num_computed_tokens`` to its tokens, count it in ``stats``, then reserve
        room for ``num_new_tokens`` more tokens. A match taken before the index changed (an
        eviction, a reset, another request's allocation or commit) is revalidated first: it
        keeps only what still holds (and, where the backend can, what was added since), so a
        freed or reused page is never pinned. ``num_new_tokens`` count from the hit that holds,
        as on every call from ``num_computed_tokens`` as the call leaves it::

            hit   = match.tokens + match.host_tokens of the revalidated match
            [0, hit)       reused: num_computed_tokens = hit
            [hit, total)   reserved, total = min(hit + num_new_tokens, num_tokens)

        The caller computes exactly that room, ``[num_computed_tokens, reserved_tokens(req))``:
        a hit that shrank since leaves the rest of the prompt to later calls, one that grew
        leaves less (a request asked to the end of its prompt from the match as passed gets
        just the rest, never past its known tokens). Why not count from the match as passed:
        a caller that then advances ``num_computed_tokens`` by what it asked for, as the engine
        does, would leave room uncomputed, and hashchain publishes the blocks a reservation
        fills at allocation (vLLM's ``allocate_slots``), so others would read them unwritten,
        silently; computing past the room is refused at ``commit`` instead, loudly.

        ``num_new_tokens`` may be 0 on the first call only when the match's host hit loads
        asynchronously (``host_tokens`` and not ``host_tier.load_overlapped``): the admission then
        reserves just the hit, as vLLM's scheduler calls ``allocate_slots`` with
        ``num_new_tokens=0`` for a request whose external tokens load asynchronously; its next
        ``allocate`` reserves what it computes. A caller that does reserve new tokens at such
        an admission (vLLM never does) must compute them in the step its load is acknowledged
        (``host_tier.load_pending`` turns False): hashchain publishes the reserved blocks then.

        Later calls extend the reservation to ``num_computed_tokens + num_new_tokens`` (a no-op
        if it is already that large) and take no match. Evicts unpinned cache entries if
        needed. Returns False when there is no room (for the whole of ``[hit, total)``) even
        after eviction, and then NOTHING has changed.

        Raises ValueError (and changes nothing) if num_new_tokens is not a positive int (or 0
        as above), if the reservation would reach past the request's known tokens (for a stale
        match: from the match as passed and from the revalidated hit alike), if the request
        could never fit in the pool, or if ``match`` is not this cache's match of this request
        at its current length.
        """
        # 0 only with a match: a first allocate that just loads a host hit (checked below)
        if type(num_new_tokens) is not int or num_new_tokens < (0 if match is not None else 1):
            _check_count("num_new_tokens", num_new_tokens, minimum=1)
        try:
            live = self._live.get(req.request_id)
        except AttributeError:
            raise _not_a_request(req) from None
        if live is not None and live.request is req:
            if match is not None:
                raise ValueError(f"a match is for the first allocate only; {req.request_id!r} is live")
            total = req.num_computed_tokens + num_new_tokens
            if total <= live.reserved:
                return True  # already room (and, below the reservation, nothing new to cache)
            if req.num_computed_tokens > live.reserved:
                raise _computed_past_room(live)
            self._check_fits(req, total)
            return self._extend_batch([live], num_new_tokens, []) == 1  # a batch of one
        self._check_request(req)
        if match is None:
            match = told = self._match(req)
        else:
            told, match = match, self._current(req, match)
        if match.pending:
            raise ValueError(f"the match of {req.request_id!r} is pending (its host copies are being stored)")
        if num_new_tokens == 0:
            tier = self.host_tier
            if not (match.host_tokens and tier is not None and not tier.load_overlapped):
                how = "no host tokens" if not match.host_tokens else "a host hit loaded in the same forward"
                raise ValueError(
                    f"num_new_tokens must be >= 1, got 0 (allocate of {req.request_id!r}: only an "
                    f"admission whose host hit loads asynchronously, vLLM's, reserves just its hit; "
                    f"this match has {how})"
                )
        hit = match.tokens + match.host_tokens
        total = min(hit + num_new_tokens, req.num_tokens)
        # "Never fits in the pool" first: it is about the request, whatever the hit adds.
        self._check_fits(req, total)
        asked = told.tokens + told.host_tokens  # the hit the caller was told
        self._check_fits(req, min(asked, hit) + num_new_tokens)  # past the known tokens
        if match is not told:  # counted once the arguments are known good
            self.stats.revalidated_matches += 1
        state = self._admit(req, total - hit, match)
        if state is None:
            return False
        req.num_computed_tokens = hit
        self.stats.record(req, match.tokens, match.host_tokens)
        self._live[req.request_id] = LiveRequest(req, total, state, hit)
        return True

    def allocate_batch(self, reqs: Sequence[Request], num_new_tokens: int = 1) -> BatchAllocation:
        """``allocate(req, num_new_tokens)`` for each live request of ``reqs``, in order, as one
        call (a decode step's batch: SGLang allocates ``out_cache_loc`` for the batch at once,
        vLLM's scheduler allocates its running requests in schedule order). Stops at the first
        request there is no room for, whose state is then unchanged (as a False ``allocate``);
        returns how many got their room and which of them evicted cached KV for it. Every
        request is checked first (live, reservation within its known tokens and the pool): on
        a ValueError nothing has changed.

        The per-request ``allocate`` of a live request is this with one request; a backend's
        ``_extend_batch`` may take requests whose step changes only counters without calling
        into its index, but must leave exactly the state the calls one by one would."""
        if type(num_new_tokens) is not int or num_new_tokens < 1:
            _check_count("num_new_tokens", num_new_tokens, minimum=1)
        records = []
        live_of = self._live
        # _check_fits' bound once it is known, where the check is the base's: then a total
        # within it and the request's tokens needs no call (a decode batch checks every request)
        bound = self._fit_limit if type(self)._check_fits is PrefixCache._check_fits else None
        for req in reqs:
            try:
                live = live_of.get(req.request_id)
            except AttributeError:
                raise _not_a_request(req) from None
            if live is None or live.request is not req:
                live = self._live_record(req, "allocate_batch")  # not live: that error
            total = req.num_computed_tokens + num_new_tokens
            if total > live.reserved:
                if req.num_computed_tokens > live.reserved:
                    raise _computed_past_room(live)
                if bound is None or total > bound or total > req.num_tokens:
                    self._check_fits(req, total)
            records.append(live)
        evicted: list[tuple[int, int]] = []
        done = self._extend_batch(records, num_new_tokens, evicted)
        return BatchAllocation(done, tuple(evicted))

    def commit_batch(self, reqs: Sequence[Request]) -> None:
        """``commit(req)`` for each of ``reqs``, in order (the step's batch; ``commit`` is a
        batch of one). Every request is checked before any is committed."""
        records = []
        live_of = self._live
        for req in reqs:
            try:
                live = live_of.get(req.request_id)
            except AttributeError:
                raise _not_a_request(req) from None
            if live is None or live.request is not req:
                live = self._live_record(req, "commit")  # not live: that error
            computed = req.num_computed_tokens
            if not live.computed <= computed <= live.reserved:  # (reserved <= its known tokens)
                self._check_commit(live)  # raises, naming what is wrong
            live.computed = computed
            records.append(live)
        self._commit_batch(records)

    @staticmethod
    def _check_commit(live: LiveRequest[S]) -> None:
        req = live.request
        computed = req.num_computed_tokens
        if not live.computed <= computed <= live.reserved:
            if computed > live.reserved:
                raise ValueError(
                    f"commit of {req.request_id!r} at num_computed_tokens={computed} "
                    f"beyond the {live.reserved} tokens allocated to it (compute only what "
                    "allocate made room for, from num_computed_tokens as it left it: a stale "
                    "match is admitted from the hit that still holds)"
                )
            raise ValueError(
                f"commit of {req.request_id!r} at num_computed_tokens={computed}, below the "
                f"{live.computed} it had computed: a live request's computed tokens never go back"
            )
        if computed > req.num_tokens:
            raise ValueError(
                f"commit of {req.request_id!r}: num_computed_tokens={computed} "
                f"exceeds its {req.num_tokens} tokens"
            )

    def revalidate(self, match: Match) -> Match:
        """``match`` as it holds now: itself if the index has not changed since it was taken,
        else revalidated as ``allocate`` would. ValueError if it is not this cache's match of
        its request at the request's current length."""
        _check_match_type(match)
        self._check_request(match.request)
        current = self._current(match.request, match)
        if current is not match:
            self.stats.revalidated_matches += 1
        return current

    def decode_steps_in_place(self, req: Request) -> int:
        """How many decode steps the live ``req`` can take from here (each: ``allocate(req, 1)``,
        its token computed, ``commit(req)``) that change nothing in the cache but its own
        reservation: no page taken, freed, evicted, merged or published. 0 if it is not live,
        not decoding (its reservation is not exactly its computed tokens), or the backend does
        not say. It is ``decode_room(req)`` while ``decode_in_place_now()`` holds, else 0;
        ``advance_in_place`` takes that many at once; the engine uses it to skip stretches of
        decode-only steps."""
        room = self.decode_room(req)
        return room if room and self.decode_in_place_now() else 0

    def decode_room(self, req: Request) -> int:
        """How many decode steps the live ``req``'s own pages hold from here that change
        nothing but its reservation whenever ``decode_in_place_now()`` holds as each is taken,
        whatever other requests do in between: its own part of ``decode_steps_in_place``
        (steps inside pages it holds, none filling a block that would be published). 0 if it
        is not live, not decoding, or the backend does not say."""
        live = self._record_of(req)
        if live is None or live.reserved != req.num_computed_tokens:
            return 0
        return self._decode_room(req, live.state)

    def decode_in_place_now(self) -> bool:
        """Whether a decode step within ``decode_room``, taken now, changes nothing in the
        cache but its request's reservation: the rest of the condition, which depends on the
        cache as a whole (radix: a page is free, so SGLang's decode has nothing to evict for,
        and no staged pages are due to merge; a host tier: no copy under way). The engine
        checks it before each run of decoders whose steps it defers. True by default."""
        return self._in_place_now()

    def advance_in_place(self, req: Request, num_steps: int) -> None:
        """Reserve ``num_steps`` decode steps at once, as many ``allocate(req, 1)`` rounds would
        (the caller then computes them, advances ``num_computed_tokens`` and commits). Only
        within ``decode_room`` (ValueError beyond it, or past the known tokens), and only for
        steps each taken while ``decode_in_place_now()`` held: the caller vouches for that
        (the engine defers such steps and takes them here later, when the cache as a whole
        may have moved on)."""
        _check_count("num_steps", num_steps, minimum=1)
        allowed = self.decode_room(req)
        if num_steps > allowed:
            self._live_record(req, "advance_in_place")  # not live: that error
            raise ValueError(
                f"advance_in_place of {req.request_id!r} by {num_steps} steps; only {allowed} "
                "change nothing in the cache"
            )
        total = req.num_computed_tokens + num_steps
        self._check_fits(req, total)
        self._live[req.request_id].reserved = total

    def decode_takes_pages(self) -> bool:
        """Whether a decode step that opens a page does nothing else, while the pool is calm,
        than take it (radix and the no-cache baseline; hashchain's also publishes the block the
        step before filled): then ``take_decode_pages`` serves deferred decoders. False by
        default."""
        return self._takes_decode_pages()

    def take_decode_pages(self, reqs: Sequence[Request], calm_after: bool = False) -> bool:
        """One decode step for each of ``reqs`` (live decoders, in schedule order), each step
        opening a page (``decode_takes_pages``; the caller vouches that each one's next token is
        the first of a page it does not hold): the pages ``allocate_batch(reqs, 1)`` hands such
        steps while the pool is calm, taken in one allocation and appended to their page tables.
        Their reservations follow at ``advance_in_place``, for which the pages are room (the
        engine defers these decoders and takes them up so). False, changing nothing, where the
        steps would do more (too few pages ready, an eviction or merge due): the caller then
        steps them one by one. ``calm_after``: a decode step inside held pages follows them in
        the batch, so the take must also leave the pool calm (radix: a page still ready, else
        that step would evict). ValueError (nothing changed) if this cache's steps do not take
        pages so, or a request is not live with its reservation at its computed tokens."""
        if not self._takes_decode_pages():
            raise ValueError(f"take_decode_pages: a decode step of {type(self).__name__} here "
                             "does more than take a page (decode_takes_pages() is False)")
        records = list(map(self._record_of, reqs))
        for live, req in zip(records, reqs, strict=True):
            if live is None:
                self._live_record(req, "take_decode_pages")  # raises: not live
            elif live.reserved != req.num_computed_tokens:
                raise ValueError(
                    f"take_decode_pages of {req.request_id!r}: its reservation ({live.reserved}) "
                    f"is not at its computed tokens ({req.num_computed_tokens})"
                )
        return self._take_decode_pages(records, calm_after)  # type: ignore[arg-type]

    def commit(self, req: Request) -> None:
        """The KV of ``req.num_computed_tokens`` leading tokens is written: publish it (a
        ``commit_batch`` of one)."""
        self.commit_batch((req,))

    def release(self, req: Request) -> None:
        """Finished or preempted: unpin; KV of its computed tokens stays as cache.

        The request is no longer live; a later ``allocate`` admits it afresh (a resumed request
        usually hits its own blocks). The engine resets ``num_computed_tokens`` on preemption.
        """
        live = self._live_record(req, "release")
        del self._live[req.request_id]  # no longer live while its pages go back
        self._release(req, live.state)

    def page_table(self, req: Request) -> list[int]:
        """Physical page ids of ``req``'s KV in token order, covering its reservation.

        Token ``t`` lives in page ``page_table[t // page_size]`` at offset ``t % page_size``.
        """
        return self._page_table(req, self._live_record(req, "page_table").state)

    def kv_groups(self) -> tuple[KVGroup, ...]:
        """The KV groups behind ``page_tables``, in the same order. Default: one full-attention
        group over the whole pool serving every layer. Hybrid backends override it."""
        cfg = self.config
        return (KVGroup("full", None, "kv", cfg.page_size, cfg.num_pages,
                        tuple(range(cfg.model_layout.num_layers))),)

    def page_tables(self, req: Request) -> list[list[int]]:
        """One page table per ``kv_groups()`` entry, each in token order like ``page_table``.

        Sliding-window group: a page that left the window may read 0 (freed, never read again);
        every page holding one of the last ``window - 1`` computed tokens is a real page holding
        this request's KV. Default: the one group's ``page_table``.
        """
        return [self.page_table(req)]

    # ---------------------------------------------------------------- what a cache is given
    # Extensions attach as objects, as vLLM's scheduler is given a KV connector; the engine
    # reads each once. Without them a cache is exactly the request lifecycle above.
    @property
    def host_tier(self) -> HostTier | None:
        """The host-memory tier under the device pool (``prefixcache.tiers.HostTier``), for a
        cache made with ``host_tier=``; None without one."""
        return None

    @property
    def kv_events(self) -> KVEventSink | None:
        """Where the cache queues vLLM's KV events (``prefixcache.kv_event_sink``), for a cache
        made with ``kv_events=True`` (vLLM's ``enable_kv_cache_events``); None with events off."""
        return None

    # How much of a prefill the engine computes per step (``prefixcache.prefill_chunking``):
    # all it offers, unless the backend's model needs aligned chunks (vLLM's Mamba "align").
    prefill_chunking: PrefillChunking = TAKE_ALL

    def evict(self, num_tokens: int) -> int:
        """Drop unpinned cached KV of at least ``num_tokens`` tokens if there is that much.

        Returns the number of cached tokens dropped (whole pages / whole leaves, so it may
        exceed the request; less if not enough is evictable).
        """
        _check_count("num_tokens", num_tokens, minimum=0)
        return self._evict(num_tokens)

    def reset(self) -> bool:
        """Drop every cached entry and the stats. Refused (False, nothing changed) while any
        request is live, as vLLM's ``reset_prefix_cache`` refuses while blocks are in use."""
        if self._live:
            return False
        self._reset()
        self.stats = CacheStats()
        return True

    def reserved_tokens(self, req: Request) -> int:
        """Tokens ``req`` has room for (0 if it is not live)."""
        try:
            live = self._live.get(req.request_id)  # (a backend's extend asks: no extra call)
        except AttributeError:
            raise _not_a_request(req) from None
        return live.reserved if live is not None and live.request is req else 0

    def is_live(self, req: Request) -> bool:
        return self._record_of(req) is not None

    @property
    def live_requests(self) -> list[Request]:
        return [live.request for live in self._live.values()]

    def whole_sequence_fits(self, req: Request, match: Match) -> bool:
        """Whether the pages ``req``'s whole sequence (``req.num_tokens``) needs beyond ``match``
        are free now: vLLM's admission gate under ``scheduler_reserve_full_isl`` (an engine
        option). Pure. Default: NotImplementedError, for a backend that does not model it."""
        name = type(self).__name__
        raise NotImplementedError(f"{name} does not model vLLM's whole-sequence admission gate")

    def memory_in_use(self) -> int:
        """Memory pinned by running requests, in layer-token units (``CacheConfig
        .layer_token_budget``): what they keep from everyone else. Default: the in-use pages of
        one page table that every layer shares."""
        return self.usage().in_use * self.page_size * self.config.model_layout.num_layers

    def num_usable_pages(self) -> int:
        """Pages ``usage`` accounts for: ``config.num_usable_pages``, unless the backend sizes
        its pool from the model's layout (vLLM's KV-cache groups over one pool)."""
        return self.config.num_usable_pages

    @abstractmethod
    def usage(self) -> PageUsage:
        """Where the usable pages are now (free / evictable / in use)."""

    def check_invariants(self) -> None:
        """Raise InvariantError unless the bookkeeping is consistent. Backends extend this."""
        check_usage("device", self.usage(), self.num_usable_pages())
        for rid, live in self._live.items():
            req = live.request
            ensure(rid == req.request_id, f"live entry {rid!r} holds request {req.request_id!r}")
            ensure(
                req.num_computed_tokens <= live.reserved,
                f"{rid!r} computed {req.num_computed_tokens} > reserved {live.reserved}",
            )
            ensure(
                len(self._page_table(req, live.state)) * self.page_size >= live.reserved,
                f"{rid!r} page table covers fewer than its {live.reserved} reserved tokens",
            )

    # ---------------------------------------------------------------- backend hooks
    @abstractmethod
    def _match(self, req: Request) -> Match:
        """Find the longest reusable prefix now (pure; capped at num_tokens - 1)."""

    @abstractmethod
    def _revalidate(self, match: Match) -> Match:
        """A match of ``match.request`` that holds now (a new Match), given that the index
        changed since ``match`` was taken: keep only what still holds, never a freed or reused
        page."""

    @abstractmethod
    def _admit(self, req: Request, num_new_tokens: int, match: Match) -> S | None:
        """First allocate with a current match: pin it, reserve room for ``match.tokens +
        num_new_tokens`` tokens; the request's state, or None (nothing changed) if short."""

    @abstractmethod
    def _extend(self, req: Request, state: S, total_tokens: int) -> bool:
        """Grow the live request's room to ``total_tokens`` tokens; False (nothing changed) if short."""

    def _extend_batch(
        self, records: list[LiveRequest[S]], num_new_tokens: int, evicted: list[tuple[int, int]]
    ) -> int:
        """``allocate_batch`` on checked live records (the per-request allocate comes through
        here too, as a batch of one): ``_extend_one`` for each, in order, to the first that has
        no room; returns how many got theirs and appends (index, tokens) to ``evicted`` for
        each whose step evicted. A backend overrides it only to take several records at once
        (radix: a run of steps that each open a page)."""
        for done, live in enumerate(records):
            if not self._extend_one(done, live, num_new_tokens, evicted):
                return done
        return len(records)

    def _extend_one(
        self, index: int, live: LiveRequest[S], num_new_tokens: int, evicted: list[tuple[int, int]]
    ) -> bool:
        """One request of a batch: in place if the backend can take the step so, else through
        ``_extend`` (its evictions noted); False: no room."""
        req = live.request
        total = req.num_computed_tokens + num_new_tokens
        if total <= live.reserved:
            return True  # already room (and, below the reservation, nothing new to cache)
        if self._extend_in_place(live, total):
            live.reserved = total
            return True
        before = self.stats.evicted_tokens
        if not self._extend(req, live.state, total):
            return False
        live.reserved = total
        if self.stats.evicted_tokens != before:
            evicted.append((index, self.stats.evicted_tokens - before))
        return True

    def _extend_in_place(self, live: LiveRequest[S], total_tokens: int) -> bool:
        """Take the live request's step to ``total_tokens`` without the index, where it changes
        nothing there but the request's own state: True if taken (leaving exactly what
        ``_extend`` would), False to let ``_extend`` take it. Default: never."""
        return False

    def _commit_batch(self, records: list[LiveRequest[S]]) -> None:
        """``commit_batch`` on checked live records: ``_commit`` each, in order."""
        for live in records:
            self._commit(live.request, live.state)

    def _decode_room(self, req: Request, state: S) -> int:
        """``decode_room`` for a decoding live request; 0 unless the backend knows."""
        return 0

    def _in_place_now(self) -> bool:
        """``decode_in_place_now``; backends whose in-place steps depend on the whole cache
        say when they do not hold."""
        return True

    def _takes_decode_pages(self) -> bool:
        """``decode_takes_pages``."""
        return False

    def _take_decode_pages(self, records: list[LiveRequest[S]], calm_after: bool) -> bool:
        """``take_decode_pages`` on checked live records (only where ``_takes_decode_pages``)."""
        raise NotImplementedError

    @abstractmethod
    def _commit(self, req: Request, state: S) -> None: ...

    @abstractmethod
    def _release(self, req: Request, state: S) -> None: ...

    @abstractmethod
    def _page_table(self, req: Request, state: S) -> list[int]: ...

    @abstractmethod
    def _evict(self, num_tokens: int) -> int: ...

    @abstractmethod
    def _reset(self) -> None: ...

    @abstractmethod
    def _index_version(self) -> int:
        """A number that changes whenever a lookup could find something else (entries added,
        evicted, reset); a match carries the version it was taken at."""

    # ---------------------------------------------------------------- shared helpers
    def _current(self, req: Request, match: Match) -> Match:
        """``match`` checked to be this cache's match of ``req`` at its length, revalidated (a
        new Match; the caller counts it in ``stats``) if the index changed since it was taken."""
        _check_match_type(match)
        if match.cache is not self:
            raise ValueError(f"the match of {match.request.request_id!r} was taken from another cache")
        if match.request is not req:
            raise ValueError(
                f"the match of {match.request.request_id!r} was handed to allocate for {req.request_id!r}"
            )
        if match.num_tokens != req.num_tokens:
            raise ValueError(
                f"the match of {req.request_id!r} was taken at {match.num_tokens} tokens; it has "
                f"{req.num_tokens} now: look it up again"
            )
        if match.version == self._index_version():
            return match
        return self._revalidate(match)

    def _check_fits(self, req: Request, total_tokens: int) -> None:
        """ValueError if ``total_tokens`` reaches past the request's tokens or the pool."""
        if total_tokens <= req.num_tokens and total_tokens <= self._largest_fit():
            return  # the common case: one comparison against a bound found once
        if total_tokens > req.num_tokens:
            raise ValueError(
                f"allocate for {req.request_id!r} up to token {total_tokens} reaches past its "
                f"{req.num_tokens} known tokens"
            )
        need = self._min_pages_to_fit(total_tokens)
        usable = self.num_usable_pages()
        if need > usable:
            p = self.page_size
            raise ValueError(
                f"request {req.request_id!r} needs {total_tokens} tokens ({need} pages{self._layout_note()}) "
                f"but the whole cache holds {usable * p} ({usable} usable pages of {p})"
            )

    def _largest_fit(self) -> int:
        """The most tokens one request can hold at once (``_check_fits``' pool bound, found
        once by doubling and bisection: ``_min_pages_to_fit`` grows with the tokens and the
        pool's usable pages are fixed for a cache's life)."""
        if self._fit_limit is None:
            self._fit_limit = self._find_largest_fit()
        return self._fit_limit

    def _find_largest_fit(self) -> int:
        usable = self.num_usable_pages()
        lo, hi = 0, 1
        while self._min_pages_to_fit(hi) <= usable:
            if hi >= 1 << 62:  # windows only: a request of any length fits
                return hi
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # _min_pages_to_fit(lo) fits, (hi) does not
            mid = (lo + hi) // 2
            if self._min_pages_to_fit(mid) <= usable:
                lo = mid
            else:
                hi = mid
        return lo

    def _min_pages_to_fit(self, num_tokens: int) -> int:
        """The fewest pages a request of ``num_tokens`` tokens holds at once."""
        return -(-num_tokens // self.page_size)

    def _layout_note(self) -> str:
        return ""

    def _check_request(self, req: Request) -> None:
        if not isinstance(req, Request):
            raise _not_a_request(req)
        live = self._live.get(req.request_id)
        if live is not None and live.request is not req:
            raise ValueError(f"another live request already has id {req.request_id!r}")

    def _record_of(self, req: Request) -> LiveRequest[S] | None:
        """``req``'s live record, None if it is not live (ValueError if it is no Request)."""
        try:
            live = self._live.get(req.request_id)
        except AttributeError:
            raise _not_a_request(req) from None
        return live if live is not None and live.request is req else None

    def _live_record(self, req: Request, what: str) -> LiveRequest[S]:
        live = self._record_of(req)
        if live is None:
            self._check_request(req)
            raise ValueError(
                f"{what} of {req.request_id!r}, which is not live (never allocated or already released)"
            )
        return live

def _not_a_request(obj: object) -> ValueError:
    return ValueError(f"expected a Request, got {type(obj).__name__}")


def _computed_past_room(live: LiveRequest[S]) -> ValueError:
    """A live request asks for more room with KV computed beyond the room it had."""
    req = live.request
    return ValueError(
        f"allocate for {req.request_id!r} at num_computed_tokens={req.num_computed_tokens}, "
        f"beyond the {live.reserved} tokens allocated to it: its KV had no room"
    )


def _check_match_type(match: object) -> None:
    if not isinstance(match, Match):
        raise ValueError(f"match must be a Match from lookup, got {type(match).__name__}")


def _check_count(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
