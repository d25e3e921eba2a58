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


POLICIES: dict[str, type] = {
    "lru": LRU,
    "lfu": LFU,
    "fifo": FIFO,
    "mru": MRU,
    "filo": FILO,
    "priority": Priority,
    "slru": SLRU,
    "wlfu": WLFU,
}
# Backends that take ``eviction_policy``; both accept every name above.
BACKENDS_WITH_POLICIES = ("hashchain", "radix")


def make_policy(name: str) -> EvictionPolicy:
    """The policy called ``name`` (case-insensitive); ValueError listing the valid names."""
    cls = POLICIES.get(name.lower()) if isinstance(name, str) else None
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
    return list(POLICIES)
