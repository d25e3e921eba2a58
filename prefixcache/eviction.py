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
    tail_tokens       tokens of the last request that held it after its end (tlru)
    ghost_hit         its content was in a ghost when it was cached (arc, s3fifo)
    policy_state      what a learning policy keeps on it (wa), None until then

``make_policy`` builds one by name; ``prefixcache.capabilities.eviction_policies`` lists the
names a backend accepts over a layout.
A new policy is one small class with ``priority(entry)``; a user's own is added with
``register_policy(name, cls)`` or named by where it lives, ``"package.module:Class"``
(``load_policy_spec``), without editing this file. A *segmented* policy (arc, s3fifo,
wa) keys entries (segment, key in segment) and picks the segment to evict from with
``choose``; caches keep its entries in a ``SegmentedIndex`` (``make_index``). Policies with a
ghost learn of new and evicted entries' content ids through ``admit`` and ``forget``.
"""

from __future__ import annotations

import bisect
import importlib
import inspect
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from operator import attrgetter
from typing import Any, Protocol

from sortedcontainers import SortedList


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
    ``reuse_class`` and ``credited`` besides the common fields. Hashchain's ghost holds block
    hashes; the dense radix cache's holds an evicted edge's (parent node, first page), with the
    edge's own node id and length as its payload, so a returning prompt walks on through the
    ghost edge by edge (``take_ghost``).
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
        self.ghost: OrderedDict[Hashable, tuple[tuple, bool, float, Any]] = OrderedDict()
        self.ghost_size = ghost_factor * capacity
        self.touches: dict[tuple, float] = {}
        self.reuses: dict[tuple, float] = {}
        self.gap_sum, self.gaps = 0.0, 0
        self.current: tuple = ()

    def begin(self, lookup_ids: Sequence[Hashable], hit: int, now: float) -> float:
        """A request looked up ``lookup_ids`` and hit the first ``hit``: credit the ghost entries
        it reaches beyond them; returns the fraction it would have hit with them."""
        seen = hit
        while seen < len(lookup_ids) and self.take_ghost(lookup_ids[seen], now) is not None:
            seen += 1
        return seen / len(lookup_ids) if lookup_ids else 0.0

    def take_ghost(self, content_id: Hashable, now: float) -> Any:
        """A lookup reached ``content_id``: if the ghost holds it, forget it, credit its class
        and return what ``evicted`` stored with it (True when nothing); else None."""
        found = self.ghost.pop(content_id, None)
        if found is None:
            return None
        reuse_class, credited, last, payload = found
        self._credit(reuse_class, credited, now - last)
        return True if payload is None else payload

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

    def evicted(self, entry: Any, content_id: Hashable, payload: Any = None) -> None:
        self.ghost[content_id] = (entry.reuse_class, entry.credited, entry.last_access_time, payload)
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


class Ghost:
    """A bounded FIFO set of content ids of evicted entries (ARC's B1/B2, S3-FIFO's G)."""

    __slots__ = ("ids", "size")

    def __init__(self, size: int) -> None:
        self.ids: OrderedDict[Hashable, None] = OrderedDict()
        self.size = max(1, size)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, content_id: Hashable) -> None:
        self.ids[content_id] = None
        self.ids.move_to_end(content_id)
        if len(self.ids) > self.size:
            self.ids.popitem(last=False)

    def take(self, content_id: Hashable) -> bool:
        """Whether ``content_id`` was remembered (it is forgotten now)."""
        return self.ids.pop(content_id, False) is None


class ARC:
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03). T1 holds entries seen once (only
    the request that cached them), T2 entries seen again or re-cached from a ghost; LRU in
    each. The target size ``p`` of T1 grows on a hit in ghost B1 (recently evicted from T1)
    and shrinks on one in B2; T1 is evicted first while it is larger than ``p``.

    Both designs apply it to what they may evict (free cached leaves, radix leaves), so |T1|
    and |T2| count evictable entries, not every cached one as in ARC; ghosts hold up to
    ``capacity`` content ids each (block hashes in hashchain, (parent node, first page) in
    radix: the branch an edge hangs from, which a returning prefix takes again whatever its
    length)."""

    segmented = True

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.p = 0.0
        self.b1, self.b2 = Ghost(capacity), Ghost(capacity)

    def priority(self, entry: Evictable) -> tuple[int, float]:
        seen_again = entry.hit_count >= 2 or getattr(entry, "ghost_hit", False)
        return (2 if seen_again else 1, entry.last_access_time)

    def admit(self, entry: Any, content_id: Hashable) -> None:
        """A new entry: a ghost hit moves ``p`` and puts it in T2."""
        b1, b2 = len(self.b1), len(self.b2)
        if self.b1.take(content_id):
            self.p = min(float(self.capacity), self.p + max(b2 / b1, 1.0))
            entry.ghost_hit = True
        elif self.b2.take(content_id):
            self.p = max(0.0, self.p - max(b1 / b2, 1.0))  # b2 >= 1: it held the id
            entry.ghost_hit = True
        else:
            entry.ghost_hit = False

    def forget(self, entry: Evictable, content_id: Hashable) -> None:
        (self.b1 if self.priority(entry)[0] == 1 else self.b2).add(content_id)

    def choose(self, sizes: dict[Any, int], heads: dict[Any, Any]) -> Any:
        t1, t2 = sizes.get(1, 0), sizes.get(2, 0)
        return 1 if t1 and (t1 > self.p or not t2) else 2


