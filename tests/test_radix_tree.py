"""REFERENCE B2/B3 at the tree level: reset, match/split, insert, locks, evict, disable, pages."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import numpy as np
import pytest
from prefixcache.backends.radix import RadixCache, RadixKey, TreeNode


class CheckedTree:
    """Runs ``RadixCache.check()`` after every public call."""

    def __init__(self, tree: RadixCache) -> None:
        self.tree = tree
        tree.check()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.tree, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self.tree.check()

        return call


def make_tree(page_size: int = 1, **kw: Any) -> Any:
    freed: list[list[int]] = []
    clock = itertools.count(1).__next__
    tree = RadixCache(
        page_size, free_slots=lambda runs: freed.extend(s.tolist() for s in runs), clock=clock, **kw
    )
    checked = CheckedTree(tree)
    checked.freed = freed  # type: ignore[attr-defined]
    return checked


def K(*tokens: int, ns: Any = None) -> RadixKey:
    return RadixKey(list(tokens), extra_key=ns)


def node_at(tree: Any, *tokens: int) -> TreeNode:
    """The node whose path ends exactly at ``tokens`` (asserts there is one)."""
    m = tree.tree.match_prefix(K(*tokens))
    assert m.length == len(tokens)
    return m.last_node


# ---------------------------------------------------------------- B2 TreeNode


def test_treenode_fields_counter_and_ordering() -> None:
    a, b = TreeNode(now=5.0), TreeNode(now=3.0)
    assert b.id == a.id + 1, "the class counter advances on every construction"
    assert (a.lock_ref, a.hit_count, a.priority, a.children, a.parent) == (0, 0, 0, {}, None)
    assert a.creation_time == a.last_access_time == 5.0
    assert b < a and not a < b, "ordering is by last_access_time"
    a.value = None
    assert a.evicted


# ---------------------------------------------------------------- reset / match


def test_reset_gives_a_root_locked_once_with_sizes_zero() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3))
    t.reset()
    root = t.root_node
    assert root.lock_ref == 1 and root.priority == -sys.maxsize and len(root.key) == 0
    assert (t.evictable_size(), t.protected_size(), t.total_size()) == (0, 0, 0)
    assert t.evict(100) == 0 and t.match_prefix(K(1, 2, 3)).length == 0


def test_match_returns_length_concatenated_slots_and_last_node() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3), np.array([10, 11, 12]))
    t.insert(K(1, 2, 3, 4, 5), np.array([0, 0, 0, 13, 14]))
    m = t.match_prefix(K(1, 2, 3, 4, 5, 6))
    assert m.length == 5 and m.indices.tolist() == [10, 11, 12, 13, 14]
    assert m.last_node.key.tolist() == [4, 5]


@pytest.mark.parametrize("along", [False, True])
@pytest.mark.parametrize("start", [0, 2, 3, 4, 5, 6])
def test_match_indices_from_gives_the_slots_from_that_token_on(start: int, along: bool) -> None:
    """Edges [1 2 3] and [4 5]: slots of tokens [start, 5) only, cut inside an edge where
    ``start`` falls inside one, found by tokens and by the parent links of ``along`` alike."""
    t = make_tree()
    t.insert(K(1, 2, 3), np.array([10, 11, 12]))
    t.insert(K(1, 2, 3, 4, 5), np.array([0, 0, 0, 13, 14]))
    end = node_at(t, 1, 2, 3, 4, 5)
    m = t.match_prefix(K(1, 2, 3, 4, 5, 6), along=end if along else None, indices_from=start)
    assert m.length == 5 and m.last_node is end
    assert m.indices.tolist() == [10, 11, 12, 13, 14][start:]


def test_insert_value_from_takes_the_slots_of_the_uncached_tail_only() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3), np.array([10, 11, 12]))
    assert t.insert(K(1, 2, 3, 4, 5), np.array([13, 14]), value_from=3) == 3
    assert t.match_prefix(K(1, 2, 3, 4, 5)).indices.tolist() == [10, 11, 12, 13, 14]
    with pytest.raises(ValueError, match="not cached and have no slots"):
        t.insert(K(1, 7, 8, 9), np.array([20]), value_from=3)  # [1, 3) is not cached
    with pytest.raises(ValueError, match="slot indices from token 2"):
        t.insert(K(1, 2, 3, 6), np.array([20]), value_from=2)  # one slot for two tokens
    assert t.match_prefix(K(1, 7)).length == 1 and t.match_prefix(K(1, 2, 3, 6)).length == 3


def test_match_stamps_last_access_time_on_every_visited_node_root_included() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3))
    t.insert(K(1, 2, 4))
    other = node_at(t, 1, 2, 4)
    before = other.last_access_time
    m = t.match_prefix(K(1, 2, 3, 9))
    stamp = m.last_node.last_access_time
    assert m.last_node.parent.last_access_time == stamp == t.root_node.last_access_time
    assert other.last_access_time == before


def test_match_splits_where_the_query_ends_inside_an_edge() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5, 6))
    m = t.match_prefix(K(1, 2, 3))
    assert m.length == 3 and m.last_node.key.tolist() == [1, 2, 3]
    (child,) = m.last_node.children.values()
    assert child.key.tolist() == [4, 5, 6]
    assert (t.total_size(), t.evictable_size(), t.protected_size()) == (6, 6, 0)


def test_match_splits_at_divergence_and_size_counters_do_not_change() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5, 6))
    m = t.match_prefix(K(1, 2, 9, 9))
    assert m.length == 2 and m.last_node.key.tolist() == [1, 2]
    assert (t.total_size(), t.evictable_size(), t.protected_size()) == (6, 6, 0)


def test_match_never_locks_and_never_counts_a_hit() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3))
    leaf = node_at(t, 1, 2, 3)
    hits = leaf.hit_count
    for _ in range(3):
        t.match_prefix(K(1, 2, 3))
    assert leaf.lock_ref == 0 and leaf.hit_count == hits and t.evictable_size() == 3


def test_split_copies_lock_ref_priority_hit_count_and_clones_values() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4), np.array([10, 11, 12, 13]), priority=7)
    t.insert(K(1, 2, 3, 4), np.array([0, 0, 0, 0]))  # a second request: hit_count 2
    leaf = node_at(t, 1, 2, 3, 4)
    t.inc_lock_ref(leaf)
    sizes = (t.evictable_size(), t.protected_size())
    upper = t.match_prefix(K(1, 2)).last_node
    assert upper is not leaf and leaf.parent is upper and upper.parent is t.root_node
    assert t.root_node.children[1] is upper
    copied = (upper.lock_ref, upper.priority, upper.hit_count)
    assert copied == (leaf.lock_ref, leaf.priority, leaf.hit_count) == (1, 7, 2)
    assert upper.value.tolist() == [10, 11] and leaf.value.tolist() == [12, 13]
    assert not np.shares_memory(upper.value, leaf.value)
    assert (t.evictable_size(), t.protected_size()) == sizes


# ---------------------------------------------------------------- insert


def test_insert_returns_the_length_already_cached_and_never_overwrites() -> None:
    t = make_tree()
    assert t.insert(K(1, 2, 3), np.array([10, 11, 12])) == 0
    assert t.insert(K(1, 2, 3, 4), np.array([20, 21, 22, 23])) == 3
    assert t.insert(K(1, 2, 5), np.array([30, 31, 32])) == 2
    assert t.match_prefix(K(1, 2, 3, 4)).indices.tolist() == [10, 11, 12, 23]
    assert t.match_prefix(K(1, 2, 5)).indices.tolist() == [10, 11, 32]
    assert t.evictable_size() == 5


def test_insert_raises_priority_to_the_max_along_the_path() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3), priority=1)
    t.insert(K(1, 2, 4), priority=5)
    assert node_at(t, 1, 2).priority == 5
    assert node_at(t, 1, 2, 3).priority == 1 and node_at(t, 1, 2, 4).priority == 5
    t.insert(K(1, 2, 3), priority=0)
    assert node_at(t, 1, 2).priority == 5, "priorities only go up"


def test_hit_count_counts_each_request_once_along_its_path() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4))  # request A
    t.insert(K(1, 2, 3, 4, 5, 6))  # request B
    assert node_at(t, 1, 2, 3, 4).hit_count == 2 and node_at(t, 1, 2, 3, 4, 5, 6).hit_count == 1
    # request C inserts its growing prefix three times (chunked prefill, then finish)
    t.insert(K(7, 8), hit_from=0)
    t.insert(K(7, 8, 9, 10), hit_from=2)
    t.insert(K(7, 8, 9, 10), hit_from=4)
    assert node_at(t, 7, 8).hit_count == 1 and node_at(t, 7, 8, 9, 10).hit_count == 1


def test_extra_key_namespaces_live_in_disjoint_subtrees() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, ns="a"), np.array([10, 11, 12]))
    assert t.match_prefix(K(1, 2, 3, ns="b")).length == 0
    assert t.match_prefix(K(1, 2, 3)).length == 0
    assert t.insert(K(1, 2, 3, ns="b"), np.array([20, 21, 22])) == 0
    assert set(t.root_node.children) == {("a", 1), ("b", 1)}
    assert t.match_prefix(K(1, 2, 3, ns="a")).indices.tolist() == [10, 11, 12]


# ---------------------------------------------------------------- locks


def test_lock_accounting_moves_exact_sizes_on_zero_one_transitions() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5, 6))
    t.insert(K(1, 2, 3, 7, 8))  # [1,2,3] -> [4,5,6], [7,8]
    a, b, mid = node_at(t, 1, 2, 3, 7, 8), node_at(t, 1, 2, 3, 4, 5, 6), node_at(t, 1, 2, 3)
    assert (t.evictable_size(), t.protected_size()) == (8, 0)
    assert t.inc_lock_ref(a) == -5
    assert (t.evictable_size(), t.protected_size(), a.lock_ref, mid.lock_ref) == (3, 5, 1, 1)
    assert t.inc_lock_ref(b) == -3, "[1,2,3] was already protected"
    assert (t.evictable_size(), t.protected_size(), mid.lock_ref) == (0, 8, 2)
    assert t.dec_lock_ref(a) == 2
    assert (t.evictable_size(), t.protected_size()) == (2, 6)
    assert t.dec_lock_ref(b) == 6
    assert (t.evictable_size(), t.protected_size(), mid.lock_ref) == (8, 0, 0)
    assert t.root_node.lock_ref == 1 and t.inc_lock_ref(t.root_node) == 0


def test_inc_lock_ref_locks_the_node_itself_not_only_its_ancestors() -> None:
    t = make_tree()
    t.insert(K(1, 2))
    t.insert(K(1, 2, 3, 4))
    leaf = node_at(t, 1, 2, 3, 4)
    t.inc_lock_ref(leaf)
    assert leaf.lock_ref == 1
    assert t.evict(100) == 0 and t.match_prefix(K(1, 2, 3, 4)).length == 4


def test_unbalanced_dec_lock_ref_raises_and_changes_nothing() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3))
    t.insert(K(1, 2, 3, 4))
    leaf, mid = node_at(t, 1, 2, 3, 4), node_at(t, 1, 2, 3)
    t.inc_lock_ref(mid)
    with pytest.raises(RuntimeError, match="unbalanced"):
        t.dec_lock_ref(leaf)  # leaf unlocked although its parent is locked
    assert (mid.lock_ref, leaf.lock_ref, t.protected_size(), t.evictable_size()) == (1, 0, 3, 1)
    t.dec_lock_ref(mid)
    with pytest.raises(RuntimeError, match="unbalanced"):
        t.dec_lock_ref(mid)


def _lock_state(t: Any) -> tuple:
    """Sizes, every node's lock count and the evictable leaves in eviction order, by path."""

    def path(node: TreeNode) -> tuple[int, ...]:
        tokens: list[int] = []
        while node.parent is not None:
            tokens[:0] = np.asarray(node.key.token_ids).tolist()
            node = node.parent
        return tuple(tokens)

    locks = sorted((path(n), n.lock_ref) for n in t.tree.iter_nodes())
    return t.evictable_size(), t.protected_size(), locks, [path(n) for n in t.tree.evictable_leaves()]


