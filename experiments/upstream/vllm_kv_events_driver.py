"""Record vLLM 0.33's own msgpack encoding of KV event batches (the fixture that
tests/test_kv_events.py holds our schema to). Run with the upstream venv:

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.vllm_kv_events_driver
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from prefixcache.experiments.upstream import shim  # noqa: F401  (must precede vllm)
from prefixcache.experiments.upstream.kv_event_cases import build_batch  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream"
FIXTURE = FIXTURES / "events" / "vllm_kv_events.json"

# Each case: the fields as plain JSON (bytes as hex), which the test rebuilds with our classes.
CASES: list[dict[str, Any]] = [
    {
        "ts": 1.5,
        "rank": None,
        "events": [
            {
                "kind": "BlockStored",
                "block_hashes": ["aa" * 32, "bb" * 32],
                "parent_block_hash": None,
                "token_ids": list(range(32)),
                "block_size": 16,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": None,
                "group_idx": 0,
            },
        ],
    },
    {
        "ts": 2.25,
        "rank": 3,
        "events": [
            {
                "kind": "BlockStored",
                "block_hashes": ["cc" * 32],
                "parent_block_hash": "bb" * 32,
                "token_ids": [7] * 16,
                "block_size": 16,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": "adapter",
                "extra_keys": [["adapter", "salt"]],
                "group_idx": 1,
                "kv_cache_spec_kind": "sliding_window",
                "kv_cache_spec_sliding_window": 128,
            },
            {"kind": "BlockRemoved", "block_hashes": ["aa" * 32], "medium": MEDIUM_GPU, "group_idx": 0},
            {"kind": "AllBlocksCleared"},
        ],
    },
    {
        "ts": 0.0,
        "rank": 0,
        "events": [
            {
                "kind": "BlockStored",
                "block_hashes": [12345],
                "parent_block_hash": 999,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": None,
                "lora_name": None,
            },
        ],
    },
]


KINDS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def build(case: dict[str, Any]) -> KVEventBatch:
    return build_batch(case, KINDS, KVEventBatch)  # type: ignore[no-any-return]


def main() -> int:
    enc = msgspec.msgpack.Encoder()
    out = [dict(case, payload=enc.encode(build(case)).hex()) for case in CASES]
    FIXTURE.write_text(json.dumps({"vllm": "0.33.0", "cases": out}, indent=1) + "\n")
    print(f"{len(out)} batches -> {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
