"""Chained block hashing (vLLM ``kv_cache_utils.py``): the hash of block i fingerprints the
whole prefix ``[0, (i+1) * block_size)`` because it folds in the hash of block i-1.

Consequences the rest of the backend relies on:
  * prefix match = look blocks up left to right and stop at the first miss;
  * a full block's hash never changes (tokens are append-only), so a request memoises its
    hashes and only hashes blocks that became full since the last call.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NewType

import cbor2
import xxhash as _xxhash

from prefixcache.request import Request

BlockHash = NewType("BlockHash", bytes)
# BlockHash + 4-byte big-endian group id: same tokens in two attention groups -> two keys.
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
HashFn = Callable[[Any], bytes]


# ---------------------------------------------------------------- hash functions
def sha256(obj: Any) -> bytes:
    """vLLM's default: SHA-256 of the pickled object (stable within one Python version)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of canonical CBOR: reproducible across processes, versions and languages."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash(obj: Any) -> bytes:
    """xxh3-128 of the pickled object: fast, not cryptographic."""
    return _xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    """xxh3-128 of canonical CBOR."""
    return _xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


def builtin_unsafe(obj: Any) -> bytes:
    """UNSAFE baseline, for cost comparisons only: Python's 64-bit ``hash``.

    vLLM removed it: crafted prompts can collide and read another tenant's KV (a CVE).
    """
    return hash(obj).to_bytes(8, "big", signed=True)


HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
    "builtin": builtin_unsafe,
}
# Processes must agree on NONE_HASH for these even without PYTHONHASHSEED.
CRYPTOGRAPHIC = frozenset({sha256, sha256_cbor})
FIXED_SEED = "vllm-none-hash"  # vLLM 0.33 DEFAULT_NONE_HASH_SEED: the same chain roots as vLLM
# Drawn once per process: non-cryptographic hashes get an unguessable chain root.
_PROCESS_SEED = os.urandom(32)