def _branching_tree() -> Any:
    t = make_tree()
    for key in [K(1, 2, 3, 4, 5, 6), K(1, 2, 3, 7, 8), K(1, 2, 9), K(10, 11), K(10, 11, 12, 13)]:
        t.insert(key)
    t.inc_lock_ref(node_at(t, 1, 2, 3, 7, 8))  # another request's lock: counts above 1 too
    return t


_PATHS = [(), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5, 6), (1, 2, 3, 7, 8), (1, 2, 9), (10, 11), (10, 11, 12, 13)]


@pytest.mark.parametrize("old", _PATHS)
@pytest.mark.parametrize("new", _PATHS)
def test_move_lock_leaves_what_inc_lock_ref_then_dec_lock_ref_leave(old: tuple, new: tuple) -> None:
    """A checkpoint moves its request's lock down its own path in one walk over the new nodes
    only; from any locked node to any node (its path or not, the root too) the tree ends as
    after the two calls, and the change in evictable size is theirs."""
    at = lambda t, p: node_at(t, *p) if p else t.root_node  # noqa: E731
    moved, called = _branching_tree(), _branching_tree()
    for t in (moved, called):
        t.inc_lock_ref(at(t, old))
    delta = moved.move_lock(at(moved, old), at(moved, new))
    expected = called.inc_lock_ref(at(called, new)) + called.dec_lock_ref(at(called, old))
    assert delta == expected
    assert _lock_state(moved) == _lock_state(called)


