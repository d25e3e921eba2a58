"""TreeNode: one edge of the radix tree and the KV slots of its tokens (SGLang's ``TreeNode``)."""

from __future__ import annotations

import sys
import time
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from prefixcache.backends.radix.key import ChildKey, RadixKey

SlotArray = npt.NDArray[np.int64]
ROOT_PRIORITY = -sys.maxsize  # any real priority overrides the root's


# Pages: the tree stores per-token slot indices (slot = page * page_size + offset, as SGLang's
# paged allocator hands them out) while memory moves by whole pages; page 0 is reserved.
def page_slots(pages: SlotArray, page_size: int) -> SlotArray:
    """The slots of whole pages, in order."""
    if page_size == 1:
        return pages  # slot == page
    return (pages[:, None] * page_size + np.arange(page_size, dtype=np.int64)).reshape(-1)


def slot_pages(slots: SlotArray, page_size: int) -> SlotArray:
    """Page ids of whole-page slot runs (slot // page_size at each page start). At page size 1
    that is ``slots`` itself, not a copy (every caller frees, compares or stores the ids into
    a page table at once; one that kept them would copy)."""
    if page_size == 1:
        return slots
    return slots[::page_size] // page_size  # type: ignore[no-any-return]


class _Node(Protocol):
    @property
    def children(self) -> dict[Any, Any]: ...


N = TypeVar("N", bound=_Node)


def iter_nodes(root: N) -> list[N]:
    """Every node below ``root`` (itself excluded), parents before children."""
    out: list[N] = []
    stack: list[N] = list(root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


class TreeNode:
    """A node owns the edge from its parent: ``key`` (tokens) and ``value`` (their KV slots).

    value: int64 slot indices, same length as key; None once the node is evicted. (SGLang keeps
           a torch tensor on the KV pool's device; we simulate on the CPU with a numpy array.)
    lock_ref: running requests whose path passes through here; > 0 means protected.
    hit_count: requests whose inserted path passed through here (LFU / SLRU read it).

    Every component keeps its data here, so one node type serves every tree (SGLang 0.5.23's
    ``UnifiedTreeNode`` holds each component's data the same way):
    host backup (HiCache, hicache_tree.py): ``host_value`` (host slots; None = no copy),
    ``write_ack`` (the write-through copy in flight), ``host_lock_ref`` (pinned on host) and
    ``load_pending`` (write_back: loaded, not yet acked);
    SWA (components/swa.py): ``swa`` (SWA-pool slots; None = tombstone), ``swa_lock``, ``swa_uuid``
    (where an SWA lock's window ends) and the SWA LRU links ``lru_prev`` / ``lru_next``;
    MAMBA (components/mamba.py): ``mamba`` (one state slot; None = tombstone) and ``mamba_lock``.
    ``lock_ref`` is the FULL component's lock in every tree.
    """

    __slots__ = (
        "children",
        "parent",
        "key",
        "value",
        "lock_ref",
        "last_access_time",
        "creation_time",
        "hit_count",
        "priority",
        "id",
        "tail_tokens",
        "ghost_hit",
        "policy_state",
        "reuse_class",
        "credited",
        "host_value",
        "write_ack",
        "host_lock_ref",
        "load_pending",
        "swa",
        "swa_lock",
        "swa_uuid",
        "lru_prev",
        "lru_next",
        "mamba",
        "mamba_lock",
    )

    counter: ClassVar[int] = 0  # advances on every construction, as SGLang's class counter

    def __init__(self, now: float | None = None, priority: int = 0) -> None:
        if now is None:
            now = time.monotonic()
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: RadixKey = RadixKey(np.empty(0, dtype=np.int64))
        self.value: SlotArray | None = np.empty(0, dtype=np.int64)
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority
        # Ours, for eviction policies (prefixcache/eviction.py): tlru, arc / s3fifo, wa
        self.tail_tokens = 0
        self.ghost_hit = False
        self.policy_state: tuple | None = None
        self.reuse_class: tuple = ()  # lrp: the class of the request that last unlocked it
        self.credited = False  # lrp: a hit since then was counted
        self.host_value: SlotArray | None = None
        self.write_ack: int | None = None
        self.host_lock_ref = 0
        self.load_pending = False
        self.swa: SlotArray | None = None
        self.swa_lock = 0
        self.swa_uuid: int | None = None
        self.lru_prev: TreeNode | None = None
        self.lru_next: TreeNode | None = None
        self.mamba: int | None = None
        self.mamba_lock = 0
        self.id = TreeNode.counter
        TreeNode.counter += 1

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    @property
    def tombstone(self) -> bool:
        """SWA: the node's sliding-window KV is freed, its full KV kept."""
        return self.swa is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, "
            f"children={len(self.children)})"
        )
