"""Replay host-tier cases (hicache_cases.py) through SGLang 0.5.23's own ``UnifiedRadixCache``
(FULL component, python tree core) over its real token-to-KV allocator, with HiCache switched on
as ``init_hicache`` leaves it, and record what it does; and replay them through ours.

What is not upstream code: ``init_hicache`` itself (it builds CUDA-side transfer machinery via
``attach_hybrid_pool_to_unified_cache``) is replaced by setting the fields it sets (controller,
``host_pool_group``, the FULL component's host pool, ``set_hicache_enabled``,
``write_through_threshold`` = 1 for write_through else 2, ``is_write_back``,
``load_back_threshold`` = 10); the host pool is 0.5.23's ``HostKVCache`` built with
``is_dummy=True`` (its real sizing, warning and slot allocator, no buffers); the controller is a
stand-in whose ``write`` / ``load`` take host / device slots from those allocators and whose
copies finish at once (their acks are reaped by the next ``check_hicache_events``).

The request flow is the one of sglang_hybrid_driver.py (match, lock, extend, checkpoint,
``release_kv_cache``), plus ``PrefillAdder.add_one_req``'s load-back: with
``_lock_node(best_match_node, lock_host=True)`` held, ``init_load_back``'s ``load_back`` of the
best match node; on success the request's last node becomes it. Run
``python -m prefixcache.experiments.upstream.sglang_hicache_driver`` with the upstream venv to
(re)write tests/fixtures/upstream/hicache/.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from prefixcache.experiments.upstream.scenarios import eviction_policy_of
from prefixcache.experiments.upstream.sglang_hybrid_driver import grow_row, release_row

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "upstream" / "hicache"
UPSTREAM = (
    "SGLang 0.5.23 UnifiedRadixCache(FULL, python tree core) with HiCache fields as init_hicache "
    "sets them, HostKVCache(is_dummy) host allocator, a controller whose copies finish at once"
)


def _state(value: Any, host_value: Any) -> str:
    return {(True, False): "d", (True, True): "dh", (False, True): "h"}[
        (value is not None, host_value is not None)
    ]


# ---------------------------------------------------------------------------- upstream
def replay_upstream(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:  # pragma: no cover
    import logging

    import torch
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first
    from prefixcache.experiments.upstream.sglang_driver import _ReqToTokenPool
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.pool_host.base import HostKVCache
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    class DummyHostPool(HostKVCache):
        """0.5.23's host pool with no buffers: sizing, warning and allocator are upstream's."""

        def get_size_per_token(self):  # type: ignore[no-untyped-def]
            return 1

        def init_kv_buffer(self, *a, **k):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        load_to_device_per_layer = backup_from_device_all_layer = init_kv_buffer
        get_data_page = get_dummy_flat_data_page = set_from_flat_data_page = init_kv_buffer

    class Done:
        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

    class Ack:
        def __init__(self, node_ids: list[int]) -> None:
            self.start_event = self.finish_event = Done()
            self.node_ids = node_ids
            self.num_tokens_by_pool = None
            self.num_bytes = 0
            self.timing_enabled = False

    ps, tier = sc["page_size"], sc["tier"]
    size = sc["capacity_tokens"] - ps  # usable slots; page 0 is SGLang's padding page
    if ps == 1:
        alloc = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, ps, torch.float16, "cpu", None, False)
        alloc.use_triton_kernels = False
    warned: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.append(record.getMessage())

    grab = Grab(logging.WARNING)
    logging.getLogger("sglang.srt.mem_cache.pool_host.base").addHandler(grab)
    host = DummyHostPool(
        dtype=torch.float16,
        device_capacity_tokens=size,
        size_per_token=1,
        start_layer=0,
        end_layer=1,
        host_to_device_ratio=tier["ratio"],
        host_size=0,
        page_size=ps,
        layout="layer_first",
        pin_memory=False,
        device="cpu",
        is_dummy=True,
    )
    host._allocate_host_buffer = lambda: None  # type: ignore[method-assign]
    if host.size <= size:  # is_dummy skips _allocate_host_buffer, where 0.5.23 warns
        warned.append("smaller than the device pool")
    logging.getLogger("sglang.srt.mem_cache.pool_host.base").removeHandler(grab)

    class Controller:
        """HybridCacheController's write / load / queues, copies finishing at once."""

        def __init__(self) -> None:
            self.write_policy = tier["write_policy"]
            self.enable_storage = False
            self.mem_pool_host = type("Group", (), {})()
            anchor = type("Entry", (), {})()
            anchor.host_pool = host
            anchor.host_evict_fn = None
            self.mem_pool_host.anchor_entry = anchor
            self.mem_pool_host.available_size = host.available_size
            self.write_queue: list[int] = []
            self.ack_write_queue: list[Ack] = []
            self.ack_load_queue: list[Ack] = []

        def write(self, device_indices, node_id=-1, extra_pools=None, flush=True, **kw):  # type: ignore[no-untyped-def]
            host_indices = host.alloc(len(device_indices))
            if host_indices is None:
                return None
            self.write_queue.append(node_id)
            if flush:
                self.start_writing()
            return host_indices

        def start_writing(self) -> None:
            if self.write_queue:
                self.ack_write_queue.append(Ack(list(self.write_queue)))
                self.write_queue = []

        def load(self, host_indices, priority=None, node_id=-1, extra_pools=None, **kw):  # type: ignore[no-untyped-def]
            device_indices = alloc.alloc(len(host_indices))
            if device_indices is None:
                return None
            self.ack_load_queue.append(Ack([node_id]))  # start_loading at the batch's forward
            return device_indices

    rtt = _ReqToTokenPool(8, 4096)
    tree = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=rtt,
            token_to_kv_pool_allocator=alloc,
            page_size=ps,
            tree_components=(ComponentType.FULL,),
            tree_core_backend="python",
            enable_kv_cache_events=events,
            eviction_policy=eviction_policy_of(sc),
        )
    )
    # What init_hicache (+ attach_hybrid_pool_to_unified_cache) leaves set for a FULL tree.
    tree.cache_controller = Controller()
    tree.host_pool_group = type("HostPoolGroup", (), {"free": staticmethod(lambda v, pool: host.free(v))})()
    tree.components[ComponentType.FULL]._full_kv_pool_host = host
    tree.tree_core.set_hicache_enabled()
    tree.write_through_threshold = 1 if tier["write_policy"] == "write_through" else 2
    tree.is_write_back = tier["write_policy"] == "write_back"
    tree.load_back_threshold = 10

    class Req:
        def __init__(self, rid: str, prompt: list[int], row: int) -> None:
            self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []
            self.extra_key = self.cache_salt = self.priority = self.lock = self.last_node = None
            self.session = self.session_id = self.kv_rotation_base = None
            self.swa_host_hit_length = self.mamba_host_hit_length = 0
            self.kv = ReqKvInfo(req_pool_idx=row)
            self.allocated = self.computed = 0
            self.decoding, self.done = False, False

        def finished(self) -> bool:
            return self.done

        @property
        def full_untruncated_fill_ids(self) -> list[int]:
            return self.origin_input_ids + self.output_ids

        @property
        def seqlen(self) -> int:
            return len(self.origin_input_ids) + len(self.output_ids)

    free_rows = list(range(8))[::-1]
    reqs: dict[str, Req] = {}
    live: set[str] = set()
    records: list[dict[str, Any]] = [{"warned": bool(warned), "host_size": host.size}]
    last_nodes: list[list[Any]] = []

    def row(r: Req) -> torch.Tensor:
        return rtt.req_to_token[r.kv.req_pool_idx]

    def pages(r: Req) -> list[int]:
        return [int(x) // ps for x in row(r)[: r.allocated][::ps]]

    def grow(r: Req, n: int, decode: bool) -> bool:
        return grow_row(alloc, tree, row(r), r, n, decode, ps)

    def release(r: Req) -> None:  # release_kv_cache(req, tree, checkpoint=True)
        release_row(tree, r, ps)

    def states() -> list[list[Any]]:
        out = []
        stack = [(tree.tree_core.root_node, 0)]
        while stack:
            node, depth = stack.pop()
            for child in node.children.values():
                cd = child.component_data[ComponentType.FULL]
                end = depth + len(child.key)
                out.append([end, len(child.key), _state(cd.value, cd.host_value)])
                stack.append((child, end))
        return sorted(out)

    for op in sc["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[op["rid"]] = Req(op["rid"], op["prompt"], free_rows.pop())
        elif kind == "alloc":
            r = reqs[op["rid"]]
            if op["rid"] not in live:
                ids = r.full_untruncated_fill_ids
                m = tree.match_prefix(MatchPrefixParams(key=RadixKey(ids, None, limit=len(ids) - 1)))
                rec["hit"], rec["host"] = m.device_prefix_len, m.host_hit_length
                r.last_node = m.last_device_node
                loaded = 0
                if m.host_hit_length > 0:  # add_one_req -> init_load_back -> load_back
                    host_lock = tree.inc_host_lock_ref(m.best_match_node).to_dec_params()
                    pin = tree.lock(m.best_match_node)
                    if tree.load_back(m.best_match_node, None, req=r):
                        loaded = len(
                            tree.tree_core.collect_full_device_indices(m.best_match_node, r.last_node)
                        )
                        r.last_node = m.best_match_node
                    tree.unlock(pin)
                    tree.dec_host_lock_ref(m.best_match_node, host_lock)
                rec["loaded"] = loaded
                hit = m.device_prefix_len + loaded
                prefix = tree.path_device_indices(r.last_node)
                assert len(prefix) == hit
                r.lock = tree.lock(r.last_node)
                row(r)[:hit] = prefix
                r.allocated = r.computed = hit
                r.kv.cache_protected_len = hit
                n = min(op["n"], r.seqlen - hit) if op.get("n") is not None else r.seqlen - hit
                ok = grow(r, n, decode=False)
                assert ok, f"{sc['name']}: an admission failed; resize the case"
                live.add(op["rid"])
                r.decoding = False
                rec["ok"] = ok
                rec["pages"] = pages(r)  # page tables at admission (later ones: see usage)
            else:
                n = op["n"] if op.get("n") is not None else r.seqlen - r.computed
                need = r.computed + n - r.allocated
                decode = bool(r.output_ids) and r.computed >= len(r.origin_input_ids)
                r.decoding = decode
                rec["ok"] = grow(r, need, decode=decode) if need > 0 else True
                assert rec["ok"], f"{sc['name']}: a running request's allocation failed; resize the case"
        elif kind == "run":
            r = reqs[op["rid"]]
            r.computed = r.allocated
            if not r.decoding:
                tree.checkpoint(r, up_to=r.computed)
        elif kind == "append":
            reqs[op["rid"]].output_ids.extend(op["tokens"])
        elif kind == "release":
            r = reqs[op["rid"]]
            release(r)
            live.discard(op["rid"])
            free_rows.append(r.kv.req_pool_idx)
        elif kind == "evict":
            rec["freed"] = tree.evict(EvictParams(num_tokens=op["n"])).num_tokens_evicted
        elif kind == "step":
            tree.check_hicache_events()
        else:
            raise ValueError(f"unknown op {kind!r}")
        free = alloc.available_size() // ps
        evictable = tree.evictable_size() // ps
        rec["usage"] = [free, evictable, size // ps - free - evictable]
        rec["host_free"] = host.available_size() // ps
        nodes = states()
        if nodes != last_nodes:  # the tree's nodes and states, recorded where they change
            rec["nodes"] = last_nodes = nodes
        if events:  # the events drained after the op (the first: the construction's too)
            from prefixcache.experiments.upstream.kv_event_cases import event_json

            rec["events"] = [event_json(e) for e in tree.take_events()]
        records.append(rec)
    return records


# ---------------------------------------------------------------------------- ours
def replay_ours(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:
    """The same ops through ``make_cache("radix", ..., host_tier=...)`` and the contract;
    ``events``: with ``kv_events``, each record holds the events drained after its op."""
    from prefixcache import CacheConfig, Request, make_cache
    from prefixcache.tiers import HostTierConfig

    tier = HostTierConfig(write_policy=sc["tier"]["write_policy"], ratio=sc["tier"]["ratio"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = make_cache(
            "radix",
            CacheConfig(sc["capacity_tokens"], sc["page_size"]),
            host_tier=tier,
            clock=itertools.count().__next__,
            kv_events=events,
            eviction_policy=eviction_policy_of(sc),
        )
    warned = any("smaller than the device pool" in str(w.message) for w in caught)
    reqs: dict[str, Request] = {}
    out: list[dict[str, Any]] = [{"warned": warned, "host_size": cache.host_size}]  # type: ignore[attr-defined]
    last_nodes: list[list[Any]] = []
    for op in sc["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        if kind == "new":
            reqs[op["rid"]] = Request(op["rid"], op["prompt"])
        elif kind == "alloc":
            req = reqs[op["rid"]]
            first = not cache.is_live(req)
            match = cache.lookup(req) if first else None
            done = match.tokens + match.host_tokens if match is not None else req.num_computed_tokens
            n = req.num_tokens - done if op.get("n") is None else min(op["n"], req.num_tokens - done)
            ok = cache.allocate(req, n, match) if n > 0 else True
            rec["ok"] = ok
            if match is not None:
                rec["hit"], rec["host"] = match.tokens, match.host_hit_length  # type: ignore[attr-defined]
                rec["loaded"] = cache.host_tier.loaded_tokens(req)
                rec["pages"] = cache.page_table(req) if ok else None
        elif kind == "run":
            req = reqs[op["rid"]]
            req.num_computed_tokens = cache.reserved_tokens(req)
            cache.commit(req)
        elif kind == "append":
            reqs[op["rid"]].append_output_token_ids(op["tokens"])
        elif kind == "release":
            cache.release(reqs[op["rid"]])
        elif kind == "evict":
            rec["freed"] = cache.evict(op["n"])
        elif kind == "step":
            cache.host_tier.advance_transfers()
        else:
            raise ValueError(f"unknown op {kind!r}")
        cache.check_invariants()
        rec["usage"] = list(cache.usage())
        rec["host_free"] = cache.host_tier.usage().free  # type: ignore[union-attr]
        nodes, stack = [], [(cache.tree.root_node, 0)]  # type: ignore[attr-defined]
        while stack:
            node, depth = stack.pop()
            for child in node.children.values():
                end = depth + len(child.key)
                nodes.append([end, len(child.key), _state(child.value, child.host_value)])
                stack.append((child, end))
        if sorted(nodes) != last_nodes:
            rec["nodes"] = last_nodes = sorted(nodes)
        if events:
            from prefixcache.experiments.upstream.kv_event_cases import event_json

            rec["events"] = [event_json(e) for e in cache.kv_events.take_events()]
        out.append(rec)
    return out


def compare(
    ours: list[dict[str, Any]], upstream: list[dict[str, Any]], ops: list[dict[str, Any]]
) -> list[str]:
    """Differences, one per (op, field); the first record is the pool setup."""
    diffs: list[str] = []
    labels = [{"op": "setup"}, *ops]
    for i, (a, b, op) in enumerate(zip(ours, upstream, labels, strict=True)):
        for f in sorted(a.keys() | b.keys()):
            if a.get(f) != b.get(f):
                diffs.append(
                    f"op {i - 1} {op['op']} {op.get('rid', '')}: {f} ours={a.get(f)} upstream={b.get(f)}"
                )
    return diffs


def main() -> None:  # pragma: no cover - needs SGLang
    from prefixcache.experiments.upstream.hicache_cases import all_cases

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_cases():
        records = replay_upstream(sc)
        path = FIXTURES / f"sglang_hicache_{sc['name']}.json"
        path.write_text(
            json.dumps(
                {"system": "sglang-hicache", "upstream": UPSTREAM, "scenario": sc, "records": records},
                separators=(",", ":"),
            )
        )
        diffs = compare(replay_ours(sc), records, sc["ops"])
        print(path.name, len(records), "records;", f"{len(diffs)} differences from ours", file=sys.stderr)
        for d in diffs[:5]:
            print("   ", d, file=sys.stderr)


EVENT_FIXTURES = FIXTURES.parent / "events" / "sglang_hicache_streams"


def record_events() -> None:  # pragma: no cover - needs SGLang
    """Every case with KV events on (device and host media), to tests/fixtures/upstream/events/
    sglang_hicache_streams/ (tests/test_radix_hybrid_events.py)."""
    from prefixcache.experiments.upstream.hicache_cases import all_cases

    EVENT_FIXTURES.mkdir(parents=True, exist_ok=True)
    for sc in all_cases():
        records = [{"events": r.get("events", [])} for r in replay_upstream(sc, events=True)]
        out = {"system": "sglang-hicache", "upstream": UPSTREAM, "scenario": sc, "records": records}
        path = EVENT_FIXTURES / f"sglang_hicache_events_{sc['name']}.json"
        path.write_text(json.dumps(out, separators=(",", ":")))
        print(path.name, file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    main()
    record_events()