def test_move_lock_from_an_unlocked_node_raises_and_changes_nothing() -> None:
    t = _branching_tree()
    before = _lock_state(t)
    with pytest.raises(RuntimeError, match="unbalanced"):
        t.move_lock(node_at(t, 1, 2, 9), node_at(t, 1, 2, 9))
    with pytest.raises(RuntimeError, match="unbalanced"):
        t.move_lock(node_at(t, 10, 11), node_at(t, 10, 11, 12, 13))  # an unlocked ancestor
    assert _lock_state(t) == before


# ---------------------------------------------------------------- evict


def test_evict_frees_a_whole_leaf_even_if_that_overshoots() -> None:
    t = make_tree()
    t.insert(K(*range(10)), np.arange(100, 110))
    assert t.evict(1) == 10
    assert t.freed == [list(range(100, 110))]
    assert (t.total_size(), t.evictable_size()) == (0, 0)


def test_evict_collapses_a_parent_that_becomes_an_unlocked_childless_leaf() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5))
    t.insert(K(1, 2, 3, 6, 7))
    mid = node_at(t, 1, 2, 3)
    assert mid not in t.evictable_leaves()
    assert t.evict(4) == 4  # both leaves, stop
    assert t.evictable_leaves() == [mid] and not mid.children
    assert t.evict(1) == 3 and t.total_size() == 0


