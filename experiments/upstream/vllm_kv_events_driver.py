"""Record vLLM 0.33's own KV events. Run with the upstream venv:

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.vllm_kv_events_driver \
        [--streams | --fidelity]

Without arguments: vLLM's msgpack encoding of a few hand-built batches (the fixture that
tests/test_kv_events.py holds our schema to). ``--streams``: the event stream of each scenario
of ``kv_event_cases.vllm_event_scenarios`` from vLLM's own KVCacheManager with
``enable_kv_cache_events`` on, driven as its scheduler drives it (vllm_driver.py; hybrid
layouts built as vllm_hybrid_driver.py builds them), drained with ``take_events`` after every
op as the engine drains it after every step: per op the events as JSON and the msgpack bytes
of the batch ``KVEventBatch(ts=0.0, events)``. PYTHONHASHSEED is fixed (recorded in the
fixture) so that NONE_HASH, and with it every block hash, is reproducible; tests set it too.
Written to tests/fixtures/upstream/events/vllm_streams/ (tests/test_kv_events_backends.py).
"""

from __future__ import annotations

import json
import os
import sys
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


STREAMS = FIXTURES / "events" / "vllm_streams"
HASH_SEED = "0"


def replay_events(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per op: {"events": [...], "payload": hex} (and "ok" / "hit" for allocs)."""
    from prefixcache.experiments.upstream.kv_event_cases import event_json
    from prefixcache.experiments.upstream.vllm_hybrid_driver import build
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    os.environ["PYTHONHASHSEED"] = HASH_SEED
    init_none_hash(sha256)
    if "layout" not in scenario and "groups" not in scenario:  # dense (scenarios.py): one group
        B = scenario["page_size"]
        scenario = {
            **scenario,
            "block_size": B,
            "retention": None,
            "groups": [["full"]],
            "num_blocks": scenario["capacity_tokens"] // B,
        }
    m, header = build(scenario)
    m.block_pool.enable_kv_cache_events = m.enable_kv_cache_events = True  # as if passed to __init__
    B = header.get("block_size", scenario["block_size"])
    hasher = get_request_block_hasher(scenario.get("prefix_match_unit") or B, sha256)
    enc = msgspec.msgpack.Encoder()
    reqs: dict[str, Request] = {}
    live: dict[str, int] = {}  # rid -> tokens allocated
    records: list[dict[str, Any]] = []
    for op in scenario["ops"]:
        kind, rid = op["op"], op.get("rid")
        rec: dict[str, Any] = {}
        m.new_step_starts()  # one op, one scheduler step (Mamba defers hits cached this step)
        if kind == "new":
            reqs[rid] = Request(
                rid,
                list(op["prompt"]),
                SamplingParams(max_tokens=1 << 12),
                None,
                cache_salt=op.get("salt"),
                block_hasher=hasher,
            )
        elif kind == "lookup":
            m.get_computed_blocks(reqs[rid])
        elif kind == "alloc":
            req = reqs[rid]
            if rid not in live:
                blocks, hit, junction = m.get_computed_blocks(req)
                req.shared_prefix_boundary = junction  # what the scheduler does with it
                n = req.num_tokens - hit if op.get("n") is None else min(op["n"], req.num_tokens - hit)
                new = m.allocate_slots(req, n, hit, blocks)
                rec["hit"] = hit if new is not None else None
                if new is not None:
                    req.num_computed_tokens = hit
                    live[rid] = hit + n
            else:
                left = req.num_tokens - req.num_computed_tokens
                n = left if op.get("n") is None else min(op["n"], left)
                new = m.allocate_slots(req, n) if n > 0 else None
                if new is not None:
                    live[rid] = max(live[rid], req.num_computed_tokens + n)
                rec["skipped"] = n == 0
            rec["ok"] = new is not None
        elif kind == "run":
            if rid in live:
                reqs[rid].num_computed_tokens = live[rid]
        elif kind == "append":
            reqs[rid].append_output_token_ids(list(op["tokens"]))
        elif kind == "release":
            if rid in live:
                m.free(reqs[rid])
                del live[rid]
        elif kind == "reset":
            rec["ok"] = m.reset_prefix_cache()
        else:
            raise ValueError(f"no op {kind!r} in the event replay")
        events = m.take_events()
        rec["events"] = [event_json(e) for e in events]
        rec["payload"] = enc.encode(KVEventBatch(ts=0.0, events=events)).hex()
        records.append(rec)
    return records


def record_streams() -> int:
    from prefixcache.experiments.upstream.kv_event_cases import vllm_event_scenarios

    STREAMS.mkdir(parents=True, exist_ok=True)
    for scenario in vllm_event_scenarios():
        records = replay_events(scenario)
        fixture = {
            "system": "vllm",
            "upstream": "vllm 0.33.0",
            "pythonhashseed": HASH_SEED,
            "scenario": scenario,
            "records": records,
        }
        path = STREAMS / f"vllm_events_{scenario['name']}.json"
        path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
        print(f"{scenario['name']}: {sum(len(r['events']) for r in records)} events -> {path}")
    return 0


def record_fidelity() -> int:
    """Issue 33's event case (kv_event_cases.partial_tail_scenario) -> tests/fixtures/upstream/
    fidelity/vllm_events_<name>.json (tests/test_hashchain_fidelity_cases.py)."""
    from prefixcache.experiments.upstream.kv_event_cases import partial_tail_scenario

    scenario = partial_tail_scenario()
    records = replay_events(scenario)
    fixture = {"system": "vllm", "upstream": "vllm 0.33.0", "pythonhashseed": HASH_SEED,
               "scenario": scenario, "records": records}  # fmt: skip
    path = FIXTURES / "fidelity" / f"vllm_events_{scenario['name']}.json"
    path.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"{scenario['name']}: {[[e['type'] for e in r['events']] for r in records]} -> {path}")
    return 0


def main() -> int:
    if "--streams" in sys.argv[1:]:
        return record_streams()
    if "--fidelity" in sys.argv[1:]:
        return record_fidelity()
    enc = msgspec.msgpack.Encoder()
    out = [dict(case, payload=enc.encode(build(case)).hex()) for case in CASES]
    FIXTURE.write_text(json.dumps({"vllm": "0.33.0", "cases": out}, indent=1) + "\n")
    print(f"{len(out)} batches -> {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
