"""Replay a scenario through SGLang's own RadixCache and token-to-KV allocator, driven as its
scheduler drives them (batches of one request):

admission   match_prefix(RadixKey(fill_ids, limit=len-1)), lock(last_node), then the allocator:
            page 1: alloc_token_slots = evict_to_free_tokens(n) + alloc(n);
            page>1: alloc_paged_token_slots_extend = evict_to_free_tokens(n + page) + alloc_extend
decode      page 1: the same with n=1; page>1: evict_to_free_tokens(page) + alloc_decode
after an extend   RadixCache.checkpoint (insert, free duplicates, re-match, re-lock)
finish      release_kv_cache(checkpoint=True): checkpoint up to the KV length, free the unshared
            rest of the row, unlock.
The request object handed to ``checkpoint`` is a small stand-in carrying only the fields it reads.
"""

from __future__ import annotations

import json
import sys
import time
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sglang.srt.mem_cache.radix_cache as radix_mod  # noqa: E402
import torch  # noqa: E402
from prefixcache.experiments.upstream import shim
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

shim.deterministic_clock(radix_mod)


class _ReqToTokenPool:
    """What RadixCache.checkpoint touches of SGLang's ReqToTokenPool."""

    def __init__(self, rows: int, width: int) -> None:
        self.req_to_token = torch.zeros((rows, width), dtype=torch.int64)

    def write(self, indices, values) -> None:  # type: ignore[no-untyped-def]
        self.req_to_token[indices] = values