class S3FIFO:
    """S3-FIFO (Yang et al., SOSP'23): new entries enter a small FIFO queue S; one touched again
    (or re-cached while its id is in the ghost G) belongs to the main queue M. S is evicted,
    oldest first, while it holds at least ``small`` of the evictable entries; an entry evicted
    from S leaves its id in G. M is LRU here (S3-FIFO's main queue is FIFO with reinsertion
    of the touched, which a hit already does in both designs: a hit takes the entry out of the
    evictable set and it comes back at the tail). Queue sizes count evictable entries; G holds
    ``capacity`` ids (content ids as in ``ARC``)."""

    segmented = True

    def __init__(self, capacity: int, small: float = 0.1) -> None:
        if not 0.0 < small < 1.0:
            raise ValueError(f"s3fifo's small queue share must be in (0, 1), got {small}")
        self.small = small
        self.ghost = Ghost(capacity)

    def priority(self, entry: Evictable) -> tuple[int, float]:
        if entry.hit_count <= 1 and not getattr(entry, "ghost_hit", False):
            return (0, entry.creation_time)
        return (1, entry.last_access_time)

    def admit(self, entry: Any, content_id: Hashable) -> None:
        entry.ghost_hit = self.ghost.take(content_id)

    def forget(self, entry: Evictable, content_id: Hashable) -> None:
        if self.priority(entry)[0] == 0:
            self.ghost.add(content_id)

    def choose(self, sizes: dict[Any, int], heads: dict[Any, Any]) -> Any:
        s, m = sizes.get(0, 0), sizes.get(1, 0)
        return 0 if s and (s >= self.small * (s + m) or not m) else 1


class TailOptimizedLRU:
    """Tail-optimized LRU (Zhang, Li, Moallemi & Peng, NeurIPS'25, arXiv 2510.15152): evict
    first what cannot change whether the next turn meets its latency target. With a target of
    ``xi`` uncached tokens and a next-turn estimate ``q``, a conversation's cache is excess
    from the point where what follows it (to the end of the sequence) is at most ``xi - q``
    tokens: dropping it leaves the next turn within target anyway. Excess entries go first,
    LRU among them, then the rest by LRU. ``slack`` = ``xi - q`` in tokens (the paper derives
    ``xi`` from an SLO; we take both as one parameter and learn neither). Entries carry
    ``tail_tokens``: tokens of the last touching request after the entry's end.

    OURS under the name: SGLang 0.5.23's own ``tlru`` (``TLRUStrategy``) reads each node's
    branch history and cached-prefix lengths against a threshold and a next-prompt estimate, and
    is not reproduced here (its other seven policies are, op by op)."""

    __slots__ = ("slack",)

    def __init__(self, slack: int = 1024) -> None:
        if slack < 0:
            raise ValueError(f"tlru's slack (xi - q) must be >= 0 tokens, got {slack}")
        self.slack = slack

    def priority(self, entry: Evictable) -> tuple[bool, float]:
        excess = getattr(entry, "tail_tokens", 0) + entry.num_tokens <= self.slack
        return (not excess, entry.last_access_time)


