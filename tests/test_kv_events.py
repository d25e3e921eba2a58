"""vLLM's KV events: our schema encodes to the very bytes vLLM 0.33 does (fixture recorded
from vLLM by experiments/upstream/vllm_kv_events_driver.py), and the ZMQ publisher / subscriber
pair delivers batches in order, detects sequence gaps and replays from its buffer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

kv_events = pytest.importorskip("prefixcache.kv_events", reason="needs msgspec (the events extra)")
from prefixcache.experiments.upstream.kv_event_cases import build_batch  # noqa: E402

from prefixcache.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode,
    encode,
)

FIXTURE = Path(__file__).parent / "fixtures" / "upstream" / "events" / "vllm_kv_events.json"
KINDS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def ours(case: dict[str, Any]) -> KVEventBatch:
    return build_batch(case, KINDS, KVEventBatch)  # type: ignore[no-any-return]


CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"batch{i}" for i in range(len(CASES))])
def test_our_events_encode_to_vllms_bytes_and_decode_them(case: dict[str, Any]) -> None:
    vllm_payload = bytes.fromhex(case["payload"])
    assert encode(ours(case)) == vllm_payload
    assert decode(vllm_payload) == ours(case)


def test_a_batch_is_a_msgpack_array_and_events_are_tagged_by_class_name() -> None:
    import msgspec

    raw = msgspec.msgpack.decode(bytes.fromhex(CASES[1]["payload"]))
    assert isinstance(raw, list) and raw[0] == 2.25 and raw[2] == 3
    assert [e["type"] for e in raw[1]] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]


def test_gaps_in_the_sequence_numbers_are_detected() -> None:
    seen = kv_events.SequenceGaps()
    for seq in (0, 1, 4, 5, 3, 9):  # 3 arrives late: the gap was already noted
        seen.see(seq)
    assert seen.gaps == [(2, 3), (6, 8)] and seen.last_seq == 9


def test_zmq_loopback_delivers_in_order_and_replays_from_the_buffer() -> None:
    pytest.importorskip("zmq", reason="needs pyzmq (the events extra)")
    pub = kv_events.ZmqEventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", buffer_steps=4, topic="kv")
    sub = kv_events.ZmqEventSubscriber(pub.endpoint, pub.replay_endpoint, topic="kv")
    try:
        def batch(i: int) -> KVEventBatch:
            stored = BlockStored(block_hashes=[i], parent_block_hash=None, token_ids=[i] * 4, block_size=4,
                                 lora_id=None, medium="GPU", lora_name=None)
            return KVEventBatch(ts=float(i), events=[stored])

        # PUB/SUB drops what is sent before the subscription lands: probe until it does.
        deadline = time.monotonic() + 10
        received: list[tuple[int, KVEventBatch]] = []
        while not received:
            assert time.monotonic() < deadline, "the subscriber never connected"
            pub.publish(KVEventBatch(ts=-1.0, events=[AllBlocksCleared()]))
            received = list(sub.receive(timeout_ms=100))
        first = sub.sequence.last_seq
        assert first is not None
        seqs = [pub.publish(batch(i)) for i in range(6)]
        got = list(sub.receive(timeout_ms=500))
        assert [s for s, _ in got] == seqs == list(range(first + 1, first + 7)) and not sub.sequence.gaps
        assert [b.events[0].block_hashes for _, b in got] == [[i] for i in range(6)]
        assert all(b.data_parallel_rank == 0 for _, b in got)

        # The ROUTER replays what its buffer (4 batches) still holds from the asked number on.
        import threading

        server = threading.Thread(target=pub.serve_replays, kwargs={"timeout_ms": 5000})
        server.start()
        replayed = sub.replay(seqs[0])
        server.join()
        assert [s for s, _ in replayed] == seqs[-4:]
        assert [b.ts for _, b in replayed] == [2.0, 3.0, 4.0, 5.0]
    finally:
        sub.close()
        pub.close()


def test_publisher_rejects_bad_sizes() -> None:
    pytest.importorskip("zmq")
    with pytest.raises(ValueError, match="buffer_steps"):
        kv_events.ZmqEventPublisher("tcp://127.0.0.1:0", buffer_steps=0)


def test_in_process_stream_numbers_batches_and_reaches_every_subscriber() -> None:
    stream = kv_events.EventStream()
    early: list[int] = []
    stream.subscribe(lambda seq, batch: early.append(seq))
    stream.publish(KVEventBatch(ts=0.0, events=[]))
    late: list[float] = []
    stream.subscribe(lambda seq, batch: late.append(batch.ts))
    assert stream.publish(KVEventBatch(ts=1.0, events=[AllBlocksCleared()])) == 1
    assert early == [0, 1] and late == [1.0]  # a subscriber sees what comes after it joined
