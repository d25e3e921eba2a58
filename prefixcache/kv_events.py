"""vLLM's KV-cache events: the schema (vLLM 0.33.0 ``vllm/distributed/kv_events.py``), an
in-process subscriber, and a ZMQ publisher speaking vLLM's wire format, so that an external
router (Dynamo, llm-d's precise scorer) can consume our simulator as it consumes vLLM.

Schema: ``EventBatch{ts, events, data_parallel_rank}`` (msgpack array) of tagged structs
``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``, field for field as vLLM 0.33 declares
them, so the msgpack bytes are the same as vLLM's (tests/test_kv_events.py checks it against
bytes recorded from vLLM itself).

Wire format of ``ZmqEventPublisher`` (vLLM's ``ZmqEventPublisher``): a PUB socket sends one
multipart message per batch, ``(topic, 8-byte big-endian sequence number, msgpack payload)``;
PUB/SUB drops messages past its high-water mark, so a subscriber must watch the sequence
numbers. An optional ROUTER socket replays buffered batches: a client sends the first sequence
number it lacks (8 bytes, big-endian) and receives ``(topic, seq, payload)`` for every buffered
batch from there, then ``(b"", -1, b"")``. Unlike vLLM's, our publisher sends on the caller's
thread (a simulator has no step loop to protect) and serves replay requests when asked.

msgspec and pyzmq are needed only here (``pip install 'prefixcache[events]'``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

ExternalBlockHash = bytes | int
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """A KV-cache event; msgspec tags each subclass with its class name, as vLLM's are."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None  # deprecated upstream, kept for the wire format
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(type=KVEventBatch)


def encode(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def decode(payload: bytes) -> KVEventBatch:
    return _decoder.decode(payload)


END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventStream:
    """Batches in order with their sequence numbers, for in-process subscribers: each
    callback gets ``(seq, batch)`` for every batch published after it subscribed."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[[int, KVEventBatch], None]] = []
        self._seq = 0

    def subscribe(self, callback: Callable[[int, KVEventBatch], None]) -> None:
        self._subscribers.append(callback)

    def publish(self, batch: KVEventBatch) -> int:
        seq = self._seq
        self._seq += 1
        for callback in self._subscribers:
            callback(seq, batch)
        return seq


class ZmqEventPublisher:
    """PUB (+ optional ROUTER replay) publisher in vLLM's wire format; see the module
    docstring. ``endpoint`` / ``replay_endpoint`` are bound (``tcp://*:5557`` is vLLM's
    default; ``tcp://127.0.0.1:0`` picks a free port, read back from ``.endpoint``)."""

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        *,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        topic: str = "",
        data_parallel_rank: int = 0,
    ) -> None:
        import zmq

        if buffer_steps < 1 or hwm < 1:
            raise ValueError(f"buffer_steps and hwm must be >= 1, got {buffer_steps}, {hwm}")
        self._zmq = zmq
        self._ctx: Any = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self.endpoint = self._bind(self._pub, endpoint)
        self._replay = None
        self.replay_endpoint = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
            self.replay_endpoint = self._bind(self._replay, replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic.encode()
        self._seq = 0
        self.data_parallel_rank = data_parallel_rank

    def _bind(self, sock: Any, endpoint: str) -> str:
        if endpoint.endswith(":0"):
            port = sock.bind_to_random_port(endpoint.rsplit(":", 1)[0])
            return f"{endpoint.rsplit(':', 1)[0]}:{port}"
        sock.bind(endpoint)
        return endpoint

    def publish(self, batch: EventBatch) -> int:
        """Send one batch now; returns its sequence number."""
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        seq, payload = self._seq, encode(batch)
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        return seq

    def serve_replays(self, timeout_ms: int = 0) -> int:
        """Answer the replay requests waiting (up to ``timeout_ms`` for the first); returns how
        many were answered."""
        if self._replay is None:
            return 0
        served = 0
        while self._replay.poll(timeout_ms if served == 0 else 0):
            frame = self._replay.recv_multipart()
            if len(frame) != 3:
                continue  # not a replay request: ignored, as vLLM does
            client, _, start = frame
            first = int.from_bytes(start, "big")
            for seq, payload in self._buffer:
                if seq >= first:
                    self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
            served += 1
        return served

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


class SequenceGaps:
    """The sequence numbers a subscriber has not seen: each jump forward is a gap of batches
    the lossy PUB socket dropped (or that arrived out of order, later)."""

    def __init__(self) -> None:
        self.last_seq: int | None = None
        self.gaps: list[tuple[int, int]] = []  # (first missing, last missing)

    def see(self, seq: int) -> None:
        if self.last_seq is not None and seq > self.last_seq + 1:
            self.gaps.append((self.last_seq + 1, seq - 1))
        self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)


class ZmqEventSubscriber:
    """A SUB client of ``ZmqEventPublisher`` (or of vLLM): yields ``(seq, batch)`` and notes
    every gap in the sequence numbers (batches the PUB socket dropped), which ``replay`` can
    fetch from a publisher's ROUTER socket."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        import zmq

        self._zmq = zmq
        self._ctx: Any = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.connect(endpoint)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._replay_endpoint = replay_endpoint
        self.sequence = SequenceGaps()

    def receive(self, timeout_ms: int = 1000) -> Iterator[tuple[int, KVEventBatch]]:
        """Batches until none arrives for ``timeout_ms``."""
        while self._sub.poll(timeout_ms):
            _, seq_bytes, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            self.sequence.see(seq)
            yield seq, decode(payload)

    def replay(self, start_seq: int, timeout_ms: int = 1000) -> list[tuple[int, KVEventBatch]]:
        """Ask the publisher's ROUTER socket for every buffered batch from ``start_seq`` on."""
        if self._replay_endpoint is None:
            raise ValueError("this subscriber was given no replay endpoint")
        # A DEALER, not a REQ: the publisher answers one request with many messages.
        sock = self._ctx.socket(self._zmq.DEALER)
        sock.connect(self._replay_endpoint)
        try:
            sock.send_multipart((b"", start_seq.to_bytes(8, "big")))
            out: list[tuple[int, KVEventBatch]] = []
            while sock.poll(timeout_ms):
                _, _, seq_bytes, payload = sock.recv_multipart()
                if seq_bytes == END_SEQ:
                    return out
                out.append((int.from_bytes(seq_bytes, "big"), decode(payload)))
            raise TimeoutError(f"no end-of-replay marker within {timeout_ms} ms")
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        self._sub.close(linger=0)
