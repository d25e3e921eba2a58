"""REFERENCE A1: chained block hashing, NONE_HASH seeding, extra keys, incremental hashing."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import xxhash as _xxhash
from prefixcache.backends.hashchain import hashing
from prefixcache.backends.hashchain.hashing import (
    FIXED_SEED,
    HASH_FUNCTIONS,
    BlockHasher,
    chain_block_hashes,
    generate_block_hash_extra_keys,
    get_hash_fn,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    none_hash,
    sha256,
    sha256_cbor,
    xxhash,
)

from prefixcache import Request
from tests.helpers import tokens

ALL_NAMES = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "builtin"]


@pytest.fixture
def restore_none_hashes() -> Iterator[None]:
    saved = dict(hashing._NONE_HASHES)
    yield
    hashing._NONE_HASHES.clear()
    hashing._NONE_HASHES.update(saved)


class CountingHash:
    """Wraps a hash function and counts its calls."""

    def __init__(self, fn: Any = sha256) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, obj: Any) -> bytes:
        self.calls += 1
        return self.fn(obj)


def test_hash_functions_are_offered_by_name_and_unknown_names_list_the_valid_ones() -> None:
    assert sorted(HASH_FUNCTIONS) == sorted(ALL_NAMES)
    assert get_hash_fn("sha256") is sha256
    with pytest.raises(ValueError, match="valid: sha256, sha256_cbor, xxhash, xxhash_cbor, builtin"):
        get_hash_fn("md5")
    assert "UNSAFE" in (get_hash_fn("builtin").__doc__ or "")


def test_sha256_is_sha256_of_the_pickle_and_xxhash_is_xxh3_128() -> None:
    obj = (b"p", (1, 2, 3), None)
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    assert sha256(obj) == hashlib.sha256(data).digest()
    assert xxhash(obj) == _xxhash.xxh3_128_digest(data)
    assert len(xxhash(obj)) == 16


def test_sha256_cbor_hashes_the_canonical_cbor_bytes_so_any_language_reproduces_it() -> None:
    parent = bytes(32)
    # RFC 8949 by hand: array(3) [bytes(32), array(4) [1, 2, 3, 4], null]
    encoded = b"\x83" + b"\x58\x20" + parent + b"\x84\x01\x02\x03\x04" + b"\xf6"
    assert sha256_cbor((parent, (1, 2, 3, 4), None)) == hashlib.sha256(encoded).digest()
    assert get_hash_fn("xxhash_cbor")((parent, (1, 2, 3, 4), None)) == _xxhash.xxh3_128_digest(encoded)


def test_hash_block_tokens_hashes_parent_token_tuple_and_extra_keys() -> None:
    parent = b"x" * 32
    assert hash_block_tokens(sha256, parent, [1, 2], ("k",)) == sha256((parent, (1, 2), ("k",)))
    assert hash_block_tokens(sha256, None, [1, 2]) == sha256((none_hash(sha256), (1, 2), None))


def test_block_hash_chains_so_a_change_in_any_earlier_block_changes_every_later_hash() -> None:
    hasher = BlockHasher(4, sha256)
    base = tokens(16)
    changed = list(base)
    changed[1] += 1
    a = hasher.block_hashes(Request("a", base))
    b = hasher.block_hashes(Request("b", changed))
    assert a[0] != b[0] and all(x != y for x, y in zip(a, b, strict=True))
    c = list(base)
    c[13] += 1
    assert hasher.block_hashes(Request("c", c))[:3] == a[:3]


@pytest.mark.parametrize("name", ["sha256", "sha256_cbor"])
def test_none_hash_of_cryptographic_functions_is_a_fixed_seed_without_pythonhashseed(
    name: str, monkeypatch: pytest.MonkeyPatch, restore_none_hashes: None
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    fn = get_hash_fn(name)
    assert init_none_hash(fn) == fn(FIXED_SEED)
    assert none_hash(fn) == fn(FIXED_SEED)
    # vLLM 0.33's DEFAULT_NONE_HASH_SEED (v1/core/kv_cache_utils.py): our chains, and the block
    # hashes our KV events publish, are vLLM's own without PYTHONHASHSEED.
    assert FIXED_SEED == "vllm-none-hash"


@pytest.mark.parametrize("name", ALL_NAMES)
def test_none_hash_is_seeded_from_pythonhashseed_when_set(
    name: str, monkeypatch: pytest.MonkeyPatch, restore_none_hashes: None
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    fn = get_hash_fn(name)
    assert init_none_hash(fn) == fn("123")


def _child_none_hash(name: str, env: dict[str, str]) -> str:
    code = (
        "from prefixcache.backends.hashchain.hashing import get_hash_fn, none_hash;"
        f"print(none_hash(get_hash_fn({name!r})).hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_none_hash_of_xxhash_is_random_per_process_but_sha256_agrees_across_processes(
    monkeypatch: pytest.MonkeyPatch, restore_none_hashes: None
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    here_xx = init_none_hash(xxhash)
    assert here_xx == xxhash(hashing._PROCESS_SEED) and none_hash(xxhash) == here_xx  # stable here
    assert _child_none_hash("xxhash", env) != here_xx.hex()
    assert _child_none_hash("sha256_cbor", env) == init_none_hash(sha256_cbor).hex()


def test_extra_keys_are_tagged_lora_then_multimodal_spans_then_salt_on_first_block_only() -> None:
    req = Request(
        "r",
        tokens(12),
        lora_name="adapter",
        cache_salt="tenant",
        mm_hashes=[("img1", 2, 4), ("img2", 7, 2)],
    )
    assert generate_block_hash_extra_keys(req, 0, 4) == (
        ("lora", "adapter", None),
        ("mm", "img1", 2),
        ("cache_salt", "tenant"),
    )
    # Block [4, 8): img1 started 2 tokens before it (negative offset), img2 starts inside it.
    assert generate_block_hash_extra_keys(req, 4, 8) == (
        ("lora", "adapter", None),
        ("mm", "img1", -2),
        ("mm", "img2", 3),
    )
    assert generate_block_hash_extra_keys(req, 8, 12) == (("lora", "adapter", None), ("mm", "img2", -1))
    assert generate_block_hash_extra_keys(Request("p", tokens(8)), 0, 4) is None


def test_tags_keep_a_lora_name_and_a_salt_with_the_same_string_apart() -> None:
    hasher = BlockHasher(4, sha256)
    prompt = tokens(8)
    lora = hasher.block_hashes(Request("a", prompt, lora_name="x"))
    salt = hasher.block_hashes(Request("b", prompt, cache_salt="x"))
    assert lora[0] != salt[0]


def test_salt_enters_only_the_first_block_and_later_blocks_inherit_it_through_the_chain() -> None:
    hasher = BlockHasher(4, sha256)
    salted = hasher.block_hashes(Request("a", tokens(8), cache_salt="s"))
    first = hash_block_tokens(sha256, None, tokens(8)[:4], (("cache_salt", "s"),))
    assert salted == [first, hash_block_tokens(sha256, first, tokens(8)[4:], None)]


def test_block_hash_with_group_id_appends_four_big_endian_bytes() -> None:
    h = hashing.BlockHash(b"\xab" * 32)
    key = make_block_hash_with_group_id(h, 258)
    assert key == h + b"\x00\x00\x01\x02"
    assert key[:-4] == h and int.from_bytes(key[-4:], "big") == 258
    assert make_block_hash_with_group_id(h, 0) != make_block_hash_with_group_id(h, 1)


def test_incremental_hashing_hashes_each_full_block_exactly_once() -> None:
    counter = CountingHash()
    hasher = BlockHasher(4, counter)
    counter.calls = 0  # the NONE_HASH seed call
    req = Request("r", tokens(10))
    first = list(hasher.block_hashes(req))
    assert counter.calls == 2 and len(first) == 2  # 10 tokens: 2 full blocks, partial not hashed
    assert hasher.block_hashes(req) == first and counter.calls == 2  # memoised
    req.append_output_token_ids(1)
    hasher.block_hashes(req)
    assert counter.calls == 2  # 11 tokens: still 2 full blocks
    req.append_output_token_ids([2, 3, 4, 5, 6])
    hashes = hasher.block_hashes(req)
    assert counter.calls == 4 and len(hashes) == 4  # 16 tokens: blocks 2 and 3 hashed once each
    # Same as hashing from scratch: output tokens are chained like prompt tokens.
    fresh = BlockHasher(4, counter).block_hashes(Request("s", list(req.all_token_ids)))
    assert hashes == fresh


def test_block_hash_memo_is_per_hasher_so_block_sizes_do_not_mix() -> None:
    req = Request("r", tokens(16))
    four = BlockHasher(4, sha256).block_hashes(req)
    eight = BlockHasher(8, sha256).block_hashes(req)
    assert len(four) == 4 and len(eight) == 2 and eight[0] != four[1]


def test_a_hasher_forgets_a_request_once_nobody_holds_it() -> None:
    import gc

    hasher = BlockHasher(4, sha256)
    req = Request("r", tokens(16))
    hasher.block_hashes(req)
    assert len(hasher._of) == 1
    del req
    gc.collect()
    assert len(hasher._of) == 0


def plain_block_hashes(req: Request, block_size: int, hash_fn: Any) -> list[bytes]:
    """REFERENCE A1 written out: hash_block_tokens over every full block, extra keys and all."""
    out: list[bytes] = []
    parent = None
    for start in range(0, req.num_tokens - block_size + 1, block_size):
        extra = generate_block_hash_extra_keys(req, start, start + block_size)
        parent = hash_block_tokens(hash_fn, parent, req.all_token_ids[start : start + block_size], extra)
        out.append(parent)
    return out


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"cache_salt": "t"},
        {"lora_name": "a"},
        {"mm_hashes": [("img", 5, 6)]},
        {"cache_salt": "t", "lora_name": "a"},
    ],
)
def test_incremental_block_hasher_gives_the_plain_definitions_hashes(
    name: str, options: dict[str, Any]
) -> None:
    """Hashing as the request grows, extra keys only where it has some, changes no hash."""
    fn = get_hash_fn(name)
    for block_size in (1, 3, 4, 16):
        req = Request("r", [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, *tokens(60)], **options)
        hasher = BlockHasher(block_size, fn)
        hasher.block_hashes(req)  # then grow it and hash incrementally, as decoding does
        req.append_output_token_ids(tokens(2 * block_size + 1, seed=9))
        assert hasher.block_hashes(req) == plain_block_hashes(req, block_size, fn)
        keys = hasher.request_hashes(req).keys(3)
        assert keys == [make_block_hash_with_group_id(h, 3) for h in hasher.block_hashes(req)]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_chained_block_hashes_are_hash_block_tokens_one_after_another(name: str) -> None:
    """``chain_block_hashes`` (sha256's inlined loop included) gives, byte for byte, the
    chain of ``hash_block_tokens`` calls: each block after the one before it, from the parent."""
    fn = get_hash_fn(name)
    blocks = [tuple(tokens(16, seed=i)) for i in range(5)] + [tuple([0] * 16), tuple([31_999] * 16)]
    parent = none_hash(fn)
    want = []
    for block in blocks:
        parent = hash_block_tokens(fn, parent, block, None)
        want.append(parent)
    got = [b"seen"]
    chain_block_hashes(fn, none_hash(fn), iter(blocks), got)
    assert got[0] == b"seen" and got[1:] == want, "appended to what the list held, in order"
    got = []
    chain_block_hashes(fn, want[2], iter(blocks[3:]), got)
    assert got == want[3:], "a chain resumed from its last hash"
