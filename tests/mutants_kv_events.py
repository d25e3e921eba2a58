"""Mutants of the KV-event emission of both backends and of the router's event index (same
shape as tests/mutants.py): each breaks one behaviour; the suites in SUITES must fail under
it (checked by hand, in a copy of the repo)."""

from __future__ import annotations

SUITES = [
    "tests/test_kv_events_backends.py",
    "tests/test_routers.py",
    "tests/test_radix_hybrid_events.py",
]

# name -> (file, original text, mutated text); the original text occurs exactly once
MUTANTS: dict[str, tuple[str, str, str]] = {
    "kv events hashchain: no BlockRemoved when a cached block is reused (lazy eviction)": (
        "backends/hashchain/block_pool.py",
        "self.kv_events.emit_block_removed_events([key for b in blocks for key in self._keys_of(b)])",
        "pass",
    ),
    "kv events hashchain: no BlockRemoved when a hash is dropped one by one (LRU / ranked evict)": (
        "backends/hashchain/block_pool.py",
        "        if self.kv_events is not None:\n            self.kv_events.emit_block_removed_events(keys)",
        "        if False:\n            self.kv_events.emit_block_removed_events(keys)",
    ),
    "kv events hashchain: the parent is the first new block's hash, not the one before it": (
        "backends/hashchain/events.py",
        "parent = self._external(block_keys[num_cached_blocks - 1]) if num_cached_blocks else None",
        "parent = self._external(block_keys[num_cached_blocks]) if num_cached_blocks else None",
    ),
    "kv events hashchain: masked (sliding-window) blocks listed in BlockStored": (
        "backends/hashchain/events.py",
        "block_hashes=[self._external(key) for key in stored_keys],",
        "block_hashes=[self._external(key) for key in block_keys[num_cached_blocks:num_full_blocks]],",
    ),
    "kv events hashchain: no AllBlocksCleared at a reset": (
        "backends/hashchain/events.py",
        "        self.kv_event_queue.append(AllBlocksCleared())",
        "        pass",
    ),
    "kv events radix: no BlockRemoved for a leaf a component's phase deletes (SWA, Mamba)": (
        "backends/radix/radix_cache.py",
        "        self._remove_leaf(leaf, freed)\n        self.free_slots([value])\n",
        "        events, self.events = self.events, None\n"
        "        self._remove_leaf(leaf, freed)\n        self.free_slots([value])\n"
        "        self.events = events\n",
    ),
    "kv events radix: no BlockStored for a new leaf (dense, SWA, Mamba)": (
        "backends/radix/radix_cache.py",
        "        if self.events is not None:\n            self.events.record_store(leaf)\n",
        "",
    ),
    "kv events hicache: a write-through ack publishes no host copy": (
        "backends/radix/hicache_tree.py",
        "                if self.events is not None:  # finish_write_through: every fragment published\n"
        "                    self.events.record_store(node, MEDIUM_HOST)\n",
        "",
    ),
    "kv events hicache: a split fragment under a write is published after the lower part": (
        "backends/radix/hicache_tree.py",
        "            fragments.insert(fragments.index(child), new)",
        "            fragments.append(new)",
    ),
    "kv events hicache: a demoted node's device copy is not removed": (
        "backends/radix/hicache_tree.py",
        "        if self.events is not None:\n            self.events.record_remove(node)\n",
        "",
    ),
    "kv events radix: no BlockRemoved for an evicted leaf": (
        "backends/radix/radix_cache.py",
        "            self.events.record_remove(leaf)",
        "            pass",
    ),
    "kv events radix: a leaf's parent hash is its parent node's first page, not its last": (
        "backends/radix/events.py",
        "parent_hash = event_hash(self._node_digests(parent)[-1]) if parent.parent is not None else None",
        "parent_hash = event_hash(self._node_digests(parent)[0]) if parent.parent is not None else None",
    ),
    "kv events radix: a split node keeps the head of its digests instead of the tail": (
        "backends/radix/events.py",
        "kept = self._digests[node.id] = kept[len(kept) - num_pages :]",
        "kept = self._digests[node.id] = kept[:num_pages]",
    ),
    "kv events radix: a salted chain is not seeded by its salt": (
        "backends/radix/events.py",
        "prior = None if salt is None else hashlib.sha256(SALT_SEED_TAG + salt.encode()).digest()",
        "prior = None",
    ),
    "kv events index: a sliding-window group's events indexed as if full attention": (
        "prefixcache/cluster/routers/event_index.py",
        "            return full\n",
        "            return True\n",
    ),
    "kv events radix: consecutive removals not merged into one BlockRemoved (SGLang's enqueue)": (
        "backends/radix/events.py",
        "            tail.block_hashes.extend(event.block_hashes)\n            return\n        if (",
        "            pass\n        if (",
    ),
    "kv events index: a removed duplicate takes the block out while a copy is still cached": (
        "prefixcache/cluster/routers/event_index.py",
        "                    copies[engine_hash] -= 1\n",
        "                    copies[engine_hash] = 0\n",
    ),
}
