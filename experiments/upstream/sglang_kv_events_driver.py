"""Record SGLang 0.5.23's own KV event streams: its RadixCache with ``enable_kv_cache_events``
(``mem_cache/events.py`` KVCacheEventRecorder, non-Dynamo format) and its token-to-KV
allocator, driven as sglang_driver.py drives them (admission: match_prefix + lock + the
allocator's evict_to_free_tokens + alloc; ``checkpoint`` after an extend; release_kv_cache at
the end), draining ``kv_events.take()`` after every op as the scheduler drains it after every
step. ``reset`` calls ``RadixCache.reset`` when no request is live (as our contract, and
SGLang's flush_cache, refuse it otherwise). Needs the upstream venv and a C++ compiler (SGLang
builds its page-hash extension on first use):

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.sglang_kv_events_driver

Writes tests/fixtures/upstream/events/sglang_streams/ (tests/test_kv_events_backends.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# isort: off
from prefixcache.experiments.upstream import shim  # must precede sglang (torchvision stub)
import sglang.srt.mem_cache.radix_cache as radix_mod  # noqa: E402
import torch  # noqa: E402
from prefixcache.experiments.upstream.kv_event_cases import event_json, sglang_event_scenarios  # noqa: E402
from prefixcache.experiments.upstream.sglang_driver import _Req, _ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

# isort: on

shim.deterministic_clock(radix_mod)
STREAMS = (
    Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "events" / "sglang_streams"
)


def replay_events(scenario: dict[str, Any], need_sort: bool = False) -> list[dict[str, Any]]:
    """One record per op: {"events": [...]} (and "ok" / "hit" for allocs, "freed" for evicts)."""
    ps = scenario["page_size"]
    size = scenario["capacity_tokens"] - ps  # slot/page 0 is SGLang's padding slot
    if ps == 1:
        alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, need_sort)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, ps, torch.float16, "cpu", None, need_sort)
        alloc.use_triton_kernels = False
    length: dict[str, int] = {}  # one row per request, never reused
    for op in scenario["ops"]:
        if op["op"] == "new":
            length[op["rid"]] = len(op["prompt"])
        elif op["op"] == "append":
            length[op["rid"]] += len(op["tokens"])
    rtt = _ReqToTokenPool(max(len(length), 1), max([4096, *length.values()]) + ps)
    tree = RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=rtt,
            token_to_kv_pool_allocator=alloc,
            page_size=ps,
            enable_kv_cache_events=True,
        )
    )
    reqs: dict[str, _Req] = {}
    live: set[str] = set()
    records: list[dict[str, Any]] = []

    def row_of(r: _Req) -> torch.Tensor:
        return rtt.req_to_token[r.kv.req_pool_idx]

    def grow(r: _Req, n: int, decode: bool) -> bool:
        start = r.allocated
        if ps == 1:
            alloc.evict_to_free_tokens(tree, n)
            out = alloc.alloc(n)
        elif decode:
            alloc.evict_to_free_tokens(tree, ps)
            last = row_of(r)[start - 1 : start].clone()
            out = alloc.alloc_decode(torch.tensor([start + 1]), torch.tensor([start + 1]), last)
        else:
            alloc.evict_to_free_tokens(tree, n + ps)
            last = row_of(r)[start - 1 : start].clone() if start else torch.tensor([-1])
            out = alloc.alloc_extend(
                torch.tensor([start]),
                torch.tensor([start]),
                torch.tensor([start + n]),
                torch.tensor([start + n]),
                last,
                n,
            )
        if out is None:
            return False
        row_of(r)[start : start + n] = out
        r.allocated = start + n
        return True

    def release(r: _Req) -> None:  # release_kv_cache(req, tree, checkpoint=True)
        owned = r.computed
        if owned:
            tree.checkpoint(r, up_to=owned)
        lo = r.kv.cache_protected_len
        if owned > lo:
            alloc.free_segment(row_of(r)[lo:owned].clone(), start_pos=lo)
        tree.unlock(r.lock)
        r.lock = None
        tail = -(-owned // ps) * ps
        if r.allocated > tail:
            alloc.free_segment(row_of(r)[tail : r.allocated].clone(), start_pos=tail)

    for op in scenario["ops"]:
        kind, rid = op["op"], op.get("rid")
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[rid] = _Req(rid, op["prompt"], op.get("salt"), len(reqs))
        elif kind == "alloc":
            r = reqs[rid]
            if rid not in live:
                ids = r.full_untruncated_fill_ids
                key = RadixKey(ids, r.extra_key, limit=len(ids) - 1, cache_salt=r.cache_salt)
                m = tree.match_prefix(MatchPrefixParams(key=key))
                hit = m.device_prefix_len
                prefix = tree.path_device_indices(m.last_device_node)
                r.lock = tree.lock(m.last_device_node)
                r.last_node = m.last_device_node
                row_of(r)[:hit] = prefix
                r.allocated = r.computed = hit
                r.kv.cache_protected_len = hit
                r.kv.cache_inserted_len = 0
                n = op["n"] if op.get("n") is not None else r.num_tokens - hit
                ok = grow(r, n, decode=False)
                if ok:
                    live.add(rid)
                    r.decoding = False
                else:
                    tree.unlock(r.lock)
                    r.lock = None
                rec.update(ok=ok, hit=hit if ok else None)
            else:
                n = op["n"] if op.get("n") is not None else r.num_tokens - r.computed
                need = r.computed + n - r.allocated
                r.decoding = bool(r.output_ids) and r.computed >= len(r.origin_input_ids)
                rec["ok"] = grow(r, need, decode=r.decoding) if need > 0 else True
        elif kind == "run":
            r = reqs[rid]
            r.computed = r.allocated
            if not r.decoding:  # SGLang checkpoints after an extend, not after a decode step
                tree.checkpoint(r, up_to=r.computed)
        elif kind == "append":
            reqs[rid].output_ids.extend(op["tokens"])
        elif kind == "release":
            release(reqs[rid])
            live.discard(rid)
        elif kind == "evict":
            rec["freed"] = tree.evict(EvictParams(num_tokens=op["n"])).num_tokens_evicted
        elif kind == "reset":
            rec["ok"] = not live
            if not live:
                tree.reset()
                alloc.clear()
        else:
            raise ValueError(f"unknown op {kind!r}")
        rec["events"] = [event_json(e) for e in tree.kv_events.take()]
        records.append(rec)
    return records


def main() -> int:
    STREAMS.mkdir(parents=True, exist_ok=True)
    for scenario in sglang_event_scenarios():
        records = replay_events(scenario)
        fixture = {"system": "sglang", "upstream": "sglang 0.5.23", "scenario": scenario, "records": records}
        path = STREAMS / f"sglang_events_{scenario['name']}.json"
        path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        print(f"{scenario['name']}: {sum(len(r['events']) for r in records)} events -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
