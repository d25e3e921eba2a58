"""HiCache's L3 storage tier and its prefetch state machine, as SGLang 0.5.23 runs them
(``unified_radix_cache.py``: ``write_backup_storage``, ``prefetch_from_storage``,
``check_prefetch_progress``, ``_can_terminate_prefetch``, ``_handle_prefetch_result``, the
storage queue drains; ``managers/cache_controller.py``: ``_storage_hit_query``,
``prefetch_rate_limited``, ``_page_transfer``). Read from the installed code; there is no
CPU-runnable upstream recording of L3 (its threads need a storage backend and the controller).

- Keys: one per page, SHA-256 over the previous page's digest and the page's token ids as
  uint32 LE (``get_hash_str``; events.py's ``page_digest``); a namespaced chain (LoRA, salt)
  is seeded with 0.5.23's ``storage_namespace_seed``.
- Write (``write_backup_storage``): when a write-through host copy acks, its node's pages go
  host -> L3 (keys already there are skipped); the node stays pinned on host
  (``host_lock_ref``) until the storage ack, the next step. write_back never writes to L3
  (0.5.23 calls it only from the write-through ack).
- Prefetch (``_prefetch_kvcache`` at enqueue; ours: the request's first lookup while not
  live): if the L1+L2 match ends at a backed-up node (or the root), request the page-aligned
  tokens after it (up to ``num_tokens - 1``); under ``prefetch_threshold`` tokens nothing is
  issued; at ``0.5 x host`` tokens already requested by prefetches in flight it is refused
  (``prefetch_rate_limited``; retried at a later lookup). The hit query (consecutive pages
  present in L3) returns at the next step's drain: under the threshold the prefetch is revoked,
  else host slots are taken for the hit (evicting host copies; partial down to the threshold).
  Pages then arrive ``pages_per_step`` per step over one IO queue, prefetches in FIFO order.
  All arrived: the fetched span becomes a host-only node (``insert_host``), the anchor is
  unpinned, the request id leaves the state machine.
- Admission poll (every lookup of a request whose prefetch is in flight,
  ``check_prefetch_progress``): best_effort stops it now and keeps what arrived;
  wait_complete keeps the request pending; timeout keeps it pending until
  ``1 s + 0.25 s per 1024 requested tokens`` have passed since the first blocked poll (steps x
  ``step_time_s``, an assumed step time), then stops it. A stopped prefetch inserts what
  arrived and frees the rest; the normal load_back then loads the host-only span.

Ours, on purpose: the clock is engine steps (advance_transfers), not wall time; the store
is an unbounded dict of keys (a file/mooncake backend rarely evicts); one prefetch per
request id (0.5.23 may re-issue one after a retraction or a storage miss poll).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
from prefixcache.backends.radix.events import MEDIUM_HOST, page_digests
from prefixcache.backends.radix.hicache_tree import HiRadixCache
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import EMPTY_SLOTS
from prefixcache.backends.radix.tree import SlotArray, TreeNode

from prefixcache.request import Request
from prefixcache.tiers import HostTierConfig

DEFAULT_PREFETCH_POLICY = "timeout"  # 0.5.23 hicache_storage_prefetch_policy
DEFAULT_PREFETCH_THRESHOLD = 256  # parse_storage_backend_extra_config
PREFETCH_TIMEOUT_BASE_S = 1.0  # prefetch_timeout_base
PREFETCH_TIMEOUT_PER_KI_TOKEN_S = 0.25  # prefetch_timeout_per_ki_token
PREFETCH_CAPACITY_FRACTION = 0.5  # prefetch_capacity_limit = 0.5 x host (cache mode)
STORAGE_BATCH_SIZE = 128  # pages per batch_exists / batch_get
DEFAULT_STORAGE_PAGES_PER_STEP = STORAGE_BATCH_SIZE  # ours: one batch lands per engine step
DEFAULT_STEP_TIME_S = 0.02  # ours: an assumed engine step (20 ms) for the timeout policy
NAMESPACE_SEED_TAG = b"sglang-cache-namespace-v1"


def namespace_seed(extra_key: Hashable | None) -> bytes | None:
    """0.5.23 ``storage_namespace_seed(extra_key, cache_salt)`` for our namespace (None or
    (lora_name, salt)): None for none, else SHA-256 over tagged, length-prefixed parts."""
    if extra_key is None:
        return None
    parts = extra_key if isinstance(extra_key, tuple) else (extra_key, None)
    digest = hashlib.sha256(NAMESPACE_SEED_TAG)
    for part in parts:
        if part is None:
            digest.update(b"\x00")
            continue
        encoded = str(part).encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


def page_keys(key: RadixKey, page_size: int) -> list[bytes]:
    """The storage key of every whole page of ``key`` (a chain from its first page)."""
    return page_digests(namespace_seed(key.extra_key), np.asarray(key.token_ids, dtype=np.int64), page_size)


class L3Store:
    """The storage backend: which page keys it holds (their KV lives in the shadow models)."""

    __slots__ = ("pages",)

    def __init__(self) -> None:
        self.pages: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.pages)

    def hit_pages(self, keys: list[bytes]) -> int:
        """Consecutive keys present from the first (``batch_exists`` batch by batch)."""
        hits = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start : start + STORAGE_BATCH_SIZE]
            n = next((i for i, k in enumerate(batch) if k not in self.pages), len(batch))
            hits += n
            if n < len(batch):
                break
        return hits

    def put(self, keys: list[bytes]) -> list[int]:
        """Store the keys not yet there; returns the positions written."""
        written = [i for i, k in enumerate(keys) if k not in self.pages]
        self.pages.update(keys[i] for i in written)
        return written


@dataclass(eq=False)
class PrefetchOp:
    """One request's prefetch (0.5.23 ``PrefetchOperation`` + ``_OngoingPrefetch``)."""

    request: Request
    anchor: TreeNode  # last matched node (backed up, or the root), host-pinned
    key: RadixKey  # the page-aligned key: matched prefix, then the requested tokens
    matched: int  # L1 + L2 tokens before the requested span
    requested: int  # tokens requested (counted against the in-flight cap)
    hashes: list[bytes]  # keys of the L3 hit pages after ``matched``
    drained: bool = False  # the hit query's result was taken (a step after the issue)
    host: SlotArray = field(default_factory=lambda: EMPTY_SLOTS)  # slots for the hit
    hit: int = 0  # tokens of the L3 hit (once drained: of the host slots taken for it)
    completed: int = 0  # tokens arrived on host
    wait_start: int | None = None  # timeout: the step of the first blocked admission poll