class WorkloadAware:
    """Workload-aware eviction in the spirit of Wang et al. (USENIX ATC'25, arXiv 2506.02634):
    within a request category, reuse probability decays exponentially with the time since
    last use, with a rate and a reuse probability that the category shows; evict the entry
    least likely to be reused now, prefix position breaking ties (the deeper, later block
    first, as every index here does). The paper's categories (request type, turn) are not in
    the Mooncake traces; ours are what both designs know about an entry: how many requests
    held it (1, 2, 3, more) and whether it lies in a prompt (``priority``).

    Value of an entry of category c, last used at t: p_c * exp(-(now - t) / g_c), where p_c is
    the share of c's entries reused before eviction and g_c their mean reuse gap, both learned
    online (a reuse is seen when an entry comes back with a higher hit count). Inside one
    category the value falls with age, so each category is an LRU segment and an eviction
    compares the segments' oldest entries only: O(categories) per eviction. ``now`` is the
    latest time stamped on an entry."""

    segmented = True
    HOLDERS = 3

    def __init__(self) -> None:
        self.now = 0.0
        self.touches: dict[tuple, float] = {}
        self.reuses: dict[tuple, float] = {}
        self.gap_sum: dict[tuple, float] = {}

    def category(self, entry: Evictable) -> tuple[int, int]:
        return (min(entry.hit_count, self.HOLDERS), entry.priority)

    def priority(self, entry: Any) -> tuple[tuple[int, int], float]:
        cat = self.category(entry)
        t = entry.last_access_time
        self.now = max(self.now, t)
        state = entry.policy_state
        if state is None or entry.hit_count > state[1]:  # new, or reused since last stamped
            if state is not None:
                old = state[2]
                self.reuses[old] = self.reuses.get(old, 0.0) + 1
                self.gap_sum[old] = self.gap_sum.get(old, 0.0) + max(t - state[0], 0.0)
            self.touches[cat] = self.touches.get(cat, 0.0) + 1
            entry.policy_state = (t, entry.hit_count, cat)
        return (cat, t)

    def value(self, entry: Any) -> float:
        cat = entry.policy_state[2] if entry.policy_state is not None else self.category(entry)
        reuses = self.reuses.get(cat, 0.0)
        p = (reuses + 1) / (self.touches.get(cat, 0.0) + 2)
        if reuses:
            gap = self.gap_sum[cat] / reuses
        else:
            total = sum(self.reuses.values())
            gap = sum(self.gap_sum.values()) / total if total else 1.0
        return float(p * math.exp(-(self.now - entry.last_access_time) / max(gap, 1e-9)))

    def choose(self, sizes: dict[Any, int], heads: dict[Any, Any]) -> Any:
        return min(heads, key=lambda seg: (self.value(heads[seg]), seg))


class SegmentedIndex:
    """The sorted index of a segmented policy (one whose key is (segment, key-in-segment)):
    a SortedList per segment, and the policy's ``choose`` names the segment whose first entry
    goes next. Offers what the caches use of a SortedList: add, remove, ``[0]``, ``pop(0)``,
    len and iteration (segment by segment). An entry is a tuple: its key first, the cached
    object last."""

    __slots__ = ("policy", "segments", "_len")

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.segments: dict[Any, SortedList] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[tuple]:
        for seg in sorted(self.segments):
            yield from self.segments[seg]

    def add(self, entry: tuple) -> None:
        seg = entry[0][0]
        lst = self.segments.get(seg)
        if lst is None:
            lst = self.segments[seg] = SortedList()
        lst.add(entry)
        self._len += 1

    def remove(self, entry: tuple) -> None:
        self.segments[entry[0][0]].remove(entry)  # ValueError if absent, as SortedList's
        self._len -= 1

    def __getitem__(self, i: int) -> tuple:
        if i != 0:
            raise IndexError("a segmented index only shows its next victim, [0]")
        if not self._len:
            raise IndexError("the eviction index is empty")
        live = {seg: lst for seg, lst in self.segments.items() if lst}
        seg = self.policy.choose({s: len(lst) for s, lst in live.items()},
                                 {s: lst[0][-1] for s, lst in live.items()})
        return live[seg][0]  # type: ignore[no-any-return]

    def pop(self, i: int = 0) -> tuple:
        entry = self[i]
        self.remove(entry)
        return entry


