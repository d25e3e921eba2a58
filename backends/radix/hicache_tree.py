"""HiRadixCache: the radix tree with host copies, as SGLang 0.5.23's ``UnifiedRadixCache`` with
HiCache on (``unified_cache/unified_tree_core.py``, FULL component, ``unified_radix_cache.py``).

Node states (``value`` = device slots, ``host_value`` = host slots): device-only, device +
host, host-only (``evicted and backuped``), deleted. Invariant: a device-resident node's parent
is device-resident, so a match is one prefix, its device part first, then its host part.

- insert: bumps ``hit_count`` once per request on every device-resident node it passes past
  the request's already-inserted length and on the new leaf (never under write_back); an
  insert through a host-only node restores it from the request's fresh KV (adopted, not
  freed). A node reaching ``write_through_threshold`` (1 write_through, 2 selective) that is
  not backed up starts a backup of itself and its unbacked ancestors (ancestors first), each
  locked until its ack (``ack_writes``).
- evict (device): candidates are unlocked device nodes whose children are all off device; a
  backed-up one is demoted to host-only, an unbacked one deleted (write_through) or written
  back first (write_back: synchronous, no lock; on host OOM its subtree is dropped).
- evict_host (only when a host alloc falls short): host-only childless unlocked nodes, by the
  same policy; under write_back, host copies of device-resident nodes go first, in the order
  they became duplicates (``full_host_duplicates``, swept lazily as upstream does).
- load back (the backend drives it): the host-only tail gets device slots (``revive``); its
  anchor stays locked on both tiers until the load's ack (``ack_loads``, ``loading_check``).

Ours, on purpose: access times are stamped as RadixCache's insert stamps them (every visited
node, one time per walk); 0.5.23's unified tree stamps a match path from its end upwards with
decreasing times. The recorded fixtures agree on every eviction order they exercise.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import NamedTuple

from prefixcache.backends.radix.events import MEDIUM_HOST, RadixEventRecorder
from prefixcache.backends.radix.hicache_pool import HostPool
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import MatchResult, RadixCache
from prefixcache.backends.radix.tree import SlotArray, TreeNode
from sortedcontainers import SortedList

from prefixcache.eviction import LRU


class HiMatch(NamedTuple):
    device: MatchResult  # the device part (length, slots, last device node)
    best_node: TreeNode  # deepest matched node, device or host
    host_hit_length: int  # host tokens of the evicted tail of the path


class HiRadixCache(RadixCache):
    def __init__(
        self,
        page_size: int,
        *,
        host_pool: HostPool,
        write_policy: str,
        eviction_policy: str = "lru",
        free_slots: Callable[[list[SlotArray]], None] | None = None,
        on_stored: Callable[[int], None] = lambda n: None,
        on_host_evicted: Callable[[int], None] = lambda n: None,
        clock: Callable[[], float] | None = None,
        events: RadixEventRecorder | None = None,
    ) -> None:
        self.host_pool = host_pool
        self.write_policy = write_policy
        self.is_write_back = write_policy == "write_back"
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.on_stored = on_stored
        self.on_host_evicted = on_host_evicted
        # Observes every copy: ("store" | "load", device slots, host slots), in slot order
        # (the shadow-KV tests move their model KV with it).
        self.on_transfer: Callable[[str, SlotArray, SlotArray], None] = lambda kind, d, h: None
        # Each node whose write-through copy acks (the L3 tier writes it on: hicache_storage.py).
        self.on_write_acked: Callable[[TreeNode], None] = lambda node: None
        self.ongoing_writes: dict[int, tuple[TreeNode, list[TreeNode]]] = {}
        self.ongoing_loads: list[TreeNode] = []  # anchors locked (device and host) until their ack
        self.full_host_duplicates: dict[int, TreeNode] = {}  # write_back reclaim order
        self._next_ack = 0
        kwargs = {} if clock is None else {"clock": clock}
        super().__init__(
            page_size, eviction_policy=eviction_policy, free_slots=free_slots, events=events, **kwargs
        )

    def reset(self) -> None:
        super().reset()
        self.ongoing_writes = {}
        self.ongoing_loads = []
        self.full_host_duplicates = {}
        # Under LRU (whose keys never fall) the host-only nodes are kept by (key, id), each
        # entry checked when it reaches the front (``_pop_host_leaf``), so evict_host need not
        # list the tree on every call as 0.5.23 does; other policies scan (``_scan_host_leaves``).
        self._host_index: SortedList | None = SortedList() if isinstance(self.policy, LRU) else None
        self._host_keys: dict[int, float] = {}  # node id -> its key in _host_index

    # ------------------------------------------------------------------ match / insert
    def match_with_host(self, key: RadixKey) -> HiMatch:
        """``match_prefix``: the device part, then the host-only tail (``_match_prefix_helper``)."""
        m = self.match_prefix(key)
        return HiMatch(m, m.last_visited, m.full_hit - m.length)

    def _count_hit(self, node: TreeNode) -> None:
        if self._inc_hit_count_and_check(node):
            self.write_backup(node)

    def _new_leaf(
        self, parent: TreeNode, key: RadixKey, value: SlotArray, now: float, priority: int, counted: bool
    ) -> TreeNode:
        """No policy ghost here; the hit counted as ``_count_hit`` counts, once the leaf is filed."""
        leaf = self._add_leaf(parent, key, value, now, priority)
        if counted:
            self._count_hit(leaf)
        return leaf

    def _inc_hit_count_and_check(self, node: TreeNode) -> bool:
        """0.5.23 ``_inc_hit_count_and_check``: no count on a host-only node nor under
        write_back; True when a not-backed-up node reaches the write-through threshold."""
        if node.evicted or self.is_write_back:
            return False
        node.hit_count += 1
        return not node.backuped and node.hit_count >= self.write_through_threshold

    def _unevict(self, node: TreeNode, fresh: SlotArray, track: bool = True) -> None:
        """``_unevict_node_on_insert``: a host-only node takes the inserter's fresh slots."""
        node.value = fresh.copy()
        if node.lock_ref > 0:
            self.protected_size_ += len(fresh)
        else:
            self.evictable_size_ += len(fresh)
        self.version += 1
        if track:
            self._track_duplicate(node)
        self._update_leaf_status(node)
        assert node.parent is not None
        self._update_leaf_status(node.parent)
        if self.events is not None:  # on device again (an insert's fresh KV, or a load)
            self.events.record_store(node)

    def _split_node(self, child: TreeNode, split_len: int, now: float) -> TreeNode:
        """RadixCache._split_node, and the host component's part: host slots split alike, a
        host-only prefix filed in the host index, a write in flight acked for both fragments
        (the upper first); the new node may be a device leaf over a host-only child."""
        host = child.host_value
        new = super()._split_node(child, split_len, now)
        if host is not None:
            new.host_value, child.host_value = host[:split_len].copy(), host[split_len:].copy()
            if new.value is None:
                self.index_host_only(new)
        new.write_ack = child.write_ack
        if child.write_ack is not None:
            fragments = self.ongoing_writes[child.write_ack][1]
            fragments.insert(fragments.index(child), new)
        self._track_duplicate(new)
        self._update_leaf_status(new)
        return new

    # ------------------------------------------------------------------ backup (D -> H)
    def write_backup(self, node: TreeNode, write_back: bool = False) -> int:
        """``_execute_and_commit_kv_backup``: back up ``node`` (write-through: its unbacked
        ancestors first), stopping at the first copy the host cannot take. Write-through
        copies lock their node until ``ack_writes``; a write-back copy acks at once. Returns
        the tokens of the last copy made (0: the chain stopped)."""
        chain = [node]
        if not write_back:
            up = node.parent
            while up is not None and up is not self.root_node:
                if up.backuped:
                    break
                chain.append(up)
                up = up.parent
            chain.reverse()
        written = 0
        for target in chain:
            if target.backuped:
                continue
            assert target.value is not None
            host = self._host_alloc(len(target.value))
            if host is None:
                return 0
            target.host_value = host
            self.on_transfer("store", target.value, host)
            self.on_stored(len(host))
            if write_back:  # acked at once (writing_check(write_back=True)): published now
                self._track_duplicate(target)
                if self.events is not None:
                    self.events.record_store(target, MEDIUM_HOST)
            else:
                self.inc_lock_ref(target)
                ack = self._next_ack
                self._next_ack += 1
                target.write_ack = ack
                self.ongoing_writes[ack] = (target, [target])
            written = len(host)
        return written

    def ack_writes(self) -> int:
        """Every write-through copy in flight completes (``writing_check``): unlock each
        node. Returns the number of acks."""
        acks = list(self.ongoing_writes.items())
        self.ongoing_writes = {}
        for ack, (lock_node, nodes) in acks:
            for node in nodes:
                if node.write_ack == ack:
                    node.write_ack = None
                    self._track_duplicate(node)
                if self.events is not None:  # finish_write_through: every fragment published
                    self.events.record_store(node, MEDIUM_HOST)
            self.dec_lock_ref(lock_node)
            for node in nodes:  # _finish_write_through_ack: every fragment goes on to L3
                self.on_write_acked(node)
        return len(acks)

    def ack_loads(self) -> int:
        """``loading_check``: every load finished; unpin its anchor (both tiers)."""
        loads, self.ongoing_loads = self.ongoing_loads, []
        for anchor in loads:
            self.dec_lock_ref(anchor)
            anchor.host_lock_ref -= 1
            self.finish_load(anchor)
        return len(loads)

    def _host_alloc(self, num_tokens: int) -> SlotArray | None:
        avail = self.host_pool.available_size()
        if avail < num_tokens:
            needed = num_tokens - avail
            if self.evict_host(needed) < needed:
                return None
        return self.host_pool.alloc(num_tokens)

    # ------------------------------------------------------------------ device eviction
    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        """0.5.23 ``_is_device_leaf``: on device, unlocked, no child on device."""
        return (
            not node.evicted
            and node.lock_ref == 0
            and node is not self.root_node
            and all(c.evicted for c in node.children.values())
        )

    def _evict_leaf(self, leaf: TreeNode, freed: list[int], runs: list[SlotArray]) -> None:
        """A backed-up victim is demoted to host-only, an unbacked one deleted (write_back: backed
        up first, deleted if the host is full), its device slots freed at once."""
        assert leaf.value is not None
        freed[0] += len(leaf.value)
        if not leaf.backuped and self.is_write_back and self.write_backup(leaf, write_back=True) == 0:
            self._drop_subtree(leaf)  # host full: dropped without a backup
        elif leaf.backuped:
            self._demote(leaf)
        else:
            self._drop_subtree(leaf)

    def _demote(self, node: TreeNode) -> None:
        assert node.value is not None and node.backuped and node.lock_ref == 0
        self.free_slots([node.value])
        self.evictable_size_ -= len(node.value)
        node.value = None
        self.version += 1  # its duplicate entry goes stale, not away (0.5.23 sweeps lazily)
        self.index_host_only(node)
        self._update_leaf_status(node)
        assert node.parent is not None
        self._update_leaf_status(node.parent)
        if self.events is not None:
            self.events.record_remove(node)

    def _drop_subtree(self, node: TreeNode) -> None:
        """Delete an unbacked device leaf and its host-only subtree (its device slots go to
        ``free_slots``, host slots back to the host pool)."""
        assert node.value is not None and node.lock_ref == 0
        stack: list[TreeNode] = list(node.children.values())
        dropped = []
        while stack:
            sub = stack.pop()
            assert sub.evicted and sub.host_value is not None
            stack.extend(sub.children.values())
            self._free_host(sub)
            dropped.append(sub)
        node.children = {}
        self.free_slots([node.value])
        self._delete_leaf(node)
        if self.events is not None:  # drop_subtree_no_host: the deepest first, then the node
            for sub in reversed(dropped):
                self.events.record_remove(sub, MEDIUM_HOST)
            self.events.record_remove(node)

    # ------------------------------------------------------------------ host eviction
    def _is_host_leaf(self, node: TreeNode) -> bool:
        return (
            node is not self.root_node
            and node.evicted
            and node.backuped
            and node.host_lock_ref == 0
            and node.lock_ref == 0
            and not node.children
        )

    def evict_host(self, num_tokens: int) -> int:
        """``drive_host_eviction``: free host slots of at least ``num_tokens`` if possible;
        returns the host tokens freed."""
        freed = 0
        if self.is_write_back:
            freed = self._reclaim_full_host_duplicates(num_tokens)
        order = self._scan_host_leaves() if self._host_index is None else None
        while freed < num_tokens:
            node = self._pop_host_leaf() if order is None else self._pop_scanned(order)
            if node is None:
                break
            assert node.host_value is not None and node.parent is not None
            if self.events is not None:
                self.events.record_remove(node, MEDIUM_HOST)
            freed += len(node.host_value)
            parent = node.parent
            self._free_host(node)
            self.full_host_duplicates.pop(node.id, None)
            parent.children.pop(node.key.child_key(self.page_size))
            self.version += 1
            self._update_leaf_status(parent)
            if order is not None and self._is_host_leaf(parent):
                heapq.heappush(order, (self.policy.priority(parent), parent.id, parent))
        return freed

    def _scan_host_leaves(self) -> list[tuple[object, int, TreeNode]]:
        """Every host leaf as a heap by (policy priority, id): 0.5.23's listing of the tree."""
        order = [(self.policy.priority(n), n.id, n) for n in self._host_nodes() if self._is_host_leaf(n)]
        heapq.heapify(order)
        return order

    def _pop_scanned(self, order: list[tuple[object, int, TreeNode]]) -> TreeNode | None:
        while order:
            _, _, node = heapq.heappop(order)
            if self._is_host_leaf(node):
                return node
        return None

    def index_host_only(self, node: TreeNode) -> None:
        """``node`` just became host-only (demoted, split off a host-only node, or fetched
        from storage): file it in the host index (one entry a node)."""
        index = self._host_index
        if index is None:
            return
        old = self._host_keys.pop(node.id, None)
        if old is not None:
            index.remove((old, node.id, node))
        key = node.last_access_time
        self._host_keys[node.id] = key
        index.add((key, node.id, node))

    def _pop_host_leaf(self) -> TreeNode | None:
        """The host leaf the scan would pop first (lowest LRU key, then id), taken out of the
        index. From the front: an entry no longer host-only is dropped, one stamped since moves
        to its key now (keys only grow, so it moves back), one with children or a host lock stays."""
        index = self._host_index
        assert index is not None
        i = 0
        while i < len(index):
            key, nid, node = index[i]
            if not (node.evicted and node.backuped):  # revived or its copy freed: gone
                del index[i]
                del self._host_keys[nid]
            elif node.last_access_time != key:
                del index[i]
                self._host_keys[nid] = node.last_access_time
                index.add((node.last_access_time, nid, node))
            elif self._is_host_leaf(node):
                del index[i]
                del self._host_keys[nid]
                return node
            else:
                i += 1
        return None

    def _reclaim_full_host_duplicates(self, num_tokens: int) -> int:
        """write_back: drop host copies of device-resident nodes first, sparing device
        eviction candidates in a first pass (their eviction would keep the copy)."""
        freed = 0
        swept: list[int] = []
        for spare_candidates in (True, False):
            for nid, node in self.full_host_duplicates.items():
                if freed >= num_tokens:
                    break
                if node.value is None or node.host_value is None:
                    swept.append(nid)  # stale: demoted or reclaimed since it was registered
                    continue
                if spare_candidates and node.id in self._leaf_entry:
                    continue
                if not self._is_settled_duplicate(node) or node.host_lock_ref:
                    continue
                if self.events is not None:
                    self.events.record_remove(node, MEDIUM_HOST)
                freed += len(node.host_value)
                self._free_host(node)
                swept.append(nid)
        for nid in swept:
            self.full_host_duplicates.pop(nid, None)
        return freed

    def _free_host(self, node: TreeNode) -> None:
        assert node.host_value is not None
        self.host_pool.free(node.host_value)
        self.on_host_evicted(len(node.host_value))
        node.host_value = None

    def _is_settled_duplicate(self, node: TreeNode) -> bool:
        return (
            node.value is not None
            and node.host_value is not None
            and node.write_ack is None
            and not node.load_pending
        )

    def _track_duplicate(self, node: TreeNode) -> None:
        if self._is_settled_duplicate(node):
            self.full_host_duplicates.setdefault(node.id, node)
        else:
            self.full_host_duplicates.pop(node.id, None)

    def _host_nodes(self) -> list[TreeNode]:
        return [n for n in self.iter_nodes() if n.backuped]

    # ------------------------------------------------------------------ load back (H -> D)
    def evicted_path(self, best_node: TreeNode) -> list[TreeNode]:
        """The host-only nodes ending at ``best_node``, top-down (what load_back loads)."""
        path: list[TreeNode] = []
        node: TreeNode | None = best_node
        while node is not None and node is not self.root_node and node.evicted:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def revive(self, node: TreeNode, slots: SlotArray) -> None:
        """``commit_load_back``: a host-only node gets device slots; its copy stays, and
        becomes a reclaimable duplicate only at the load's ack (``finish_load``)."""
        assert node.evicted and node.host_value is not None and len(slots) == len(node.host_value)
        self.on_transfer("load", slots, node.host_value)
        node.load_pending = self.is_write_back
        self._unevict(node, slots, track=False)

    def finish_load(self, anchor: TreeNode) -> None:
        """``finish_load_back``: along the anchor's root path, clear write_back's load pins
        and register the host copies now duplicated on device."""
        node: TreeNode | None = anchor
        while node is not None and node is not self.root_node:
            if self.is_write_back:
                if not node.load_pending:
                    node = node.parent
                    continue
                node.load_pending = False
            self._track_duplicate(node)
            node = node.parent

    # ------------------------------------------------------------------ inspection
    def total_size(self) -> int:
        return sum(len(n.value) for n in self.iter_nodes() if n.value is not None)

    def host_size(self) -> int:
        return sum(len(n.host_value) for n in self._host_nodes() if n.host_value is not None)

    def check(self) -> None:
        evictable = protected = 0
        expected: set[int] = set()
        for node in self.iter_nodes():
            parent = node.parent
            assert parent is not None, f"{node} detached"
            assert node.value is not None or node.host_value is not None, f"{node}: deleted but linked"
            for slots in (node.value, node.host_value):
                assert slots is None or len(slots) == len(node.key) > 0, f"{node}: slots != key length"
            assert len(node.key) % self.page_size == 0, f"{node}: key not whole pages"
            assert parent.children.get(node.key.child_key(self.page_size)) is node, f"{node} misfiled"
            assert node.lock_ref >= 0 and node.host_lock_ref >= 0, f"{node}: negative lock"
            if node.value is not None:
                assert parent is self.root_node or parent.value is not None, f"{node}: on device, parent not"
                if node.lock_ref > 0:
                    protected += len(node.value)
                    assert parent is self.root_node or parent.lock_ref > 0, f"{node} locked, parent not"
                else:
                    evictable += len(node.value)
            else:
                assert node.lock_ref == 0, f"{node}: host-only and locked"
                assert node.write_ack is None, f"{node}: host-only with a write in flight"
                filed = self._host_keys.get(node.id, math.inf)
                assert self._host_index is None or filed <= node.last_access_time, (
                    f"{node}: host-only, filed in the host index under {filed}"
                )
            if node.write_ack is not None:
                assert node.write_ack in self.ongoing_writes, f"{node}: unknown ack {node.write_ack}"
                assert node.lock_ref > 0, f"{node}: write in flight without its lock"
            if self._is_evictable_leaf(node):
                expected.add(node.id)
        assert (evictable, protected) == (self.evictable_size_, self.protected_size_), (
            f"sizes drifted: counted {evictable}/{protected}, "
            f"kept {self.evictable_size_}/{self.protected_size_}"
        )
        assert set(self._leaf_entry) == expected, "device-leaf index != evictable device nodes"
        assert self._host_index is None or len(self._host_index) == len(self._host_keys)
        assert self.root_node.lock_ref == 1
