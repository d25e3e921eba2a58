"""Block hashes of a Mooncake trace's prompts, computed once and kept on disk.

vLLM's chained block hashes depend only on the tokens, the tokens per hash, the hash function
and NONE_HASH (our trace requests carry no extra keys). A trace prompt is its hash ids' 512-token
blocks (``traces._blocks_tokens``), so the hashes of one 512-token block after a given prefix of
hash ids are the same in every request that shares the prefix, in every cell of a sweep and in
every rerun. ``TracePromptHashes`` computes each such block's hashes once (a node of the trie
over hash-id prefixes), lazily, and ``save`` keeps them in a store keyed by all of that (the
records' content, vocabulary, tokens per hash, hash function, NONE_HASH, Python's pickle), which
later runs memory-map and read instead of hashing: a run reads the rows of the blocks its
requests reach, when they reach them, and nothing else of the file. The hashchain backend takes
it as ``known_prompt_hashes``: hashes read equal hashes computed (tests/test_trace_hashes.py),
so a run's results do not change, only its hashing time.

Tokens per hash must divide 512 (else the request is hashed as usual). The store lives under
``$PREFIXCACHE_CACHE`` (default ``~/.cache/prefixcache``) in ``block_hashes/``; a store over
``MAX_STORE_BYTES`` is kept in memory only.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from prefixcache.backends.hashchain.hashing import HASH_FUNCTIONS, BlockHash, HashFn, chain_block_hashes
from prefixcache.experiments.inputs.traces import MOONCAKE_BLOCK, TraceRecord, _blocks_tokens

from prefixcache import Request

FORMAT = 2  # 2: one .npy of (node, hashes) rows, memory-mapped (1: an .npz read whole)
MAX_STORE_BYTES = 1 << 30


def cache_dir() -> Path:
    return Path(os.environ.get("PREFIXCACHE_CACHE", Path.home() / ".cache" / "prefixcache")) / "block_hashes"


class TracePromptHashes:
    """``KnownPromptHashes`` for requests made by ``traces.iter_requests(records, vocab_size=,
    prefix=)``: request ``f"{prefix}-{i}"`` is record i. Unknown ids, records without hash ids
    (Azure) and lengths that disagree get None (hashed as usual)."""

    def __init__(
        self, records: Sequence[TraceRecord], *, vocab_size: int = 32_000, prefix: str = "trace",
        directory: Path | None = None,
    ) -> None:
        self.records = records
        self.vocab_size = vocab_size
        self.prefix = prefix + "-"
        self.directory = directory if directory is not None else cache_dir()
        # The trie over hash-id prefixes: node of (parent node, hash id); node -1 is the root.
        nodes: dict[tuple[int, int], int] = {}
        self.parents: list[int] = []
        self.block_ids: list[int] = []
        self.paths: list[list[int]] = []  # each record's nodes, one per 512-token block
        for rec in records:
            parent, path = -1, []
            for h in rec.hash_ids:
                node = nodes.get((parent, h))
                if node is None:
                    node = nodes[(parent, h)] = len(self.parents)
                    self.parents.append(parent)
                    self.block_ids.append(h)
                path.append(node)
                parent = node
            self.paths.append(path)
        digest = hashlib.sha256(f"{FORMAT}/{vocab_size}/".encode())
        for rec in records:
            fields = (rec.input_length, len(rec.hash_ids), *rec.hash_ids)
            digest.update(np.asarray(fields, dtype=np.int64).tobytes())
        self.records_digest = digest.hexdigest()[:20]
        self._stores: dict[tuple[int, HashFn, BlockHash], _Store] = {}

    def __call__(
        self, req: Request, unit: int, hash_fn: HashFn, none_hash: BlockHash
    ) -> list[BlockHash] | None:
        rid = req.request_id
        if not rid.startswith(self.prefix) or MOONCAKE_BLOCK % unit:
            return None
        try:
            index = int(rid[len(self.prefix) :])
        except ValueError:
            return None
        if not 0 <= index < len(self.records):
            return None
        rec = self.records[index]
        if not rec.hash_ids or rec.input_length != req.num_prompt_tokens:
            return None
        store = self._stores.get((unit, hash_fn, none_hash))
        if store is None:
            store = self._stores[(unit, hash_fn, none_hash)] = _Store(self, unit, hash_fn, none_hash)
        return store.prompt_hashes(index, rec.input_length // unit)

    @property
    def computed(self) -> int:
        """Block hashes computed (not read) so far, over every store."""
        return sum(store.computed for store in self._stores.values())

    @property
    def read(self) -> int:
        """Block hashes handed out that a store already held."""
        return sum(store.read for store in self._stores.values())

    def save(self) -> None:
        """Write every store that gained hashes (atomically: a reader sees the old or the new)."""
        for store in self._stores.values():
            store.save()


class _Store:
    """One setting's hashes: per trie node, the 512 / unit hashes of its block, as bytes.

    On disk: one ``.npy`` of rows (trie node, its hashes), memory-mapped when the store opens; a
    node's row is copied out the first time a request reaches it."""

    def __init__(self, owner: TracePromptHashes, unit: int, hash_fn: HashFn, none_hash: BlockHash) -> None:
        self.owner = owner
        self.unit = unit
        self.hash_fn = hash_fn
        self.none_hash = none_hash
        self.per_node = MOONCAKE_BLOCK // unit
        self.width = len(none_hash)  # the digest's bytes (NONE_HASH is one of its digests)
        self.row_type = np.dtype([("node", "<i8"), ("hashes", "u1", (self.per_node * self.width,))])
        # a node's hashes are its bytes cut at these (no call per unit to read them)
        self._units = [slice(j * self.width, (j + 1) * self.width) for j in range(self.per_node)]
        name = next((n for n, f in HASH_FUNCTIONS.items() if f is hash_fn), None)
        key = hashlib.sha256(
            f"{owner.records_digest}/{unit}/{name}/{none_hash.hex()}/{sys.version_info[:2]}/"
            f"{pickle.HIGHEST_PROTOCOL}".encode()
        ).hexdigest()[:24]
        self.path = None if name is None else owner.directory / f"{key}.npy"
        self.nodes: list[bytes | None] = [None] * len(owner.parents)
        self.computed = self.read = 0
        self._new = 0
        # the mapped file's rows, and the row of each node it holds (-1: none)
        self._mapped: np.ndarray | None = None
        self._row_of = np.full(len(self.nodes), -1, dtype=np.int64)
        if self.path is not None and self.path.exists():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            mapped = np.load(self.path, mmap_mode="r")
        except (OSError, ValueError):
            return  # unreadable: computed again and rewritten
        if mapped.dtype != self.row_type or mapped.ndim != 1:
            return
        nodes = np.asarray(mapped["node"])
        if nodes.size and (nodes.min() < 0 or nodes.max() >= len(self.nodes)):
            return
        if np.unique(nodes).size != nodes.size:
            return
        self._mapped = mapped
        self._row_of[nodes] = np.arange(nodes.size)
        parents = np.asarray(self.owner.parents)
        roots = nodes[parents[nodes] == -1].tolist()
        if roots and self._hash_node(roots[0]) != self._node(roots[0]):  # another machine's pickle?
            self._mapped = None
            self._row_of[:] = -1
            self.nodes = [None] * len(self.nodes)

    def _hash_node(self, node: int) -> bytes:
        parent_node = self.owner.parents[node]
        parent = self.none_hash if parent_node < 0 else self._node(parent_node)[-self.width :]
        tokens = iter(_blocks_tokens([self.owner.block_ids[node]], self.owner.vocab_size).tolist())
        out: list[BlockHash] = []
        chain_block_hashes(self.hash_fn, BlockHash(parent), zip(*[tokens] * self.unit, strict=True), out)
        return b"".join(out)

    def _node(self, node: int) -> bytes:
        """The node's hashes: held, else read from the mapped file, else computed."""
        value = self.nodes[node]
        if value is None:
            row = self._row_of[node]
            if row >= 0:
                assert self._mapped is not None
                value = self.nodes[node] = self._mapped[row]["hashes"].tobytes()
            else:
                value = self.nodes[node] = self._hash_node(node)
                self.computed += self.per_node
                self._new += 1
        return value

    def prompt_hashes(self, index: int, num_units: int) -> list[BlockHash]:
        out: list[BlockHash] = []
        for node in self.owner.paths[index]:
            if len(out) >= num_units:
                break
            computed = self.computed
            raw = self._node(node)
            take = min(self.per_node, num_units - len(out))
            out += map(raw.__getitem__, self._units[:take])  # bytes: BlockHash values
            if self.computed == computed:
                self.read += take
        return out

    def save(self) -> None:
        """Write the file's rows and the new ones as a new file (atomically: a reader sees the
        old or the new); nothing past ``MAX_STORE_BYTES``."""
        if not self._new or self.path is None:
            return
        fresh = [n for n, b in enumerate(self.nodes) if b is not None and self._row_of[n] < 0]
        old = 0 if self._mapped is None else len(self._mapped)
        if (old + len(fresh)) * self.row_type.itemsize > MAX_STORE_BYTES:
            return
        rows = np.empty(old + len(fresh), dtype=self.row_type)
        if old:
            rows[:old] = self._mapped
        rows["node"][old:] = fresh
        hashes = np.frombuffer(b"".join(self.nodes[n] for n in fresh), dtype=np.uint8)  # type: ignore[misc]
        rows["hashes"][old:] = hashes.reshape(len(fresh), -1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, rows)
        os.replace(tmp, self.path)
        for stale in self.path.parent.glob("*.npz"):  # FORMAT 1's stores: no reader is left
            stale.unlink(missing_ok=True)
        # read on from the new file, so a later save does not write these rows twice
        self._mapped = np.load(self.path, mmap_mode="r")
        self._row_of[rows["node"]] = np.arange(len(rows))
        self._new = 0