def make_index(policy: EvictionPolicy) -> SortedList | SegmentedIndex:
    """The sorted index a cache keeps its evictable entries in under ``policy``."""
    return SegmentedIndex(policy) if getattr(policy, "segmented", False) else SortedList()


def has_ghost(policy: EvictionPolicy) -> bool:
    """Whether ``admit`` / ``forget`` reach the policy (a ghost of content ids: arc, s3fifo), so
    that a cache computes an entry's content id only for such a policy."""
    return hasattr(policy, "admit") or hasattr(policy, "forget")


def admit(policy: EvictionPolicy, entry: Any, content_id: Hashable) -> None:
    """A new cached entry with ``content_id``: policies with a ghost (ARC, S3-FIFO) look it up."""
    hook = getattr(policy, "admit", None)
    if hook is not None:
        hook(entry, content_id)


def forget(policy: EvictionPolicy, entry: Any, content_id: Hashable) -> None:
    """``entry`` was evicted: policies with a ghost remember ``content_id``."""
    hook = getattr(policy, "forget", None)
    if hook is not None:
        hook(entry, content_id)


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
    "tlru": TailOptimizedLRU,
    "wa": WorkloadAware,
}
# SGLang 0.5.23's own policies (mem_cache/evict_policy.py) that both designs reproduce, lru first;
# its eighth, tlru, is not the class above of that name.
SGLANG_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
# Which backend and layout take which of these: prefixcache/capabilities.py.
CAPACITY_POLICIES: dict[str, type] = {"arc": ARC, "s3fifo": S3FIFO, "lrp": LearnedReuse}
LOOKUP_POLICIES = ("lrp",)  # need each request's lookup: hashchain, dense radix, the block model
# hashchain's "lru" is vLLM's free queue; "leaf-lru" ranks its free cached leaf blocks by LRU,
# SGLang's order over blocks (radix's own "lru" already is): an ablation of eviction order.
LEAF_LRU = "leaf-lru"
# A user's own policies (register_policy), by lower-case name; built-in names stay fixed.
USER_POLICIES: dict[str, type] = {}
_HOOKS = ("evicted_key", "admit", "forget", "choose")  # optional; called when present


def make_policy(name: str, capacity: int | None = None, lookups: bool = True) -> EvictionPolicy:
    """The policy called ``name`` (case-insensitive); ValueError listing the valid names.
    ``capacity`` (entries the cache holds) is needed by the policies with a ghost (``arc``,
    ``s3fifo``, ``lrp``); ``lookups`` is False for a cache that cannot feed ``lrp``. A name
    ``"package.module:Class"`` not yet registered is loaded (``load_policy_spec``), so a
    process that did not register it (a sweep's worker) builds it too."""
    key = name.lower() if isinstance(name, str) else None
    if key in LOOKUP_POLICIES and not lookups:
        raise ValueError(f"eviction policy {name!r} learns from each request's lookup, which this "
                         "cache does not feed (hashchain, the dense radix cache and the block model do)")
    if key in CAPACITY_POLICIES:
        if capacity is None or capacity < 1:
            raise ValueError(f"eviction policy {name!r} needs the cache's capacity in entries")
        return CAPACITY_POLICIES[key](capacity)  # type: ignore[no-any-return]
    if key is not None and ":" in key and key not in USER_POLICIES:
        load_policy_spec(name)
    cls = (POLICIES.get(key) or USER_POLICIES.get(key)) if key is not None else None
    if cls is None:
        valid = ", ".join([*POLICIES, *CAPACITY_POLICIES, *USER_POLICIES])
        raise ValueError(f"unknown eviction policy {name!r}; valid: {valid}, "
                         "or a class as 'package.module:Class'")
    return cls()  # type: ignore[no-any-return]


