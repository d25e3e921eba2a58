"""REFERENCE A2: KVCacheBlock and FreeKVCacheBlockQueue, checked against a plain list model."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.free_queue import FreeKVCacheBlockQueue


def make(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def test_setting_a_hash_on_a_block_that_has_one_is_an_error() -> None:
    block = KVCacheBlock(3)
    block.assign_hash(b"h" * 36)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already has a hash"):
        block.assign_hash(b"g" * 36)  # type: ignore[arg-type]
    assert block.block_hash == b"h" * 36
    block.reset_hash()
    block.assign_hash(b"g" * 36)  # type: ignore[arg-type]
    assert block.block_hash == b"g" * 36


def test_blocks_have_slots_and_no_dict() -> None:
    assert not hasattr(KVCacheBlock(0), "__dict__")


def test_queue_starts_in_ascending_block_id_and_popleft_takes_the_head() -> None:
    blocks, q = make(5)
    assert ids(q) == [0, 1, 2, 3, 4] and q.num_free_blocks == 5
    assert q.popleft() is blocks[0]
    assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None
    assert [b.block_id for b in q.popleft_n(3)] == [1, 2, 3]
    assert ids(q) == [4] and q.num_free_blocks == 1


def test_popleft_on_an_empty_queue_raises_no_free_blocks_available() -> None:
    _, q = make(1)
    q.popleft()
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    with pytest.raises(ValueError, match="only 0 free"):
        q.popleft_n(1)
    assert q.popleft_n(0) == []


def test_remove_takes_a_block_out_of_the_middle_and_rejects_unlinked_blocks() -> None:
    blocks, q = make(5)
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and q.num_free_blocks == 4
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(blocks[2])


def test_append_goes_to_the_tail_and_prepend_n_keeps_the_given_order_at_the_head() -> None:
    blocks, q = make(6)
    taken = q.popleft_n(6)
    q.append(taken[3])
    q.append_n([taken[5], taken[4]])
    assert ids(q) == [3, 5, 4]
    q.prepend_n([taken[0], taken[1]])
    assert ids(q) == [0, 1, 3, 5, 4]
    q.prepend_n([taken[2]])  # a later prepend goes in front
    assert ids(q) == [2, 0, 1, 3, 5, 4] and q.num_free_blocks == 6


def test_linking_a_block_that_is_already_free_is_refused() -> None:
    blocks, q = make(3)
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(blocks[1])
    with pytest.raises(ValueError, match="already in the free queue"):
        q.prepend_n([blocks[0]])


class FreeQueueMachine(RuleBasedStateMachine):
    """Every operation against a plain Python list of ids (head = index 0)."""

    N = 12

    def __init__(self) -> None:
        super().__init__()
        self.blocks, self.queue = make(self.N)
        self.model = list(range(self.N))

    def taken(self) -> list[int]:
        return [i for i in range(self.N) if i not in self.model]

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self) -> None:
        assert self.queue.popleft().block_id == self.model.pop(0)

    @rule(n=st.integers(0, 5))
    def popleft_n(self, n: int) -> None:
        if n > len(self.model):
            with pytest.raises(ValueError):
                self.queue.popleft_n(n)
            return
        got = [b.block_id for b in self.queue.popleft_n(n)]
        assert got == self.model[:n]
        del self.model[:n]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self.model))
        self.queue.remove(self.blocks[block_id])
        self.model.remove(block_id)

    @precondition(lambda self: len(self.model) < FreeQueueMachine.N)
    @rule(data=st.data(), front=st.booleans())
    def link_some(self, data: st.DataObject, front: bool) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.taken()), min_size=1, max_size=4, unique=True))
        if front:
            self.queue.prepend_n([self.blocks[i] for i in chosen])
            self.model[:0] = chosen
        elif len(chosen) == 1:
            self.queue.append(self.blocks[chosen[0]])
            self.model.append(chosen[0])
        else:
            self.queue.append_n([self.blocks[i] for i in chosen])
            self.model.extend(chosen)

    @invariant()
    def matches_model_both_ways(self) -> None:
        assert ids(self.queue) == self.model
        assert self.queue.num_free_blocks == len(self.model)
        back = []
        curr = self.queue.fake_free_list_tail.prev_free_block
        while curr is not self.queue.fake_free_list_head:
            assert curr is not None and curr.next_free_block is not None
            assert curr.next_free_block.prev_free_block is curr
            back.append(curr.block_id)
            curr = curr.prev_free_block
        assert back[::-1] == self.model
        for i in self.taken():
            assert self.blocks[i].prev_free_block is None and self.blocks[i].next_free_block is None


TestFreeQueueAgainstListModel = FreeQueueMachine.TestCase
