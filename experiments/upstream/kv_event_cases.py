"""KV event batches written as plain JSON (bytes as hex), built into event classes: vLLM 0.33's
by the recorder (vllm_kv_events_driver.py) and ours by tests/test_kv_events.py, so both encode
the same batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def build_batch(case: Mapping[str, Any], kinds: Mapping[str, type], batch_cls: type) -> Any:
    """``case`` ({"ts", "rank", "events": [{"kind": ..., fields}]}) as a ``batch_cls`` of
    ``kinds[kind]`` events."""

    def h(x: Any) -> Any:
        return bytes.fromhex(x) if isinstance(x, str) else x

    events = []
    for e in case["events"]:
        fields = {k: v for k, v in e.items() if k != "kind"}
        if "block_hashes" in fields:
            fields["block_hashes"] = [h(x) for x in fields["block_hashes"]]
        if fields.get("parent_block_hash") is not None:
            fields["parent_block_hash"] = h(fields["parent_block_hash"])
        if "extra_keys" in fields:
            fields["extra_keys"] = [tuple(k) for k in fields["extra_keys"]]
        events.append(kinds[e["kind"]](**fields))
    return batch_cls(ts=case["ts"], events=events, data_parallel_rank=case["rank"])