def get_hash_fn(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown hash_fn {name!r}; valid: {', '.join(HASH_FUNCTIONS)}") from None


# ---------------------------------------------------------------- NONE_HASH
_NONE_HASHES: dict[HashFn, BlockHash] = {}


def init_none_hash(hash_fn: HashFn) -> BlockHash:
    """(Re)compute NONE_HASH, the parent of every first block, for ``hash_fn``.

    Seed: $PYTHONHASHSEED if set; else a fixed string for cryptographic functions; else a
    random per-process seed. (vLLM 0.33 uses os.urandom(32) itself as NONE_HASH whenever
    PYTHONHASHSEED is unset; we follow REFERENCE A1 so sha256 caches agree across processes.)
    """
    env_seed = os.environ.get("PYTHONHASHSEED")
    if env_seed is not None:
        seed: object = env_seed
    elif hash_fn in CRYPTOGRAPHIC:
        seed = FIXED_SEED
    else:
        seed = _PROCESS_SEED
    value = BlockHash(hash_fn(seed))
    _NONE_HASHES[hash_fn] = value
    return value


def none_hash(hash_fn: HashFn) -> BlockHash:
    """NONE_HASH for ``hash_fn``, computed once per process."""
    value = _NONE_HASHES.get(hash_fn)
    return value if value is not None else init_none_hash(hash_fn)


# ---------------------------------------------------------------- block hashes
def hash_block_tokens(
    hash_fn: HashFn,
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))."""
    if not parent_block_hash:
        parent_block_hash = none_hash(hash_fn)
    return BlockHash(hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


def chain_block_hashes(
    hash_fn: HashFn, parent: BlockHash, blocks: Iterable[tuple[int, ...]], out: list[BlockHash]
) -> None:
    """``hash_block_tokens`` along a chain without extra keys: each block of ``blocks`` hashed
    after ``parent`` (then after the block before it), appended to ``out``. For vLLM's
    default (sha256 of the pickle) the two calls per block are made here, in the loop: the
    same bytes, two Python calls a block fewer (tests/bench/test_bench_hashchain.py times the
    pair: 2.07 vs 2.37 ms for 2,048 blocks on 2026-12-05's 2-core VM)."""
    if hash_fn is sha256:
        dumps, digest, protocol = pickle.dumps, hashlib.sha256, pickle.HIGHEST_PROTOCOL
        for block in blocks:
            parent = BlockHash(digest(dumps((parent, block, None), protocol=protocol)).digest())
            out.append(parent)
        return
    for block in blocks:
        parent = hash_block_tokens(hash_fn, parent, block, None)
        out.append(parent)


def group_id_suffix(group_id: int) -> bytes:
    """The 4-byte big-endian group id that ends every hash-map key (the one encoding of it)."""
    return group_id.to_bytes(4, "big", signed=False)


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    return BlockHashWithGroupId(block_hash + group_id_suffix(group_id))


def generate_block_hash_extra_keys(req: Request, start: int, end: int) -> tuple[Any, ...] | None:
    """Extra keys of block ``[start, end)``: LoRA, then multimodal spans, then the salt.

    We differ from vLLM on purpose: keys are tagged tuples, so a LoRA named "x" and a salt "x"
    cannot produce the same key. Our Request carries no LoRA path, so path is None.
    """
    keys: list[Any] = []
    if req.lora_name is not None:
        keys.append(("lora", req.lora_name, None))
    for span in req.mm_hashes:  # sorted by offset
        if span.offset >= end:
            break
        if span.offset + span.length > start:
            # Offset relative to the block (may be negative): the same image at another
            # position inside otherwise equal placeholder blocks gives another key.
            keys.append(("mm", span.identifier, span.offset - start))
    if start == 0 and req.cache_salt is not None:
        keys.append(("cache_salt", req.cache_salt))
    return tuple(keys) if keys else None


class RequestHashes:
    """One request's block hashes, and the hash-map keys built from them per group.

    ``hashes`` are per hash unit (vLLM's hash_block_size); a block of ``units_per_block`` units
    is keyed by the hash at its last unit (vLLM 0.33 ``BlockHashListWithBlockSize``)."""

    __slots__ = ("hashes", "units_per_block", "_keys")

    def __init__(self, units_per_block: int = 1) -> None:
        self.hashes: list[BlockHash] = []
        self.units_per_block = units_per_block
        self._keys: dict[int, list[BlockHashWithGroupId]] = {}

    @property
    def num_blocks(self) -> int:
        """Full blocks hashed so far."""
        return len(self.hashes) // self.units_per_block

    def keys(self, group_id: int) -> list[BlockHashWithGroupId]:
        """The keys of group ``group_id`` for every full block so far (each built once)."""
        keys = self._keys.setdefault(group_id, [])
        n, u = self.num_blocks, self.units_per_block
        if len(keys) < n:
            suffix = group_id_suffix(group_id)  # as make_block_hash_with_group_id, per list
            # block i ends at unit (i + 1) * u - 1
            keys += [h + suffix for h in self.hashes[(len(keys) + 1) * u - 1 : n * u : u]]  # type: ignore[misc]
        return keys


# A source of prompt block hashes computed before (``known_prompt_hashes`` of the backend):
# called with (request, tokens per hash, hash function, NONE_HASH), it returns the hashes of
# the request's full prompt units exactly as ``hash_block_tokens`` chains them (no extra
# keys), or None when it does not know the request. Hashes depend only on those settings and
# the tokens, so a sweep's cells and reruns can share them (experiments/inputs/trace_hashes.py).
KnownPromptHashes = Callable[[Request, int, HashFn, BlockHash], "Sequence[BlockHash] | None"]


class BlockHasher:
    """vLLM's ``request_block_hasher``: hashes each request's newly full blocks, once.

    vLLM keeps the list on its Request; ours is shared by caches of other block sizes and hash
    functions, so the hasher owns it, weakly keyed by the request: it lives while the request
    does and is never looked up by a cache it does not belong to. With ``known`` it takes the
    prompt's hashes from there instead of computing them (requests without extra keys).
    """

    __slots__ = ("block_size", "hash_fn", "none_hash", "units_per_block", "known", "_of")

    def __init__(
        self, block_size: int, hash_fn: HashFn, units_per_block: int = 1,
        known: KnownPromptHashes | None = None,
    ) -> None:
        """``block_size``: the tokens each hash covers (vLLM's hash_block_size); a cache block
        is ``units_per_block`` of them."""
        self.block_size = block_size
        self.units_per_block = units_per_block
        self.hash_fn = hash_fn
        self.none_hash = none_hash(hash_fn)
        self.known = known
        self._of: weakref.WeakKeyDictionary[Request, RequestHashes] = weakref.WeakKeyDictionary()

    def request_hashes(self, req: Request) -> RequestHashes:
        """``req``'s hashes of all its full blocks (only blocks full since the last call are hashed)."""
        record = self._of.get(req)
        if record is None:
            record = self._of[req] = RequestHashes(self.units_per_block)
        hashes = record.hashes
        size = self.block_size
        start = len(hashes) * size
        end = req.num_tokens // size * size  # [start, end): the blocks full since the last call
        if start >= end:
            return record
        needs_extra_keys = req.lora_name is not None or req.mm_hashes or req.cache_salt is not None
        if self.known is not None and not needs_extra_keys and start < req.num_prompt_tokens // size * size:
            known = self.known(req, size, self.hash_fn, self.none_hash)
            if known is not None:
                hashes.extend(known[len(hashes) : end // size])
                start = len(hashes) * size
                if start >= end:
                    return record
        parent = hashes[-1] if hashes else self.none_hash
        tokens = iter(req.token_ids(start, end))
        blocks = zip(*[tokens] * size, strict=True)  # the new full blocks as token tuples, cut in C
        if not needs_extra_keys:
            chain_block_hashes(self.hash_fn, parent, blocks, hashes)
            return record
        for first, block in zip(range(start, end, size), blocks, strict=True):
            extra = generate_block_hash_extra_keys(req, first, first + size)
            parent = hash_block_tokens(self.hash_fn, parent, block, extra)
            hashes.append(parent)
        return record

    def block_hashes(self, req: Request) -> list[BlockHash]:
        return self.request_hashes(req).hashes
