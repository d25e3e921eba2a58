"""The hashchain lookup memo (ours): a repeated lookup resumes where the last one stopped
while no block has left the hash map, and must return exactly what vLLM's fresh walk returns.

The memo rests on one counter, ``BlockHashToBlockMap.num_removals``; these tests pin down that
every way out of the map moves it and that lookups through the memo equal a fresh walk under
any interleaving of admissions, decode, releases, evictions and resets.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockHashToBlockMap, BlockPool
from prefixcache.backends.hashchain.hashing import BlockHash, make_block_hash_with_group_id

from prefixcache import CacheConfig, Request, make_cache

B = 4
SHARED = list(range(100, 100 + 6 * B))


def key(i: int) -> bytes:
    return make_block_hash_with_group_id(BlockHash(i.to_bytes(32, "big")), 0)


def fresh_walk(cache: Any, req: Request) -> list[KVCacheBlock]:
    """vLLM's get_computed_blocks without any memo: get_one_block per key to the first miss."""
    manager = cache.manager
    keys = manager.hasher.block_keys(req, 0)
    hash_map = manager.block_pool.cached_block_hash_to_block
    out: list[KVCacheBlock] = []
    for k in keys[: (req.num_tokens - 1) // B]:
        block = hash_map.get_one_block(k)
        if block is None:
            break
        out.append(block)
    return out


def test_every_removal_from_the_map_moves_the_counter_and_inserts_do_not() -> None:
    m = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(6)]
    m.insert_many([key(0), key(1), key(1), key(2)], blocks[:4])  # key(1) duplicated
    assert m.num_removals == 0 and m.num_duplicated_keys == 1
    assert m.pop(key(9), 0) is None and m.num_removals == 0  # nothing there: nothing counted
    assert m.pop(key(0), blocks[0].block_id) is blocks[0] and m.num_removals == 1
    for b, k in ((blocks[1], key(1)), (blocks[2], key(1)), (blocks[3], key(2))):
        b._block_hash = k  # type: ignore[assignment]
    # evict_hashed takes the duplicate's second block out, leaving the first under key(1)
    assert m.evict_hashed([blocks[2], blocks[4]]) == 1
    assert m.num_removals == 2 and blocks[2].block_hash is None and m.num_duplicated_keys == 0
    assert m.get_one_block(key(1)) is blocks[1]
    m.clear()
    assert m.num_removals == 4 and len(m) == 0


def test_evicting_the_first_block_of_a_duplicated_key_promotes_the_second() -> None:
    pool = BlockPool(8)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_blocks([BlockHash(b"x" * 32)], [first], 0, 1, B, 0)
    pool.cache_full_blocks([BlockHash(b"x" * 32)], [second], 0, 1, B, 0)
    pool.free_blocks([first, second])
    pool.check_invariants()
    removals = pool.cached_block_hash_to_block.num_removals
    pool.get_new_blocks(5)  # the five unhashed blocks first; the cached two stay
    assert pool.cached_block_hash_to_block.num_removals == removals
    (popped,) = pool.get_new_blocks(1)  # the head of the hashed ones: `first`
    assert popped is first and first.block_hash is None
    assert pool.cached_block_hash_to_block.get_one_block(key_of(second)) is second
    assert pool.cached_block_hash_to_block.num_removals == removals + 1
    assert pool.num_evicted_blocks == 1
    pool.check_invariants()


def key_of(block: KVCacheBlock) -> bytes:
    assert block.block_hash is not None
    return block.block_hash


def test_a_repeated_lookup_after_an_eviction_sees_the_shorter_prefix() -> None:
    cache = make_cache("hashchain", CacheConfig(capacity_tokens=8 * B, page_size=B))
    prompt = list(range(100, 100 + 4 * B))
    a = Request("a", prompt)
    assert cache.allocate(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    cache.commit(a)
    cache.release(a)
    b = Request("b", prompt + [7])
    assert cache.lookup(b) == 4 * B  # memoised: four blocks
    c = Request("c", list(range(500, 500 + 5 * B)))
    assert cache.allocate(c, c.num_tokens)  # needs five of the seven blocks: evicts
    assert cache.lookup(b) == len(fresh_walk(cache, b)) * B < 4 * B


class LookupMemoMachine(RuleBasedStateMachine):
    """Requests over a shared vocabulary in a small pool, so prefixes overlap and blocks are
    evicted; each lookup through the memo must equal a fresh walk, block for block."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache("hashchain", CacheConfig(capacity_tokens=10 * B, page_size=B))
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.count = 0

    @rule(shared=st.integers(0, 6 * B), tail=st.lists(st.integers(0, 2), max_size=B))
    def arrive(self, shared: int, tail: list[int]) -> None:
        """A prompt that starts with ``shared`` tokens of one common document."""
        self.count += 1
        prompt = SHARED[:shared] + tail or [0]
        self.waiting.append(Request(f"r{self.count}", prompt, max_new_tokens=8))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 7))
    def lookup(self, i: int) -> None:
        req = self.waiting[i % len(self.waiting)]
        blocks, hit = self.cache.manager.get_computed_blocks(req)
        assert blocks == fresh_walk(self.cache, req)
        assert hit == len(blocks) * B == self.cache.lookup(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 7))
    def admit(self, i: int) -> None:
        req = self.waiting[i % len(self.waiting)]
        expected = fresh_walk(self.cache, req)
        if self.cache.allocate(req, req.num_tokens - self.cache.lookup(req)):
            assert self.cache.page_table(req)[: len(expected)] == [b.block_id for b in expected]
            req.num_computed_tokens = req.num_tokens
            self.cache.commit(req)
            self.waiting.remove(req)
            self.running.append(req)

    @precondition(lambda self: any(r.num_output_tokens < r.max_new_tokens for r in self.running))
    @rule(i=st.integers(0, 7), token=st.integers(0, 2))
    def decode(self, i: int, token: int) -> None:
        """One token for a request with room left under max_new_tokens (the longest request,
        6 blocks of prompt + 8 outputs, then still fits the pool)."""
        decoding = [r for r in self.running if r.num_output_tokens < r.max_new_tokens]
        req = decoding[i % len(decoding)]
        req.append_output_token_ids(token)
        if self.cache.allocate(req, 1):
            req.num_computed_tokens += 1
            self.cache.commit(req)
        else:  # preempted: it waits again, its own blocks now cached
            self.cache.release(req)
            req.num_computed_tokens = 0
            self.running.remove(req)
            self.waiting.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 7))
    def finish(self, i: int) -> None:
        req = self.running.pop(i % len(self.running))
        self.cache.release(req)

    @rule(n=st.integers(1, 3 * B))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self) -> None:
        assert self.cache.reset()

    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()


TestLookupMemoMachine = LookupMemoMachine.TestCase