def register_policy(name: str, cls: type, *, replace: bool = False) -> str:
    """Make ``cls`` the eviction policy ``name`` (case-insensitive) of both backends:
    ``make_cache("radix" | "hashchain", config, eviction_policy=name)``. Returns ``name``.

    ``cls()`` (no arguments) builds one; its ``priority(entry)`` is the entry's sort key, the
    smallest evicted first, read from the fields the module docstring lists. The optional
    hooks are the built-ins': ``evicted_key`` (GDSF), ``admit`` / ``forget`` (a ghost),
    ``segmented`` with ``choose``, ``stale_keys``. ValueError if ``name`` is taken (a built-in
    name always; a registered one unless ``replace``), or ``cls`` is not such a class."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"an eviction policy's name must be a non-empty string, got {name!r}")
    key = name.lower()
    if key in POLICIES or key in CAPACITY_POLICIES:
        raise ValueError(f"eviction policy {name!r} is built in and cannot be replaced; choose another name")
    if key in USER_POLICIES and USER_POLICIES[key] is not cls and not replace:
        raise ValueError(f"eviction policy {name!r} is already registered "
                         f"({USER_POLICIES[key].__qualname__}); pass replace=True to replace it")
    _check_policy_class(name, cls)
    USER_POLICIES[key] = cls
    return name


def unregister_policy(name: str) -> None:
    """Forget a policy ``register_policy`` added (ValueError for a built-in or unknown name)."""
    if not isinstance(name, str) or name.lower() not in USER_POLICIES:
        registered = ", ".join(USER_POLICIES) or "none"
        raise ValueError(f"{name!r} is not a registered eviction policy (registered: {registered})")
    del USER_POLICIES[name.lower()]


def load_policy_spec(spec: str) -> str:
    """Import ``"package.module:Class"`` and register the class under ``spec`` itself (again,
    if the spec was loaded before); returns ``spec`` for ``eviction_policy=``. ValueError
    naming the spec when it is malformed, does not import or has no such class."""
    module_name, _, attr = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not module_name or not attr:
        raise ValueError(f"an eviction policy class is named 'package.module:Class', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raised
        raise ValueError(f"eviction policy {spec!r}: cannot import {module_name!r}: {e!r}") from e
    try:
        cls = attrgetter(attr)(module)
    except AttributeError:
        raise ValueError(f"eviction policy {spec!r}: module {module_name!r} has no {attr!r}") from None
    return register_policy(spec, cls, replace=True)


def _check_policy_class(name: str, cls: object) -> None:
    """ValueError naming what ``cls`` lacks to be built and used as a policy."""
    if not inspect.isclass(cls):
        raise ValueError(f"eviction policy {name!r} must be a class (make_policy calls it), got {cls!r}")
    needed = ["priority", *(["choose"] if getattr(cls, "segmented", False) else [])]
    missing = [m for m in needed if not callable(getattr(cls, m, None))]
    wrong = [h for h in _HOOKS if h not in missing and getattr(cls, h, None) is not None
             and not callable(getattr(cls, h))]
    if missing or wrong:
        raise ValueError(
            f"eviction policy {name!r}: {cls.__qualname__} must have the method(s) "
            f"{', '.join(missing + wrong)} (priority(entry) -> sort key, smallest evicted first; "
            "a segmented policy also choose(sizes, heads))"
        )
    try:
        params = inspect.signature(cls).parameters.values()
    except ValueError:  # no signature to read (a class made in C): make_policy will find out
        return
    needs = [p.name for p in params
             if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needs:
        raise ValueError(f"eviction policy {name!r}: {cls.__qualname__}() must take no arguments "
                         f"(make_policy builds it so), but it needs {', '.join(needs)}")
