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


# ---------------------------------------------------------------------------- event streams
def event_json(event: Any) -> dict[str, Any]:
    """One event (vLLM's, SGLang's or ours) as plain JSON: {"type": class name, field: value},
    bytes as hex, tuples as lists, str enums as their value; fields left at None omitted."""
    import msgspec

    def plain(x: Any) -> Any:
        if isinstance(x, bytes):
            return x.hex()
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, str):
            return str(x.value) if hasattr(x, "value") else x
        return x

    fields = msgspec.structs.asdict(event)
    return {"type": type(event).__name__, **{k: plain(v) for k, v in fields.items() if v is not None}}


def reset_scenario(page_size: int) -> dict[str, Any]:
    """Two prompts cached, a reset (AllBlocksCleared), the first again (no hit: recomputed and
    stored afresh), a reset refused while it runs, and a last reset."""
    from prefixcache.experiments.upstream.scenarios import Scenario, _toks

    B = page_size
    s = Scenario(f"reset_p{B}", 32 * B, B)
    a, b = _toks(3 * B + 1, 300), _toks(2 * B + 2, 301)
    s.whole("a", a).whole("b", a[: 2 * B] + b)
    s.ops.append({"op": "reset"})
    s.prefill("c", a)
    s.ops.append({"op": "reset"})  # refused: c is live
    s.release("c")
    s.ops.append({"op": "reset"})
    return s.to_json()


def vllm_event_scenarios() -> list[dict[str, Any]]:
    """Dense (block size 4): the scripted scenarios of scenarios.py (prefix hits, the n - 1
    cap's duplicate block, chunked prefill, decode filling blocks, eviction under a small
    pool, salts), one seeded, a reset; hybrid: two random full + sliding-window layouts of
    hybrid_scenarios_vllm.py (dense retention and vLLM's engine default), and a Mamba one."""
    from prefixcache.experiments.upstream.hybrid_scenarios_vllm import (
        GEMMA3_SMALL,
        GPT_OSS_SMALL,
        MAMBA_SMALL,
        random_scenario,
    )
    from prefixcache.experiments.upstream.scenarios import scripted, seeded

    out = [s.to_json() for s in scripted(4)] + [seeded(4, 1).to_json(), reset_scenario(4)]
    for retention in (None, 0):
        out.append(random_scenario("hybrid_gptoss", 2, GPT_OSS_SMALL, 60, retention))
    out.append(random_scenario("hybrid_gemma3", 1, GEMMA3_SMALL, 40, 0))
    for retention in (None, 0):  # Mamba ("align": chunks end on block boundaries) + full + window
        out.append(
            random_scenario("hybrid_mamba", 4, MAMBA_SMALL, 64, retention, num_requests=12, aligned=True)
        )
    return out


def sglang_event_scenarios() -> list[dict[str, Any]]:
    """The scripted scenarios at page sizes 1 and 4 (splits, salts, eviction of leaves and
    then their parents), two seeded, the explicit-evict one, a reset at each page size."""
    from prefixcache.experiments.upstream.scenarios import Scenario, _toks, scripted, seeded

    out = [s.to_json() for p in (1, 4) for s in (*scripted(p), seeded(p, 1), seeded(p, 2))]
    ev = Scenario("explicit_evict_p1", 64, 1)
    ev.whole("x0", _toks(12, 200)).whole("x1", _toks(12, 201)).whole("x2", _toks(12, 200)[:6] + [1, 2, 3])
    ev.evict(5).whole("x3", _toks(12, 201)).evict(100).whole("x4", _toks(12, 200))
    out += [ev.to_json(), reset_scenario(1), reset_scenario(4)]
    return out


def partial_tail_scenario() -> dict[str, Any]:
    """Issue 33, case 4: a sliding-window (8) + full layout, block 4, --prefix-match-unit 2.
    The prompt 1..8 ends its hit cap (7 tokens) inside block 1, so vLLM 0.33's full group also
    registers the partial tail [5, 6] (``FullAttentionManager._cache_partial_tail_block``);
    a second prompt then takes every block, evicting it (BlockRemoved)."""
    ops: list[dict[str, Any]] = [
        {"op": "new", "rid": "a", "prompt": list(range(1, 9))},
        {"op": "alloc", "rid": "a"},
        {"op": "run", "rid": "a"},
        {"op": "release", "rid": "a"},
        {"op": "new", "rid": "b", "prompt": list(range(100, 116))},
        {"op": "alloc", "rid": "b"},
        {"op": "run", "rid": "b"},
        {"op": "release", "rid": "b"},
    ]
    return {
        "name": "partial_tail_unit2",
        "block_size": 4,
        "prefix_match_unit": 2,
        "retention": None,
        "groups": [["sliding_window", 8], ["full"]],
        "num_blocks": 9,
        "capacity_tokens": 32,
        "ops": ops,
    }