class HiCacheStorage:
    """The L3 tier of one HiRadixCache (see the module docstring)."""

    def __init__(
        self,
        tree: HiRadixCache,
        *,
        host_size: int,
        policy: str = DEFAULT_PREFETCH_POLICY,
        threshold: int = DEFAULT_PREFETCH_THRESHOLD,
        pages_per_step: int = DEFAULT_STORAGE_PAGES_PER_STEP,
        step_time_s: float = DEFAULT_STEP_TIME_S,
    ) -> None:
        self.tree = tree
        self.page_size = tree.page_size
        self.policy = policy
        self.threshold = max(threshold, self.page_size)  # attach_storage_backend
        self.pages_per_step = pages_per_step
        self.step_time_s = step_time_s
        self.capacity_limit = int(PREFETCH_CAPACITY_FRACTION * host_size)
        # Observes every L3 copy: ("write" | "prefetch", host slots, page keys), page by page.
        self.on_transfer: Callable[[str, SlotArray, list[bytes]], None] = lambda kind, h, k: None
        tree.on_write_acked = self.write_backup
        self.reset()

    def reset(self) -> None:
        self.store = L3Store()
        self.ops: dict[str, PrefetchOp] = {}  # in flight, FIFO (the IO queue's order)
        self.done: set[str] = set()  # request ids whose prefetch was decided
        self.fetched: dict[str, int] = {}  # tokens each stopped prefetch put on host
        self.backups: list[TreeNode] = []  # host-pinned until their storage ack
        self.occupied = 0  # prefetch_tokens_occupied
        self.step = 0
        self.backuped_tokens = self.prefetched_tokens = 0
        self.revoked = 0

    # ------------------------------------------------------------------ writes (H -> L3)
    def write_backup(self, node: TreeNode) -> None:
        """``write_backup_storage`` of a node whose host copy just acked."""
        if node.host_value is None or node.parent is None:
            return
        keys = page_keys(self._path_key(node), self.page_size)[-(len(node.key) // self.page_size) :]
        p = self.page_size
        for i in self.store.put(keys):
            self.on_transfer("write", node.host_value[i * p : (i + 1) * p], [keys[i]])
            self.backuped_tokens += p
        node.host_lock_ref += 1
        self.backups.append(node)

    def ack_backups(self) -> None:
        """The storage writes of the last step ack (``ack_backup_queue``): unpin their nodes."""
        backups, self.backups = self.backups, []
        for node in backups:
            node.host_lock_ref -= 1

    def _path_key(self, node: TreeNode) -> RadixKey:
        parts = []
        up = node
        while up.parent is not None:
            parts.append(up.key)
            up = up.parent  # type: ignore[assignment]
        parts.reverse()
        ids = np.concatenate([np.asarray(k.token_ids, dtype=np.int64) for k in parts])
        return RadixKey(ids, node.key.extra_key)

    # ------------------------------------------------------------------ prefetch (L3 -> H)
    def on_lookup(
        self, req: Request, key: RadixKey, matched: int, anchor: TreeNode, *, poll: bool = True
    ) -> bool:
        """The request is looked up while not live: start its prefetch (once: the enqueue),
        then, with ``poll``, check it as admission does. Returns True if the tree changed (a
        stopped prefetch was inserted)."""
        rid = req.request_id
        op = self.ops.get(rid)
        if op is None:
            if rid in self.done:
                return False
            self._start(req, key.page_aligned(self.page_size), matched, anchor)
            op = self.ops.get(rid)
            if op is None:
                return False
        if not poll:
            return False
        if not self._can_terminate(op):
            if self.policy == "timeout" and op.wait_start is None:
                op.wait_start = self.step
            return False
        return self._finish(op)

    def is_pending(self, req: Request) -> bool:
        return req.request_id in self.ops

    def _start(self, req: Request, key: RadixKey, matched: int, anchor: TreeNode) -> None:
        rid = req.request_id
        if anchor is not self.tree.root_node and not anchor.backuped:
            self.done.add(rid)  # an unbacked anchor: a certain L3 miss (0.5.23's gate)
            return
        requested = len(key) - matched
        if requested < self.threshold:
            self.done.add(rid)  # not issued: "declined_too_short"
            return
        if self.occupied >= self.capacity_limit:
            return  # prefetch_rate_limited: a later lookup tries again
        keys = page_keys(key, self.page_size)[matched // self.page_size :]
        hit = self.store.hit_pages(keys)
        anchor.host_lock_ref += 1
        op = PrefetchOp(req, anchor, key, matched, requested, keys[:hit], hit=hit * self.page_size)
        self.ops[rid] = op
        self.occupied += requested

    def _can_terminate(self, op: PrefetchOp) -> bool:
        """``_can_terminate_prefetch`` at an admission poll."""
        if self.policy == "best_effort":
            return True
        if self.policy == "wait_complete":
            return False
        if op.wait_start is None:
            return False
        return (self.step - op.wait_start) * self.step_time_s > self.timeout_s(op.requested)

    @staticmethod
    def timeout_s(requested_tokens: int) -> float:
        """0.5.23: ``prefetch_timeout_base + pages x page_size / 1024 x per_ki_token``."""
        return PREFETCH_TIMEOUT_BASE_S + requested_tokens / 1024 * PREFETCH_TIMEOUT_PER_KI_TOKEN_S

    def advance(self) -> bool:
        """A step: pages arrive for drained prefetches (FIFO, ``pages_per_step`` in all), then
        the hit queries issued last step are drained (revoked under the threshold, else given
        host slots). Returns True if the tree changed."""
        self.step += 1
        changed = False
        budget = self.pages_per_step * self.page_size
        for op in list(self.ops.values()):
            if not op.drained or budget <= 0:
                continue
            n = min(budget, op.hit - op.completed)
            at = op.completed
            for i in range(at // self.page_size, (at + n) // self.page_size):
                p = self.page_size
                self.on_transfer("prefetch", op.host[i * p : (i + 1) * p], [op.hashes[i]])
            op.completed += n
            budget -= n
            if op.completed == op.hit:
                changed |= self._finish(op)  # completed_req: inserted before any poll
        for op in list(self.ops.values()):
            if not op.drained:
                self._drain(op)
        return changed

    def _drain(self, op: PrefetchOp) -> None:
        """``_drain_and_alloc_storage_hit`` for one hit query."""
        op.drained = True
        if op.hit < self.threshold:
            self._revoke(op)
            return
        pool, p = self.tree.host_pool, self.page_size
        if pool.available_size() < op.hit:
            self.tree.evict_host(op.hit - pool.available_size())
        n = min(op.hit, pool.available_size()) // p * p
        if n < self.threshold:  # allocate_storage_hit(min_tokens=prefetch_threshold)
            self._revoke(op)
            return
        host = pool.alloc(n)
        assert host is not None
        op.host, op.hit, op.hashes = host, n, op.hashes[: n // p]

    def _revoke(self, op: PrefetchOp) -> None:
        self.revoked += 1
        self._retire(op)

    def _retire(self, op: PrefetchOp) -> None:
        del self.ops[op.request.request_id]
        self.done.add(op.request.request_id)
        op.anchor.host_lock_ref -= 1
        self.occupied -= op.requested

    def _finish(self, op: PrefetchOp) -> bool:
        """Stop the prefetch: what arrived becomes a host-only node (``insert_host``), the rest
        of its host slots go back. Returns True if the tree changed."""
        if not op.drained:
            self._revoke(op)
            return False
        done = op.completed
        inserted = self._insert_host(op.key[: op.matched + done], op.matched, op.host[:done])
        if done < len(op.host):
            self.tree.host_pool.free(op.host[done:])
        self.prefetched_tokens += done
        self.fetched[op.request.request_id] = done
        self._retire(op)
        return inserted

    def _insert_host(self, key: RadixKey, matched: int, host: SlotArray) -> bool:
        """Walk ``key`` from the root; the fetched pages past what the tree holds become one
        host-only leaf, the others go back to the host pool (all of them if the matched
        prefix itself is gone)."""
        tree = self.tree
        now = tree.clock()
        node = tree.root_node
        pos = 0
        for child, n, _ in tree._walk(node, key, pos, len(key), now):
            node, pos = child, pos + n
        if pos < matched or pos == len(key):  # the prefix is gone, or every page is there
            if len(host):
                tree.host_pool.free(host)
            return False
        if pos > matched:  # pages the tree holds already: the fetched copies are duplicates
            tree.host_pool.free(host[: pos - matched])
        leaf = TreeNode(now)
        leaf.parent = node
        leaf.key = key[pos:].copy()
        leaf.value = None
        leaf.host_value = host[pos - matched :].copy()
        node.children[leaf.key.child_key(self.page_size)] = leaf
        tree.version += 1
        tree._update_leaf_status(node)
        tree.index_host_only(leaf)
        if tree.events is not None:  # insert_host: a new host-only node
            tree.events.record_store(leaf, MEDIUM_HOST)
        return True

    # ------------------------------------------------------------------ accounting
    def busy_nodes(self) -> list[TreeNode]:
        """Tree nodes this tier pins on host: prefetch anchors and L3 writes in flight."""
        return [op.anchor for op in self.ops.values()] + self.backups

    def buffer_pages(self) -> list[int]:
        """Host pages held by prefetches (not yet in the tree)."""
        p = self.page_size
        return [int(s) // p for op in self.ops.values() for s in op.host[::p]]

    def in_flight(self) -> bool:
        return bool(self.ops or self.backups)


def storage_from_config(tree: HiRadixCache, tier: HostTierConfig, host_size: int) -> HiCacheStorage | None:
    """The L3 tier a ``HostTierConfig`` asks for, or None (``storage`` not set)."""
    if not tier.storage:
        return None
    return HiCacheStorage(
        tree,
        host_size=host_size,
        policy=tier.prefetch_policy or DEFAULT_PREFETCH_POLICY,
        threshold=DEFAULT_PREFETCH_THRESHOLD if tier.prefetch_threshold is None else tier.prefetch_threshold,
        pages_per_step=tier.storage_pages_per_step or DEFAULT_STORAGE_PAGES_PER_STEP,
        step_time_s=tier.step_time_s or DEFAULT_STEP_TIME_S,
    )
