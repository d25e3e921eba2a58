"""Eviction policies, one vocabulary for both designs.

A policy maps an evictable entry to a sort key; the entry with the smallest key goes first.
An entry is a radix leaf (``TreeNode``: SGLang evicts whole leaves) or a free cached hashchain
block (ours: vLLM has one LRU order, its free queue; any other name ranks the free cached
*leaf* blocks, those no cached block extends, so a policy never orphans a chain). Both kinds
carry the same fields:

    last_access_time  stamped when matched or inserted (radix), freed or hit (hashchain)
    creation_time     when the entry was cached
    hit_count         requests that held it (radix: whose inserted path passed through it)
    priority          1 for prompt pages once output follows them (SGLang's split_prompt),
                      0 otherwise; hashchain: 1 for blocks wholly inside the prompt
    num_tokens        tokens it holds (a radix edge's length; a block's size)

``make_policy`` builds one by name; ``eviction_policies`` lists the names a backend accepts.
A new policy is one small class with ``priority(entry)``.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, Protocol


class Evictable(Protocol):
    last_access_time: float
    creation_time: float
    hit_count: int
    priority: int

    @property
    def num_tokens(self) -> int: ...


class EvictionPolicy(Protocol):
    def priority(self, entry: Evictable) -> Any: ...


def keys_stay_fresh(policy: EvictionPolicy) -> bool:
    """False for policies whose keys read state that moves on (GDSF, lrp): a cache keeps such a
    key as computed, so invariant checks must not recompute it."""
    return not getattr(policy, "stale_keys", False)


def note_eviction(policy: EvictionPolicy, key: Any) -> None:
    """Tell a policy that keeps state across evictions (GDSF's inflation) the victim's key."""
    hook = getattr(policy, "evicted_key", None)
    if hook is not None:
        hook(key)


class LRU:
    """Least recently used (SGLang's default; in hashchain the default is vLLM's free queue)."""

    def priority(self, entry: Evictable) -> float:
        return entry.last_access_time


class LFU:
    """Fewest holders first, LRU among equals (SGLang ``lfu``)."""

    def priority(self, entry: Evictable) -> tuple[int, float]:
        return (entry.hit_count, entry.last_access_time)


class FIFO:
    """Oldest cached first (SGLang ``fifo``)."""

    def priority(self, entry: Evictable) -> float:
        return entry.creation_time


class MRU:
    """Most recently used first (SGLang ``mru``)."""

    def priority(self, entry: Evictable) -> float:
        return -entry.last_access_time


class FILO:
    """Newest cached first (SGLang ``filo``)."""

    def priority(self, entry: Evictable) -> float:
        return -entry.creation_time


class Priority:
    """Lower priority first, LRU among equals (SGLang ``priority``). The designs differ in
    when a page gets priority 1: radix when output follows the prompt (the prompt is
    re-inserted at priority 1), hashchain as soon as a block wholly inside the prompt is
    cached."""

    def priority(self, entry: Evictable) -> tuple[int, float]:
        return (entry.priority, entry.last_access_time)


class SLRU:
    """Segmented LRU (SGLang ``slru``): entries held ``threshold`` times or more are protected
    (evicted only after every probationary entry); LRU inside each segment."""

    __slots__ = ("threshold",)

    def __init__(self, threshold: int = 2) -> None:
        self.threshold = threshold

    def priority(self, entry: Evictable) -> tuple[bool, float]:
        return (entry.hit_count >= self.threshold, entry.last_access_time)


class WLFU:
    """OURS, not SGLang's (the seed article's "WLFU" was a proposal never merged upstream):
    frequency weighted by length, so a long rarely-hit leaf goes before a short hot one:
    (hit_count * num_tokens, last_access_time). In hashchain every block has the same
    length, so it ranks as LFU there."""

    def priority(self, entry: Evictable) -> tuple[int, float]:
        return (entry.hit_count * entry.num_tokens, entry.last_access_time)


class GDSF:
    """GreedyDual-Size-Frequency (Cherkasova 1998, after Cao & Irani's GreedyDual-Size):
    key = L + hit_count * cost / size, where L, the inflation, is the key of the last entry
    evicted, so entries not used for a while age below new ones. Recomputing a prefix costs
    its prefill, linear in its tokens to first order, so cost / size is one for every entry
    and the key is L + hit_count: frequency with aging, where LFU never forgets. The owner
    calls ``evicted_key`` with each victim's key."""

    __slots__ = ("inflation",)
    stale_keys = True  # a key read the inflation of its day; caches do not re-rank on a rise

    def __init__(self) -> None:
        self.inflation = 0.0

    def priority(self, entry: Evictable) -> tuple[float, float]:
        return (self.inflation + entry.hit_count, entry.last_access_time)

    def evicted_key(self, key: tuple[float, float]) -> None:
        self.inflation = max(self.inflation, key[0])


class LearnedReuse:
    """OURS (``lrp``): ``last_access_time + alpha * mean reuse gap * p(class)``, where ``p`` is the
    reuse probability of the class of the request that last touched the entry, learned online.

    A class is (the request's hit fraction as the cache *would* have seen it: its cached prefix
    extended through a ghost list of recently evicted entries; its prompt length; its output
    length). Labels come from reuse: a lookup that reaches a cached or ghost entry credits the
    class that entry was last touched under (once per touch). State: per-class counters and a
    ghost of ``ghost_factor * capacity`` content ids; O(1) per event besides the caller's index.
    Defaults tuned on the first half of each Mooncake trace (paper/LOG.md, 2026-12-01 evening).

    The owner calls ``begin`` at admission (the request's lookup ids and hit), ``classify`` when
    the request's class is known, ``reused`` when a request hits an entry, ``assign`` when an
    entry takes the current class, ``evicted`` when it leaves the cache. Entries carry
    ``reuse_class`` and ``credited`` besides the common fields. Hashchain only among the
    backends: radix has no content id for an evicted edge to remember in a ghost.
    """

    stale_keys = True  # keys read what was learned when computed; caches do not re-rank
    HIT_FRACTION = (0.5, 0.9, 0.99)
    PROMPT_TOKENS = (2048, 8192)
    OUTPUT_TOKENS = (200,)

    def __init__(self, capacity: int, alpha: float = 8.0, ghost_factor: int = 8) -> None:
        if capacity < 1 or alpha < 0 or ghost_factor < 0:
            raise ValueError(f"lrp needs capacity >= 1, alpha >= 0, ghost_factor >= 0; got "
                             f"{capacity}, {alpha}, {ghost_factor}")
        self.alpha = alpha
        self.ghost: OrderedDict[Hashable, tuple[tuple, bool, float]] = OrderedDict()
        self.ghost_size = ghost_factor * capacity
        self.touches: dict[tuple, float] = {}
        self.reuses: dict[tuple, float] = {}
        self.gap_sum, self.gaps = 0.0, 0
        self.current: tuple = ()

    def begin(self, lookup_ids: Sequence[Hashable], hit: int, now: float) -> float:
        """A request looked up ``lookup_ids`` and hit the first ``hit``: credit the ghost entries
        it reaches beyond them; returns the fraction it would have hit with them."""
        seen = hit
        while seen < len(lookup_ids) and lookup_ids[seen] in self.ghost:
            reuse_class, credited, last = self.ghost.pop(lookup_ids[seen])
            self._credit(reuse_class, credited, now - last)
            seen += 1
        return seen / len(lookup_ids) if lookup_ids else 0.0

    def classify(self, seen_fraction: float, prompt_tokens: int, output_tokens: int) -> None:
        self.current = (bisect.bisect_right(self.HIT_FRACTION, seen_fraction),
                        bisect.bisect_right(self.PROMPT_TOKENS, prompt_tokens),
                        bisect.bisect_right(self.OUTPUT_TOKENS, output_tokens))

    def reused(self, entry: Any, now: float) -> None:
        self._credit(entry.reuse_class, entry.credited, now - entry.last_access_time)
        entry.credited = True

    def assign(self, entry: Any) -> None:
        entry.reuse_class, entry.credited = self.current, False
        self.touches[self.current] = self.touches.get(self.current, 1.0) + 1

    def evicted(self, entry: Any, content_id: Hashable) -> None:
        self.ghost[content_id] = (entry.reuse_class, entry.credited, entry.last_access_time)
        if len(self.ghost) > self.ghost_size:
            self.ghost.popitem(last=False)

    def probability(self, reuse_class: tuple) -> float:
        return self.reuses.get(reuse_class, 0.5) / self.touches.get(reuse_class, 1.0)

    def priority(self, entry: Any) -> float:
        gap = self.gap_sum / self.gaps if self.gaps else 0.0
        return float(entry.last_access_time + self.alpha * gap * self.probability(entry.reuse_class))

    def _credit(self, reuse_class: tuple, credited: bool, gap: float) -> None:
        if not credited:
            self.reuses[reuse_class] = self.reuses.get(reuse_class, 0.5) + 1
        self.gap_sum += gap
        self.gaps += 1


POLICIES: dict[str, type] = {
    "lru": LRU,
    "lfu": LFU,
    "fifo": FIFO,
    "mru": MRU,
    "filo": FILO,
    "priority": Priority,
    "slru": SLRU,
    "wlfu": WLFU,
    "gdsf": GDSF,
}
# Backends that take ``eviction_policy``: both accept every name above; hashchain also ``lrp``.
BACKENDS_WITH_POLICIES = ("hashchain", "radix")
CAPACITY_POLICIES: dict[str, type] = {"lrp": LearnedReuse}  # built with the cache's capacity
_EXTRA = {"hashchain": tuple(CAPACITY_POLICIES), "radix": ()}


def make_policy(name: str, capacity: int | None = None) -> EvictionPolicy:
    """The policy called ``name`` (case-insensitive); ValueError listing the valid names.
    ``capacity`` (entries the cache holds) is needed by the policies that learn (``lrp``)."""
    key = name.lower() if isinstance(name, str) else None
    if key in CAPACITY_POLICIES:
        if capacity is None:
            raise ValueError(f"eviction policy {name!r} remembers evicted entries by content: "
                             "hashchain and the block model only")
        return CAPACITY_POLICIES[key](capacity)  # type: ignore[no-any-return]
    cls = POLICIES.get(key) if key is not None else None
    if cls is None:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(POLICIES)}")
    return cls()  # type: ignore[no-any-return]


def eviction_policies(backend: str) -> list[str]:
    """The ``eviction_policy`` names ``make_cache(backend, ...)`` accepts (ValueError for a
    backend that takes none)."""
    if backend not in BACKENDS_WITH_POLICIES:
        raise ValueError(
            f"backend {backend!r} takes no eviction_policy; "
            f"those that do: {', '.join(BACKENDS_WITH_POLICIES)}"
        )
    return [*POLICIES, *_EXTRA[backend]]
