"""The trace's prompt-hash store (issue 28, item 3): hashes read equal hashes computed, for every
hash function and hash unit, across sharing prefixes and partial tails; a later run reads
instead of hashing; a store it cannot trust is computed again; runs give the same results."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from prefixcache.backends.hashchain.hashing import BlockHasher, get_hash_fn
from prefixcache.experiments.inputs.trace_hashes import TracePromptHashes
from prefixcache.experiments.inputs.traces import TraceRecord, iter_requests, read_mooncake, resolve

from prefixcache import CacheConfig, Engine, Request, make_cache

# shared first blocks, a branch, partial last blocks (not a multiple of 512 or of the unit)
RECORDS = [
    TraceRecord(0.0, 1300, 4, (1, 2, 3)),
    TraceRecord(0.0, 1100, 4, (1, 2, 4)),
    TraceRecord(0.0, 512, 4, (1,)),
    TraceRecord(0.0, 700, 4, (5, 6)),
    TraceRecord(0.0, 1537, 4, (1, 2, 3, 7)),
]


def computed_hashes(req: Request, unit: int, fn: str) -> list[bytes]:
    return list(BlockHasher(unit, get_hash_fn(fn)).block_hashes(req))


def known_hashes(req: Request, unit: int, fn: str, store: TracePromptHashes) -> list[bytes]:
    return list(BlockHasher(unit, get_hash_fn(fn), known=store).block_hashes(req))


def saved_store(directory: Path) -> tuple[TracePromptHashes, Path]:
    """A store over RECORDS that hashed every request at unit 16 and saved: it, and its file."""
    store = TracePromptHashes(RECORDS, directory=directory)
    for r in iter_requests(RECORDS):
        known_hashes(r, 16, "sha256", store)
    store.save()
    (path,) = directory.glob("*.npy")
    return store, path


@pytest.mark.parametrize("fn", ["sha256", "sha256_cbor", "xxhash", "builtin"])
@pytest.mark.parametrize("unit", [1, 16, 64, 512])
def test_hashes_read_equal_hashes_computed(tmp_path: Path, fn: str, unit: int) -> None:
    store = TracePromptHashes(RECORDS, directory=tmp_path)
    for req in iter_requests(RECORDS):
        assert known_hashes(req, unit, fn, store) == computed_hashes(req, unit, fn)
    # each distinct 512-token block after each distinct prefix that holds a whole unit in some
    # prompt was hashed once (a block with no whole unit is never needed)
    needed = {rec.hash_ids[: k + 1] for rec in RECORDS for k in range(len(rec.hash_ids))
              if min(512, rec.input_length - 512 * k) >= unit}
    assert store.computed == len(needed) * (512 // unit)
    assert store.read > 0  # the shared (1, 2) prefix was read, not hashed again


def test_output_blocks_after_the_prompt_are_still_hashed(tmp_path: Path) -> None:
    store = TracePromptHashes(RECORDS, directory=tmp_path)
    req = next(iter_requests(RECORDS))
    req.append_output_token_ids(list(range(40)))  # 1340 tokens: 83 blocks of 16, 81 in the prompt
    assert known_hashes(req, 16, "sha256", store) == computed_hashes(req, 16, "sha256")


def test_a_later_store_reads_what_an_earlier_one_saved(tmp_path: Path) -> None:
    first = TracePromptHashes(RECORDS, directory=tmp_path)
    expected = [known_hashes(r, 16, "sha256", first) for r in iter_requests(RECORDS)]
    first.save()
    second = TracePromptHashes(RECORDS, directory=tmp_path)
    assert [known_hashes(r, 16, "sha256", second) for r in iter_requests(RECORDS)] == expected
    assert second.computed == 0 and second.read > 0


def test_another_trace_or_setting_never_reads_this_store(tmp_path: Path) -> None:
    saved_store(tmp_path)
    edited = [RECORDS[0], TraceRecord(0.0, 1100, 4, (1, 2, 9)), *RECORDS[2:]]
    other = TracePromptHashes(edited, directory=tmp_path)
    for r in iter_requests(edited):
        assert known_hashes(r, 16, "sha256", other) == computed_hashes(r, 16, "sha256")
    assert other.computed == (len(other.parents) - 1) * 32  # nothing read from the first trace's store
    vocab = TracePromptHashes(RECORDS, vocab_size=1000, directory=tmp_path)
    for r in iter_requests(RECORDS, vocab_size=1000):
        assert known_hashes(r, 16, "sha256", vocab) == computed_hashes(r, 16, "sha256")
    assert vocab.computed == (len(vocab.parents) - 1) * 32


def test_a_store_that_does_not_verify_is_computed_again(tmp_path: Path) -> None:
    _, path = saved_store(tmp_path)
    rows = np.load(path)
    rows["hashes"][:] = 7  # as if another pickle had made it
    np.save(path, rows)
    second = TracePromptHashes(RECORDS, directory=tmp_path)
    for r in iter_requests(RECORDS):
        assert known_hashes(r, 16, "sha256", second) == computed_hashes(r, 16, "sha256")
    assert second.computed == 6 * 32  # nothing trusted from the bad store
    path.write_bytes(b"not a store")
    third = TracePromptHashes(RECORDS, directory=tmp_path)
    for r in iter_requests(RECORDS):
        assert known_hashes(r, 16, "sha256", third) == computed_hashes(r, 16, "sha256")


def test_requests_it_does_not_know_are_hashed_as_usual(tmp_path: Path) -> None:
    store = TracePromptHashes(RECORDS, directory=tmp_path)
    prompt = next(iter_requests(RECORDS)).prompt_token_ids
    for req in (
        Request("other-0", prompt),  # not a trace id
        Request("trace-99", prompt),  # beyond the records
        Request("trace-1", prompt),  # the wrong length for record 1
        Request("trace-0", prompt, cache_salt="s"),  # extra keys: never asks the store
    ):
        assert known_hashes(req, 16, "sha256", store) == computed_hashes(req, 16, "sha256")
    assert known_hashes(next(iter_requests(RECORDS)), 24, "sha256", store) == computed_hashes(
        next(iter_requests(RECORDS)), 24, "sha256")  # 24 does not divide 512
    assert store.computed == 0


def test_hashchain_runs_give_the_same_records_with_the_store(tmp_path: Path, trace_data: Path) -> None:
    records = read_mooncake(resolve("mooncake_conversation_trace.jsonl"))[:60]

    def run(store: TracePromptHashes | None) -> list[list[object]]:
        options = {} if store is None else {"known_prompt_hashes": store}
        cache = make_cache("hashchain", CacheConfig(1 << 17, 16), **options)
        recs = Engine(cache, "fcfs").run(iter_requests(records))
        return [[getattr(r, f.name) for f in fields(r) if f.name != "cache_op_ns"] for r in recs]

    expected = run(None)
    store = TracePromptHashes(records, directory=tmp_path)
    assert run(store) == expected
    store.save()
    warm = TracePromptHashes(records, directory=tmp_path)
    assert run(warm) == expected
    assert warm.computed == 0 and warm.read > 0


def test_a_warm_store_reads_only_the_rows_its_requests_reach(tmp_path: Path) -> None:
    saved_store(tmp_path)
    warm = TracePromptHashes(RECORDS, directory=tmp_path)
    req = list(iter_requests(RECORDS))[3]  # hash ids (5, 6): two trie nodes of their own
    assert known_hashes(req, 16, "sha256", warm) == computed_hashes(req, 16, "sha256")
    (store,) = warm._stores.values()
    assert isinstance(store._mapped, np.memmap)
    # its blocks' rows, and the first root's, which opening the store checks against a hash
    assert [n for n, b in enumerate(store.nodes) if b is not None] == [0, *warm.paths[3]]
    assert warm.computed == 0 and warm.read == 700 // 16


def test_stores_saved_again_after_more_requests_hold_each_block_once(tmp_path: Path) -> None:
    reqs = list(iter_requests(RECORDS))
    store = TracePromptHashes(RECORDS, directory=tmp_path)
    known_hashes(reqs[0], 16, "sha256", store)
    store.save()
    for r in reqs[1:3]:  # the same store object computes more, and saves again
        known_hashes(r, 16, "sha256", store)
    store.save()
    warm = TracePromptHashes(RECORDS, directory=tmp_path)
    for r in reqs[3:]:
        known_hashes(r, 16, "sha256", warm)
    warm.save()
    (path,) = tmp_path.glob("*.npy")
    nodes = np.load(path)["node"]
    # every block that holds a whole unit, once (the 1-token last block of record 4 holds none)
    assert sorted(nodes.tolist()) == list(range(len(warm.parents) - 1))
    last = TracePromptHashes(RECORDS, directory=tmp_path)
    for r in iter_requests(RECORDS):
        assert known_hashes(r, 16, "sha256", last) == computed_hashes(r, 16, "sha256")
    assert last.computed == 0


@pytest.mark.parametrize("damage", ["node out of range", "node twice", "other row type"])
def test_a_store_with_bad_rows_is_not_read(tmp_path: Path, damage: str) -> None:
    first, path = saved_store(tmp_path)
    rows = np.load(path)
    if damage == "node out of range":
        rows["node"][0] = len(first.parents)
    elif damage == "node twice":
        rows["node"][3] = rows["node"][2]  # two blocks under (1, 2): not the root it checks
    else:
        rows = rows["hashes"]
    np.save(path, rows)
    again = TracePromptHashes(RECORDS, directory=tmp_path)
    for r in iter_requests(RECORDS):
        assert known_hashes(r, 16, "sha256", again) == computed_hashes(r, 16, "sha256")
    assert again.computed == (len(first.parents) - 1) * 32 and again.read > 0  # nothing trusted


def test_a_save_removes_the_stores_of_the_old_whole_file_format(tmp_path: Path) -> None:
    (tmp_path / "0123456789abcdef01234567.npz").write_bytes(b"a FORMAT 1 store")
    store = TracePromptHashes(RECORDS, directory=tmp_path)
    known_hashes(next(iter_requests(RECORDS)), 16, "sha256", store)
    store.save()
    assert [p.suffix for p in tmp_path.iterdir()] == [".npy"]
