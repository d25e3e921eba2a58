"""KV events of the radix tree, as SGLang 0.5.23 records them (``mem_cache/events.py``
``KVCacheEventRecorder``, called by ``radix_cache.py``), in vLLM's schema (prefixcache.kv_events).

Where: ``BlockStored`` for the pages of each new leaf an insert creates (a split stores
nothing: the pages were stored already), ``BlockRemoved`` for the pages of each leaf eviction
deletes, ``AllBlocksCleared`` at every reset, the one the tree's construction runs included.
Consecutive events of one kind merge as SGLang's ``enqueue`` merges them: removals into one,
stores into one when the next page's parent is the last page of the previous store.

Hashes: SGLang's page hash is SHA-256 over the previous page's digest (none for a first page)
and the page's token ids as little-endian uint32 (a page holding an id >= 2**32: a 0xff tag
and uint64 ids); the event carries the digest's first 8 bytes as a signed big-endian int64.
A salted namespace seeds its chain with SHA-256(b"sglang-cache-salt-v1\\0" + salt); the LoRA
part of a namespace does not enter the event hash (SGLang's non-Dynamo format publishes no
LoRA namespace unless an adapter name is registered, which our requests never do). The
parent of a leaf's first page is the last page of its parent node; None under the root.

Digests are kept per node id and computed at most once per page: a split keeps the lower
part in the old node (which keeps the tail of its digests) and makes the upper part a new
node, whose digests are recomputed from its parent on first use.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Protocol

import numpy as np
from prefixcache.backends.radix.key import RadixKey


class TreeNode(Protocol):
    """What the recorder reads of a node, of any tree (tree.py, radix_cache.py)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> RadixKey: ...
    @property
    def parent(self) -> TreeNode | None: ...

SALT_SEED_TAG = b"sglang-cache-salt-v1\0"
MEDIUM_GPU = "GPU"
MEDIUM_HOST = "CPU_PINNED"  # SGLang's StorageMedium.CPU (HiCache's host pool)
_UINT32_MAX = (1 << 32) - 1


def page_digest(prior: bytes | None, tokens: np.ndarray) -> bytes:
    """SGLang's ``hash_page`` for one page of token ids."""
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    if len(tokens) and int(tokens.max()) > _UINT32_MAX:
        h.update(b"\xff")
        h.update(tokens.astype("<u8").tobytes())
    else:
        h.update(tokens.astype("<u4").tobytes())
    return h.digest()


def page_digests(prior: bytes | None, tokens: np.ndarray, page_size: int) -> list[bytes]:
    """``page_digest`` chained over every whole page of ``tokens``. When every id fits 32 bits
    (always, for real vocabularies) the run is checked and encoded once and each page is one
    digest over a slice of it, not a check and an encoding per page."""
    n = len(tokens) - len(tokens) % page_size
    out: list[bytes] = []
    if n and int(tokens[:n].max()) > _UINT32_MAX:
        for start in range(0, n, page_size):
            prior = page_digest(prior, tokens[start : start + page_size])
            out.append(prior)
        return out
    data, width = memoryview(tokens[:n].astype("<u4").tobytes()), 4 * page_size
    for start in range(0, 4 * n, width):
        h = hashlib.sha256() if prior is None else hashlib.sha256(prior)
        h.update(data[start : start + width])
        prior = h.digest()
        out.append(prior)
    return out


def event_hash(digest: bytes) -> int:
    """SGLang's ``hash_str_to_int64`` of the hex digest: its first 8 bytes, signed."""
    return struct.unpack(">q", digest[:8])[0]  # type: ignore[no-any-return]


def salt_of(extra_key: Any) -> str | None:
    """The cache salt of a namespace (backend.extra_key: None or (lora_name, salt))."""
    return None if extra_key is None else extra_key[1]


class RadixEventRecorder:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._queue: list[Any] = []
        self._tail_salt: str | None = None  # SGLang also merges stores only within one salt
        self._digests: dict[int, list[bytes]] = {}  # node id -> page digests (maybe a longer tail)

    # ------------------------------------------------------------------ hashes
    def _node_digests(self, node: TreeNode) -> list[bytes]:
        num_pages = len(node.key) // self.page_size
        kept = self._digests.get(node.id)
        if kept is not None and len(kept) >= num_pages:
            if len(kept) > num_pages:  # split since: the node kept the lower pages
                kept = self._digests[node.id] = kept[len(kept) - num_pages :]
            return kept
        parent = node.parent
        assert parent is not None, f"{node} is the root or detached"
        if parent.parent is not None:
            prior: bytes | None = self._node_digests(parent)[-1]
        else:
            salt = salt_of(node.key.extra_key)
            prior = None if salt is None else hashlib.sha256(SALT_SEED_TAG + salt.encode()).digest()
        digests = page_digests(prior, node.key.token_ids[: num_pages * self.page_size], self.page_size)
        self._digests[node.id] = digests
        return digests

    # ------------------------------------------------------------------ recording
    def record_store(self, node: TreeNode, medium: str = MEDIUM_GPU) -> None:
        from prefixcache.kv_events import BlockStored

        parent = node.parent
        assert parent is not None
        parent_hash = event_hash(self._node_digests(parent)[-1]) if parent.parent is not None else None
        salt = salt_of(node.key.extra_key)
        tokens, p = node.key.token_ids.tolist(), self.page_size
        for i, digest in enumerate(self._node_digests(node)):
            h = event_hash(digest)
            page = tokens[i * p : (i + 1) * p]
            self._enqueue(
                BlockStored(
                    block_hashes=[h],
                    parent_block_hash=parent_hash,
                    token_ids=page,
                    block_size=len(page),
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                ),
                salt,
            )
            parent_hash = h

    def record_remove(self, node: TreeNode, medium: str = MEDIUM_GPU) -> None:
        """After the leaf left the tree (its parent link is kept, as SGLang's), or, HiCache, its
        copy on one medium went (the node may stay: demoted, its digests recomputed on use)."""
        from prefixcache.kv_events import BlockRemoved

        hashes: list[bytes | int] = [event_hash(d) for d in self._node_digests(node)]
        del self._digests[node.id]
        if hashes:
            self._enqueue(BlockRemoved(block_hashes=hashes, medium=medium), None)

    def record_all_cleared(self) -> None:
        from prefixcache.kv_events import AllBlocksCleared

        self._digests.clear()
        self._enqueue(AllBlocksCleared(), None)

    def _enqueue(self, event: Any, salt: str | None) -> None:
        """SGLang's ``KVCacheEventRecorder.enqueue``: merge into a compatible queue tail."""
        tail = self._queue[-1] if self._queue else None
        kind = type(event).__name__
        if tail is not None and type(tail).__name__ == kind == "BlockRemoved" and tail.medium == event.medium:
            tail.block_hashes.extend(event.block_hashes)
            return
        if (
            tail is not None
            and type(tail).__name__ == kind == "BlockStored"
            and (tail.medium, tail.lora_id, tail.block_size, tail.lora_name, self._tail_salt)
            == (event.medium, event.lora_id, event.block_size, event.lora_name, salt)
            and tail.block_hashes
            and event.parent_block_hash == tail.block_hashes[-1]
        ):
            tail.block_hashes.extend(event.block_hashes)
            tail.token_ids.extend(event.token_ids)
            return
        self._queue.append(event)
        self._tail_salt = salt

    def take_events(self) -> list[Any]:
        """The queued events, oldest first (SGLang's ``take_events``); the queue is left empty."""
        events, self._queue = self._queue, []
        return events