def test_evict_collapses_parents_within_one_call_and_reports_value_lengths() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5))
    t.insert(K(1, 2, 3, 6, 7))
    t.insert(K(9))
    assert t.evict(100) == 8 == sum(len(s) for s in t.freed)
    assert t.total_size() == 0 and t.root_node.children == {}


def test_evict_never_touches_a_locked_path() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4, 5))
    t.insert(K(1, 2, 3, 6, 7))
    t.inc_lock_ref(node_at(t, 1, 2, 3, 4, 5))
    assert t.evict(100) == 2
    assert t.match_prefix(K(1, 2, 3, 4, 5)).length == 5 and t.match_prefix(K(1, 2, 3, 6)).length == 3


def test_check_catches_accounting_by_key_length_instead_of_value_length() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4))
    leaf = node_at(t, 1, 2, 3, 4)
    leaf.value = leaf.value[:2]
    with pytest.raises(AssertionError, match="value length"):
        t.tree.check()


def test_check_catches_a_drifted_size_counter() -> None:
    t = make_tree()
    t.insert(K(1, 2, 3, 4))
    t.tree.evictable_size_ += 1
    with pytest.raises(AssertionError, match="drifted"):
        t.tree.check()


# ---------------------------------------------------------------- disable, pages


def test_disabled_tree_matches_nothing_inserts_nothing_locks_nothing_evicts_nothing() -> None:
    t = make_tree(disable=True)
    assert t.insert(K(1, 2, 3)) == 0
    m = t.match_prefix(K(1, 2, 3))
    assert m.length == 0 and m.last_node is t.root_node
    assert t.inc_lock_ref(t.root_node) == 0 and t.dec_lock_ref(t.root_node) == 0
    assert t.evict(10) == 0 and t.total_size() == 0


@pytest.mark.parametrize("page", [1, 2, 4])
def test_page_alignment_of_insert_and_match(page: int) -> None:
    t = make_tree(page)
    assert t.insert(K(*range(11))) == 0
    assert t.total_size() == 11 // page * page
    assert t.match_prefix(K(*range(11))).length == 11 // page * page
    # diverging at token 5 keeps only the whole pages before it
    assert t.match_prefix(K(0, 1, 2, 3, 4, 99, 6, 7)).length == 5 // page * page
    assert t.insert(K(0, 1, 2, 3, 4, 99, 6, 7)) == 5 // page * page


def test_a_key_empty_after_page_alignment_is_a_no_op() -> None:
    t = make_tree(4)
    assert t.insert(K(1, 2, 3)) == 0
    assert t.total_size() == 0 and t.root_node.children == {}
    m = t.match_prefix(K(1, 2, 3))
    assert m.length == 0 and m.last_node is t.root_node and len(m.indices) == 0


def test_paged_child_keys_file_whole_first_pages() -> None:
    t = make_tree(2)
    t.insert(K(1, 2, 3, 4))
    t.insert(K(1, 2, 5, 6))
    assert set(t.root_node.children) == {(1, 2)}
    assert set(node_at(t, 1, 2).children) == {(3, 4), (5, 6)}
