"""Eviction policies (SGLang's ``evict_policy.py``): each maps a leaf to a sort key, and the
leaf with the smallest key is evicted first. A new policy is one small class."""

from __future__ import annotations

from typing import Any, Protocol

from prefixcache.backends.radix.tree import TreeNode


class EvictionPolicy(Protocol):
    def priority(self, node: TreeNode) -> Any: ...


class LRU:
    def priority(self, node: TreeNode) -> float:
        return node.last_access_time


class LFU:
    def priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.hit_count, node.last_access_time)


class FIFO:
    def priority(self, node: TreeNode) -> float:
        return node.creation_time


class MRU:
    def priority(self, node: TreeNode) -> float:
        return -node.last_access_time


class FILO:
    def priority(self, node: TreeNode) -> float:
        return -node.creation_time


class Priority:
    """Lower request priority is evicted first; LRU among equals."""

    def priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.priority, node.last_access_time)


class SLRU:
    """Segmented LRU: nodes hit ``threshold`` times or more are protected (evicted only after
    every probationary node); LRU inside each segment."""

    __slots__ = ("threshold",)

    def __init__(self, threshold: int = 2) -> None:
        self.threshold = threshold

    def priority(self, node: TreeNode) -> tuple[bool, float]:
        return (node.hit_count >= self.threshold, node.last_access_time)


class WLFU:
    """OURS, not SGLang's (the article's "WLFU" was a proposal never merged upstream):
    frequency weighted by the node's length, so a long rarely-hit leaf goes before a short
    hot one: (hit_count * len, last_access_time)."""

    def priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.hit_count * len(node.key), node.last_access_time)


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


def make_policy(name: str) -> EvictionPolicy:
    """The policy called ``name`` (case-insensitive); ValueError listing the valid names."""
    cls = POLICIES.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(POLICIES)}")
    return cls()  # type: ignore[no-any-return]