class _Req:
    def __init__(self, rid: str, prompt: list[int], salt: str | None, row: int) -> None:
        self.rid = rid
        self.origin_input_ids = list(prompt)
        self.output_ids: list[int] = []
        self.extra_key = None
        self.cache_salt = salt
        self.priority = None
        self.lock = None
        self.last_node = None
        self.kv = SimpleNamespace(req_pool_idx=row, swa_evict_floor=0, cache_inserted_len=0,
                                  cache_protected_len=0)
        self.allocated = 0  # row positions holding slots
        self.computed = 0  # row positions whose KV is written
        self.decoding = False

    @property
    def full_untruncated_fill_ids(self) -> array:
        return array("q", self.origin_input_ids + self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


class _UnifiedReq(_Req):
    """What UnifiedRadixCache.checkpoint_into_tree reads beyond RadixCache's fields (its
    prompt split compares the prompt as an array with the node keys)."""

    def __init__(self, rid: str, prompt: list[int], salt: str | None, row: int) -> None:
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        super().__init__(rid, prompt, salt, row)
        self.kv = ReqKvInfo(req_pool_idx=row)
        self.session = self.session_id = self.kv_rotation_base = self.swa_branching_seqlen = None
        self.origin_input_ids = array("q", prompt)  # type: ignore[assignment]

    def finished(self) -> bool:
        return False  # a FULL-only tree reads it for nothing that changes the records

    @property
    def full_untruncated_fill_ids(self) -> array:
        return self.origin_input_ids + array("q", self.output_ids)  # type: ignore[operator]


def replay_sglang(
    scenario: dict[str, Any], need_sort: bool = True, is_eagle: bool = False, unified: bool = False,
    record: bool = True, eviction_policy: str = "lru",
) -> tuple[list[dict[str, Any]], float]:
    """record: False leaves out page ids and usage (a timed run; ours.replay_ours').
    is_eagle: ``CacheInitParams.is_eagle`` (EAGLE speculative decoding: bigram keys).
    unified: UnifiedRadixCache with the FULL component (Python core), what 0.5.23's registry
    builds for a plain model, instead of RadixCache.
    eviction_policy: ``CacheInitParams.eviction_policy`` (``--radix-eviction-policy``)."""
    ps = scenario["page_size"]
    size = scenario["capacity_tokens"] - ps  # usable slots; slot/page 0 is SGLang's padding slot
    if ps == 1:
        alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, need_sort)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, ps, torch.float16, "cpu", None, need_sort)
        alloc.use_triton_kernels = False
    # One row per live request, reused after release as SGLang's ReqToTokenPool does.
    length: dict[str, int] = {}
    live_now = max_live = 0
    for op in scenario["ops"]:
        if op["op"] == "new":
            length[op["rid"]] = len(op["prompt"])
            live_now += 1
            max_live = max(max_live, live_now)
        elif op["op"] == "append":
            length[op["rid"]] += len(op["tokens"])
        elif op["op"] == "release":
            live_now -= 1
    rtt = _ReqToTokenPool(max(max_live, 1), max([4096, *length.values()]) + ps)
    free_rows = list(range(max(max_live, 1)))[::-1]
    params = CacheInitParams(disable=False, req_to_token_pool=rtt, token_to_kv_pool_allocator=alloc,
                             page_size=ps, is_eagle=is_eagle, eviction_policy=eviction_policy)
    req_class = _Req
    if unified:
        import sglang.srt.mem_cache.unified_radix_cache as unified_mod
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        shim.deterministic_clock(unified_mod)
        params.tree_components, params.tree_core_backend = (ComponentType.FULL,), "python"
        tree = unified_mod.UnifiedRadixCache(params)
        req_class = _UnifiedReq
    else:
        tree = RadixCache(params)
    reqs: dict[str, _Req] = {}
    live: set[str] = set()
    records: list[dict[str, Any]] = []
    spent = 0.0

    def row_of(r: _Req) -> torch.Tensor:
        return rtt.req_to_token[r.kv.req_pool_idx]

    def pages(r: _Req) -> list[int]:
        slots = row_of(r)[: r.allocated]
        return (slots[::ps] // ps).tolist()  # type: ignore[no-any-return]  # (ints, in C: a trace row is 10k+)

    def grow(r: _Req, n: int, decode: bool) -> bool:
        start = r.allocated
        if ps == 1:
            alloc.evict_to_free_tokens(tree, n)
            out = alloc.alloc(n)
        elif decode:
            alloc.evict_to_free_tokens(tree, ps)
            last = row_of(r)[start - 1: start].clone()
            out = alloc.alloc_decode(torch.tensor([start + 1]), torch.tensor([start + 1]), last)
        else:
            alloc.evict_to_free_tokens(tree, n + ps)
            last = row_of(r)[start - 1: start].clone() if start else torch.tensor([-1])
            out = alloc.alloc_extend(torch.tensor([start]), torch.tensor([start]), torch.tensor([start + n]),
                                     torch.tensor([start + n]), last, n)
        if out is None:
            return False
        row_of(r)[start: start + n] = out
        r.allocated = start + n
        return True

    def release(r: _Req) -> None:
        # release_kv_cache(req, tree, checkpoint=True)
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
            alloc.free_segment(row_of(r)[tail: r.allocated].clone(), start_pos=tail)

    for op in scenario["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        t0 = time.perf_counter()
        if kind == "new":  # a stand-in's list copy, no cache work: not timed (nor is ours)
            reqs[op["rid"]] = req_class(op["rid"], op["prompt"], op.get("salt"), free_rows.pop())
        elif kind == "alloc":
            r = reqs[op["rid"]]
            if op["rid"] not in live:
                ids = r.full_untruncated_fill_ids
                key = RadixKey(ids, r.extra_key, limit=len(ids) - 1, cache_salt=r.cache_salt)
                m = tree.match_prefix(MatchPrefixParams(key=key))
                hit = m.device_prefix_len
                prefix = tree.path_device_indices(m.last_device_node)
                assert len(prefix) == hit
                r.lock = tree.lock(m.last_device_node)
                r.last_node = m.last_device_node
                row_of(r)[:hit] = prefix
                r.allocated = r.computed = hit
                r.kv.cache_protected_len = hit
                r.kv.cache_inserted_len = 0
                n = op["n"] if op.get("n") is not None else r.num_tokens - hit
                ok = grow(r, n, decode=False)
                if not ok:
                    tree.unlock(r.lock)
                    r.lock = None
                else:
                    live.add(op["rid"])
                    r.decoding = False
                rec["ok"] = ok
                rec["hit"] = hit if ok else None
            else:
                n = op["n"] if op.get("n") is not None else r.num_tokens - r.computed
                need = r.computed + n - r.allocated
                decode = bool(r.output_ids) and r.computed >= len(r.origin_input_ids)
                r.decoding = decode
                rec["ok"] = grow(r, need, decode=decode) if need > 0 else True
            spent += time.perf_counter() - t0  # what follows only records
            if record:
                rec["pages"] = pages(r) if rec["ok"] else None
        elif kind == "run":
            r = reqs[op["rid"]]
            r.computed = r.allocated
            if not r.decoding:  # SGLang checkpoints after an extend, not after a decode step
                tree.checkpoint(r, up_to=r.computed)
            spent += time.perf_counter() - t0
            if record:
                rec["pages"] = pages(r)
        elif kind == "append":
            reqs[op["rid"]].output_ids.extend(op["tokens"])
            spent += time.perf_counter() - t0
        elif kind == "release":
            release(reqs[op["rid"]])
            live.discard(op["rid"])
            free_rows.append(reqs[op["rid"]].kv.req_pool_idx)
            spent += time.perf_counter() - t0
        elif kind == "evict":
            rec["freed"] = tree.evict(EvictParams(num_tokens=op["n"])).num_tokens_evicted
            spent += time.perf_counter() - t0
        else:
            raise ValueError(f"unknown op {kind!r}")
        if record:
            free_pages = alloc.available_size() // ps
            evictable = tree.evictable_size() // ps
            rec["usage"] = [free_pages, evictable, size // ps - free_pages - evictable]
        records.append(rec)
    return records, spent


# ---------------------------------------------------------------------------- EAGLE fixtures
EAGLE_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "sglang_eagle"


def eagle_split_prompt(page_size: int) -> Any:
    """A prompt of whole pages with output after it: the checkpoint splits the leaf at the
    prompt's bigrams (one fewer than its tokens), and eviction takes the output part first."""
    from prefixcache.experiments.upstream.scenarios import Scenario

    p = page_size
    prompt, out = list(range(100, 100 + 3 * p)), list(range(200, 200 + 2 * p + 1))
    s = Scenario(f"split_prompt_p{p}", 64 * p, p, systems=("sglang",))
    s.whole("a", prompt, out=out).evict(1).prefill("b", [*prompt, 7]).release("b")
    return s.whole("c", [*prompt, *out, 9], out=[5]).evict(1).evict(1)


def eagle_scenarios() -> list[Any]:
    """The scripted scenarios, two seeded ones and the prompt split, at page 1 and 4
    (scenarios.py)."""
    from prefixcache.experiments.upstream.scenarios import scripted, seeded

    return [
        sc for p in (1, 4) for sc in (*scripted(p), seeded(p, 1), seeded(p, 2), eagle_split_prompt(p))
    ]


def record_eagle() -> None:  # pragma: no cover - needs SGLang
    """Write tests/fixtures/upstream/sglang_eagle/sglang_eagle_*.json: each scenario through
    RadixCache(is_eagle=True), need_sort=False (a plain server's allocator), after checking
    that UnifiedRadixCache(FULL, is_eagle=True) records the same."""
    EAGLE_FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in eagle_scenarios():
        scenario = sc.to_json()
        records, _ = replay_sglang(scenario, need_sort=False, is_eagle=True)
        unified, _ = replay_sglang(scenario, need_sort=False, is_eagle=True, unified=True)
        assert unified == records, f"{scenario['name']}: UnifiedRadixCache(FULL) != RadixCache"
        fixture = {
            "system": "sglang",
            "backend": "radix",
            "upstream": "sglang 0.5.23 mem_cache/radix_cache.py RadixCache(is_eagle=True) + allocator "
            "(UnifiedRadixCache(FULL, python core, is_eagle=True) records the same)",
            "options": {"need_sort": False, "is_eagle": True},
            "scenario": scenario,
            "records": records,
        }
        path = EAGLE_FIXTURES / f"sglang_eagle_{scenario['name']}.json"
        path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        print(path.name, len(records), "ops", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    record_eagle()
