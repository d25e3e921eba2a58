"""Random request streams through SGLang 0.5.23's own caches and through our radix backend,
compared operation by operation (issue 33).

One seeded generator per family writes streams in the operation formats the existing drivers
consume, so both sides run through the drivers' own executors:

  swa        scenarios.py ops + a full / sliding-window layout, page 1 or 16
             (sglang_hybrid_driver: UnifiedRadixCache FULL+SWA, the scheduler's free groups)
  mamba      sglang_mamba_driver's request ops (admit / step / decode / finish), page 1
  hicache-*  hicache_cases' ops (+ "step") under each write policy (sglang_hicache_driver)
  eagle      is_eagle=True: dense (sglang_driver, UnifiedRadixCache FULL) or FULL+SWA
  events     dense with KV events (sglang_kv_events_driver's RadixCache stream) beside the
             page ids and usage of UnifiedRadixCache FULL (sglang_driver, unified=True)
  policies   dense under each of SGLang's eviction policies in turn (evict_policy.py: lru, lfu,
             fifo, mru, filo, priority, slru), UnifiedRadixCache FULL (sglang_driver)
  hicache-policies   HiCache (write policies in turn) under those policies in turn

Streams mix shared system prompts, multi-turn growth, branches cut at and around page and
window boundaries (-1, 0, +1), pools small enough to evict, requests finishing at prefill beside
decoding ones and random finish orders. Live requests never outgrow the pool (the drivers
assert that a running request's allocation succeeds). A differing stream is shrunk by dropping
requests, decode steps and single ops while the same field still differs.

    .venv-upstream/bin/python -m prefixcache.experiments.upstream.random_streams_sglang
    .venv-upstream/bin/python -m prefixcache.experiments.upstream.random_streams_sglang --record

The second form writes tests/fixtures/upstream/random_sglang/ (10 streams per family, seed 0),
replayed without SGLang by tests/test_random_streams_sglang.py; ``--record policies`` writes
only the families named.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefixcache.experiments.upstream.scenarios import Scenario, eviction_policy_of

from prefixcache.eviction import SGLANG_POLICIES

Op = dict[str, Any]
Stream = dict[str, Any]
Records = list[dict[str, Any]]
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "upstream" / "random_sglang"
RESULTS = ROOT / "results" / "random_streams_sglang"
FAMILIES = (
    "swa",
    "mamba",
    "hicache-write_through",
    "hicache-write_through_selective",
    "hicache-write_back",
    "eagle",
    "events",
    "policies",
    "hicache-policies",
)
UPSTREAM = "SGLang 0.5.23 (drivers of experiments/upstream/: hybrid, mamba, hicache, driver, kv_events)"


# ---------------------------------------------------------------------------- generators
def _near(rng: random.Random, unit: int, top: int) -> int:
    """A length at or beside a multiple of ``unit``: k * unit + (-1, 0 or +1), in [1, top]."""
    k = rng.randrange(1, max(2, top // unit + 1))
    return max(1, min(top, k * unit + rng.choice((-1, 0, 1))))


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _Traffic:
    """Prompts for one stream: system prompts, next turns, boundary branches, repeats."""

    def __init__(self, rng: random.Random, units: tuple[int, ...], max_len: int, vocab: int) -> None:
        self.rng, self.units, self.max_len, self.vocab = rng, units, max_len, vocab
        self.seen: list[list[int]] = []  # every sequence written so far (prompts, conversations)
        self.systems = [self.fresh(_near(rng, rng.choice(units), max_len // 2)) for _ in range(2)]

    def fresh(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab) for _ in range(n)]

    def prompt(self) -> list[int]:
        rng, top = self.rng, self.max_len
        kind = rng.random()
        user = self.fresh(rng.randrange(1, max(2, top // 4)))
        if kind < 0.3 and self.seen:  # the next turn of an earlier conversation
            base = rng.choice(self.seen)
            if len(base) + len(user) <= top:
                return base + user
        if kind < 0.6 and self.seen:  # a branch cut at or beside a page / window boundary
            base = rng.choice(self.seen + self.systems)
            cut = min(len(base), _near(rng, rng.choice(self.units), top))
            return base[:cut] + user[: max(1, top - cut)]
        if kind < 0.7 and self.seen:  # an exact repeat
            return list(rng.choice(self.seen))
        return (rng.choice(self.systems) + user)[:top]

    def max_hit(self, prompt: list[int]) -> int:
        """An upper bound of any cache hit: the longest prefix shared with an earlier sequence."""
        return max((_lcp(prompt, s) for s in self.seen), default=0)


def request_stream(
    rng: random.Random,
    name: str,
    capacity: int,
    page: int,
    units: tuple[int, ...],
    live_budget: int,
    n_requests: int,
    *,
    steps: bool = False,
    salts: bool = False,
    last_token_without_kv: bool = True,
) -> Scenario:
    """scenarios.py ops: up to three live requests whose lengths fit ``live_budget`` tokens
    together; each prefills whole or in two chunks, then decodes 0 (finishes at prefill) or
    more tokens, interleaved with the others; releases in random order, evictions, ``step``s."""
    top = max(4, live_budget // 2)
    traffic = _Traffic(rng, units, top, 5000)
    s = Scenario(name, capacity, page, systems=("sglang",))
    live: dict[str, list[int]] = {}  # rid -> outputs still to sample
    size: dict[str, int] = {}  # rid -> the tokens it will hold
    conv: dict[str, list[int]] = {}
    made = 0
    while made < n_requests or live:
        room = live_budget - sum(size.values())
        if made < n_requests and len(live) < 3 and (not live or rng.random() < 0.35):
            prompt = traffic.prompt()
            out = traffic.fresh(min(top // 2, rng.choice((0, 0, 1, 2, rng.randrange(1, 3 * max(units))))))
            if len(prompt) + len(out) + 2 * page > room:
                if not live:
                    continue  # draw another prompt
                rid = rng.choice(list(live))  # no room: advance someone instead
            else:
                rid = f"q{made}"
                made += 1
                hit_max = traffic.max_hit(prompt[:-1])
                s.new(rid, prompt, salt=rng.choice((None, "a")) if salts else None)
                if len(prompt) - hit_max > 1 and rng.random() < 0.3:  # two chunks
                    c = _near(rng, rng.choice(units), len(prompt) - hit_max)
                    s.alloc(rid, min(c, len(prompt) - hit_max - 1)).run(rid)
                s.alloc(rid).run(rid)
                traffic.seen.append(list(prompt))
                conv[rid], live[rid] = list(prompt), out
                size[rid] = len(prompt) + len(out) + page
                if not out and rng.random() < 0.5:  # finishes at prefill, in the same step
                    s.release(rid)
                    del live[rid], size[rid]
                continue
        else:
            rid = rng.choice(list(live))
        out = live[rid]
        if len(out) > (1 if last_token_without_kv else 0):  # one decode step
            tok = out.pop(0)
            s.append(rid, [tok]).alloc(rid, 1).run(rid)
            conv[rid].append(tok)
        else:  # finish: the last sampled token gets no KV
            if out:
                s.append(rid, out)
                conv[rid] += out
            s.release(rid)
            traffic.seen.append(conv[rid])
            del live[rid], size[rid]
        if rng.random() < (0.15 if steps else 0.06):  # HiCache: device pressure sends nodes to host
            s.evict(rng.randrange(1, 8 if steps else 4) * page)
        if steps and rng.random() < 0.35:
            s.ops.append({"op": "step"})
    if steps:
        s.ops.append({"op": "step"})
    return s


def swa_stream(rng: random.Random, i: int, is_eagle: bool = False) -> Stream:
    from prefixcache.backends.radix.swa_pool import swa_pool_sizes

    from prefixcache import CacheConfig

    page = rng.choice((1, 16)) if not is_eagle else rng.choice((1, 2, 4))
    window = rng.choice((4, 6, 8)) if page == 1 else rng.choice((page * 2, page * 2 + page // 2, page * 3))
    n_swa = rng.choice((1, 1, 3))
    layout = [["sliding_window", window]] * n_swa + [["full"]]
    capacity = rng.choice((10, 14)) * window + 4 * page
    cfg = CacheConfig(capacity, page, layout=[tuple(x) for x in layout])
    sizes = swa_pool_sizes(cfg)
    budget = min(sizes.full_tokens, sizes.swa_tokens) * 3 // 5
    name = f"{'eagle_swa' if is_eagle else 'swa'}{i}_p{page}_w{window}"
    s = request_stream(rng, name, capacity, page, (page, window), budget, rng.randrange(12, 28))
    sc = s.to_json()
    sc["layout"] = layout
    sc["options"] = {"swa_eviction_interval": rng.choice((1, 2)), **({"is_eagle": True} if is_eagle else {})}
    return sc


def dense_stream(rng: random.Random, i: int, prefix: str, pages: tuple[int, ...], **kw: Any) -> Stream:
    page = rng.choice(pages)
    unit = max(page, 4)
    capacity = rng.choice((12, 16, 24)) * unit + page
    budget = (capacity - page) * 3 // 5
    s = request_stream(
        rng, f"{prefix}{i}_p{page}", capacity, page, (page, unit), budget, rng.randrange(12, 28), **kw
    )
    return s.to_json()


def hicache_stream(rng: random.Random, i: int, policy: str) -> Stream:
    sc = dense_stream(rng, i, f"hicache_{policy}_", (1, 4), steps=True)
    sc["tier"] = {"write_policy": policy, "ratio": rng.choice((2.0, 2.0, 0.5))}
    return sc


def policy_stream(rng: random.Random, i: int) -> Stream:
    """A dense stream under SGLang's policy number ``i`` (in turn), page 1, 4 or 16."""
    policy = SGLANG_POLICIES[i % len(SGLANG_POLICIES)]
    sc = dense_stream(rng, i, f"policy_{policy}", (1, 4, 16))
    sc["options"] = {"eviction_policy": policy}
    return sc


def hicache_policy_stream(rng: random.Random, i: int) -> Stream:
    """A HiCache stream under write policy and SGLang eviction policy number ``i`` (in turn)."""
    write = ("write_through", "write_through_selective", "write_back")[i % 3]
    sc = hicache_stream(rng, i, write)
    sc["options"] = {"eviction_policy": SGLANG_POLICIES[i % len(SGLANG_POLICIES)]}
    return sc


def eagle_stream(rng: random.Random, i: int) -> Stream:
    if i % 2:
        return swa_stream(rng, i, is_eagle=True)
    return dense_stream(rng, i, "eagle", (1, 4))


def mamba_stream(rng: random.Random, i: int) -> Stream:
    """sglang_mamba_driver's request ops: admissions (a first chunk at or beside a multiple of
    a chunk unit), steps (the next chunk, or one decode step once the prompt is done), decode
    runs, finishes in random order; multi-turn prompts extend finished conversations."""
    unit = rng.choice((2, 3, 4))
    kv_tokens, slots = rng.choice(((35, 6), (41, 6), (49, 6), (55, 6)))  # 2 live: no state short
    traffic = _Traffic(rng, (unit,), 14, 40)
    ops: list[Op] = []
    live: dict[str, int] = {}  # name -> decode tokens (or steps) it may still take
    conv: dict[str, list[int] | None] = {}
    made, n_requests = 0, rng.randrange(12, 28)
    while made < n_requests or live:
        held = sum(len(c or ()) + 8 for c in conv.values() if c is not None) + 22 * sum(
            c is None for c in conv.values()
        )
        if made < n_requests and len(live) < 2 and (not live or rng.random() < 0.3):
            tokens = traffic.prompt()
            if len(tokens) + 8 + held <= kv_tokens * 3 // 4:
                name = f"R{made}"
                made += 1
                whole = rng.random() < 0.5
                chunk = len(tokens) if whole else _near(rng, unit, len(tokens))
                ops.append({"op": "admit", "name": name, "tokens": tokens, "chunk": chunk})
                traffic.seen.append(list(tokens))
                live[name] = rng.randrange(0, 8)
                # after a whole admission the prompt is done; after a chunk it depends on the hit
                conv[name] = list(tokens) if whole else None
                continue
        if not live:
            continue  # draw another prompt
        name = rng.choice(list(live))
        c = conv[name]
        if live[name] and c is None:  # the next chunk, or one decode step
            ops.append({"op": "step", "name": name, "n": _near(rng, unit, 8), "token": rng.randrange(1, 40)})
            live[name] -= 1
        elif live[name] and c is not None:
            toks = [rng.randrange(1, 40) for _ in range(rng.randrange(1, live[name] + 1))]
            ops.append({"op": "decode", "name": name, "tokens": toks})
            c += toks
            live[name] -= len(toks)
        else:
            ops.append({"op": "finish", "name": name})
            if c is not None:
                traffic.seen.append(c)
            del live[name], conv[name]
    return {"name": f"mamba{i}_u{unit}", "kv_tokens": kv_tokens, "mamba_slots": slots, "ops": ops}


GENERATORS: dict[str, Callable[[random.Random, int], Stream]] = {
    "swa": swa_stream,
    "mamba": mamba_stream,
    "hicache-write_through": lambda rng, i: hicache_stream(rng, i, "write_through"),
    "hicache-write_through_selective": lambda rng, i: hicache_stream(rng, i, "write_through_selective"),
    "hicache-write_back": lambda rng, i: hicache_stream(rng, i, "write_back"),
    "eagle": eagle_stream,
    "events": lambda rng, i: dense_stream(rng, i, "events", (1, 4), salts=True),
    "policies": policy_stream,
    "hicache-policies": hicache_policy_stream,
}


def streams_of(family: str, seed: int, n: int) -> list[Stream]:
    base = FAMILIES.index(family) * 1_000_003 + seed * 7919
    return [GENERATORS[family](random.Random(base + i), i) for i in range(n)]


# ---------------------------------------------------------------------------- ours
# The mamba and events replays of ours mirror tests/test_radix_mamba_upstream.py::
# replay_requests and tests/test_kv_events_backends.py::replay: those modules import pytest,
# which the upstream venv lacks.
def replay_mamba_ours(sc: Stream) -> Records:
    """sglang_mamba_driver's request ops through RadixPrefixCache, pools sized alike."""
    from prefixcache.backends.radix import RadixPrefixCache

    from prefixcache import CacheConfig, Request

    capacity, odd = divmod(sc["kv_tokens"] + sc["mamba_slots"] + 1, 2)
    assert not odd, "kv_tokens + mamba_slots must be odd"
    cache = RadixPrefixCache(
        CacheConfig(capacity, 1, layout=[("mamba", 1), ("full",)]), max_mamba_cache_size=sc["mamba_slots"]
    )
    reqs: dict[str, Request] = {}
    out: Records = []

    def run(req: Request, n: int) -> None:
        assert cache.allocate(req, n), f"{req.request_id}: no room for {n} tokens"
        req.num_computed_tokens += n
        cache.commit(req)

    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind, name = op["op"], op["name"]
        prompt_done = kind == "step" and reqs[name].num_computed_tokens >= reqs[name].num_prompt_tokens
        if kind == "admit":
            req = reqs[name] = Request(name, op["tokens"])
            m = cache.lookup(req)
            n = min(op["chunk"], req.num_tokens - m.tokens)
            assert cache.allocate(req, n, m)
            rec["hit"] = req.num_computed_tokens
            rec["cow_source"] = cache.request_kv(req).cow_source
            rec["state"] = cache.page_tables(req)[1][0]
            req.num_computed_tokens += n
            cache.commit(req)
        elif kind == "decode" or prompt_done:
            for t in op["tokens"] if kind == "decode" else [op["token"]]:
                reqs[name].append_output_token_ids(t)
                run(reqs[name], 1)
        elif kind == "step":
            req = reqs[name]
            run(req, min(op["n"], req.num_prompt_tokens - req.num_computed_tokens))
        elif kind == "finish":
            req = reqs.pop(name)
            rec["donated"] = cache.page_tables(req)[1][0]
            cache.release(req)
        else:
            raise ValueError(f"unknown op {kind!r}")
        if kind != "finish":
            req = reqs[name]
            rec["kv"] = cache.page_tables(req)[0][: req.num_computed_tokens]
            rec["protected"] = cache._live[req.request_id].state.protected
        tree = cache.tree
        mamba = cache.component
        pools = [cache.pool.num_free, mamba.states.num_free, tree.evictable_size(), mamba.evictable]
        rec["pools"] = pools
        rec["states"] = _mamba_states(tree)
        cache.check_invariants()
        out.append(rec)
    return out


def _mamba_states(tree: Any) -> list[list[Any]]:
    out: list[list[Any]] = []
    stack: list[tuple[Any, list[int]]] = [(tree.root_node, [])]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path + child.key.tolist()
            if child.mamba is not None:
                out.append([p, child.mamba])
            stack.append((child, p))
    return sorted(out)


def replay_events_ours(sc: Stream) -> Records:
    """Per op: ok, hit, pages, freed, usage (ours.replay_ours) and the KV events it drained."""
    from prefixcache.experiments.upstream.kv_event_cases import event_json
    from prefixcache.experiments.upstream.ours import replay_ours

    from prefixcache import CacheConfig, Request, make_cache

    records, _ = replay_ours("radix", sc, need_sort=False)
    cache = make_cache("radix", CacheConfig(sc["capacity_tokens"], sc["page_size"]), kv_events=True)
    first = cache.kv_events.take_events()  # the construction's reset: SGLang's first drain holds it too
    reqs: dict[str, Request] = {}
    for i, op in enumerate(sc["ops"]):
        kind, rid = op["op"], op.get("rid")
        if kind == "new":
            reqs[rid] = Request(rid, op["prompt"], cache_salt=op.get("salt"))
        elif kind == "alloc":
            req = reqs[rid]
            m = cache.lookup(req) if not cache.is_live(req) else None
            done = m.tokens if m is not None else req.num_computed_tokens
            cache.allocate(req, op["n"] if op.get("n") is not None else req.num_tokens - done, m)
        elif kind == "run":
            reqs[rid].num_computed_tokens = cache.reserved_tokens(reqs[rid])
            cache.commit(reqs[rid])
        elif kind == "append":
            reqs[rid].append_output_token_ids(op["tokens"])
        elif kind == "release":
            cache.release(reqs[rid])
        elif kind == "evict":
            cache.evict(op["n"])
        events = (first if i == 0 else []) + cache.kv_events.take_events()
        records[i]["events"] = [event_json(e) for e in events]
    return records


def replay_ours_family(family: str, sc: Stream) -> Records:
    from prefixcache.experiments.upstream.ours import replay_ours
    from prefixcache.experiments.upstream.sglang_hicache_driver import replay_ours as hicache_ours
    from prefixcache.experiments.upstream.sglang_hybrid_driver import replay_requests_ours

    if family == "mamba":
        return replay_mamba_ours(sc)
    if family.startswith("hicache"):
        return hicache_ours(sc)
    if family == "events":
        return replay_events_ours(sc)
    if "layout" in sc:
        return replay_requests_ours(sc)
    if family == "policies":
        return replay_ours("radix", sc, need_sort=False, eviction_policy=eviction_policy_of(sc))[0]
    return replay_ours("radix", sc, need_sort=False, is_eagle=True)[0]


# ---------------------------------------------------------------------------- upstream
def replay_upstream_family(family: str, sc: Stream) -> Records:  # pragma: no cover - needs SGLang
    from prefixcache.experiments.upstream import shim  # noqa: F401 - import stubs first

    if family == "mamba":
        from prefixcache.experiments.upstream.sglang_mamba_driver import replay_requests_upstream

        return replay_requests_upstream(sc)
    if family.startswith("hicache"):
        from prefixcache.experiments.upstream.sglang_hicache_driver import replay_upstream

        return replay_upstream(sc)
    if "layout" in sc:
        from prefixcache.experiments.upstream.sglang_hybrid_driver import replay_requests_upstream

        return replay_requests_upstream(sc)
    from prefixcache.experiments.upstream.sglang_driver import replay_sglang

    records, _ = replay_sglang(
        sc, need_sort=False, is_eagle=family == "eagle", unified=True, eviction_policy=eviction_policy_of(sc)
    )
    if family == "events":
        from prefixcache.experiments.upstream.sglang_kv_events_driver import replay_events

        for rec, ev in zip(records, replay_events(sc, need_sort=False), strict=True):
            # RadixCache's event stream beside UnifiedRadixCache's pages: both trees agree
            assert (ev.get("ok"), ev.get("hit")) == (rec.get("ok"), rec.get("hit")) or "ok" not in ev
            rec["events"] = [{k: v for k, v in e.items() if k != "cache_salt"} for e in ev["events"]]
    return records


# ---------------------------------------------------------------------------- comparing
def op_differences(family: str, sc: Stream, ours: Records, upstream: Records) -> list[tuple[int, str, str]]:
    """(op index, field, message) for every field of every op where the two records differ;
    HiCache's first record is the pool setup (index -1)."""
    ops = sc["ops"]
    shift = 1 if family.startswith("hicache") else 0
    labels = [{"op": "setup"}] * shift + ops
    out: list[tuple[int, str, str]] = []
    for i, (a, b, op) in enumerate(zip(ours, upstream, labels, strict=True)):
        for f in sorted(a.keys() | b.keys()):
            if a.get(f) != b.get(f):
                who = op.get("rid", op.get("name", ""))
                out.append(
                    (
                        i - shift,
                        f,
                        f"op {i - shift} {op['op']} {who}: {f} ours={a.get(f)} upstream={b.get(f)}",
                    )
                )
    return out


def _differs(
    family: str, sc: Stream, upstream: Callable[[str, Stream], Records]
) -> list[tuple[int, str, str]] | None:
    """The differences, or None where either side refused the stream (a shrunk stream that
    no longer fits the pool, a request dropped under its own ops)."""
    try:
        return op_differences(family, sc, replay_ours_family(family, sc), upstream(family, sc))
    except (AssertionError, KeyError, ValueError, IndexError, AttributeError, TypeError, RuntimeError):
        return None


def _groups(family: str, ops: list[Op]) -> list[list[int]]:
    """Op index groups that can be dropped together: whole requests, decode steps, single
    evictions / steps / mamba steps and decodes."""
    key = "name" if family == "mamba" else "rid"
    by_req: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if key in op:
            by_req.setdefault(op[key], []).append(i)
    groups = list(by_req.values())
    for i, op in enumerate(ops):
        if op["op"] in ("evict", "step", "decode"):
            groups.append([i])
        elif (
            op["op"] == "append"
            and i + 2 < len(ops)
            and ops[i + 1] == {"op": "alloc", "rid": op["rid"], "n": 1}
            and ops[i + 2]["op"] == "run"
        ):
            groups.append([i, i + 1, i + 2])
    return groups


def shrink(family: str, sc: Stream, upstream: Callable[[str, Stream], Records], budget: int = 400) -> Stream:
    """Drop op groups while the first differing field (its name) still differs."""
    first = _differs(family, sc, upstream)
    assert first, "shrink wants a differing stream"
    field = first[0][1]
    changed = True
    while changed and budget > 0:
        changed = False
        for group in sorted(_groups(family, sc["ops"]), key=len, reverse=True):
            if budget <= 0:
                break
            budget -= 1
            drop = set(group)
            trial = {**sc, "ops": [op for i, op in enumerate(sc["ops"]) if i not in drop]}
            diffs = _differs(family, trial, upstream)
            if diffs and diffs[0][1] == field:
                sc, changed = trial, True
                break
    return sc


def describe(family: str, sc: Stream, upstream: Callable[[str, Stream], Records]) -> str:
    diffs = _differs(family, sc, upstream) or []
    head = {k: v for k, v in sc.items() if k != "ops"}
    lines = [f"  stream {json.dumps(head)}"]
    lines += [f"    {i:3d} {json.dumps(op)}" for i, op in enumerate(sc["ops"])]
    lines += [f"  first difference: {diffs[0][2]}" if diffs else "  (no difference)"]
    return "\n".join(lines)


def run_family(
    family: str, streams: int, seed: int, upstream: Callable[[str, Stream], Records] | None = None
) -> tuple[int, int, str | None]:
    """(streams agreeing on every op and field, streams, the first differing one shrunk)."""
    upstream = upstream or replay_upstream_family
    agreeing, first = 0, None
    for sc in streams_of(family, seed, streams):
        diffs = op_differences(family, sc, replay_ours_family(family, sc), upstream(family, sc))
        if not diffs:
            agreeing += 1
        elif first is None:
            first = describe(family, shrink(family, sc, upstream), upstream)
    return agreeing, streams, first


def record(n: int = 10, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> None:  # pragma: no cover
    """Write n streams per family at ``seed`` with SGLang's records, one file per family."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for family in families:
        cases = [
            {"scenario": sc, "records": replay_upstream_family(family, sc)}
            for sc in streams_of(family, seed, n)
        ]
        path = FIXTURES / f"random_{family}_s{seed}.json"
        body = ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases)
        head = json.dumps({"family": family, "seed": seed, "upstream": UPSTREAM}, separators=(",", ":"))
        path.write_text(head[:-1] + ',"streams":[\n' + body + "\n]}\n")
        print(f"wrote {path.name}: {n} streams, {sum(len(c['records']) for c in cases)} records")


def main(streams: int = 100, seeds: tuple[int, ...] = (0, 1), families: tuple[str, ...] = FAMILIES) -> None:
    table = []
    for family in families:
        for seed in seeds:
            t0 = time.perf_counter()
            agreeing, total, first = run_family(family, streams, seed)
            secs = time.perf_counter() - t0
            print(f"{family} {seed}: agree {agreeing}/{total}  ({secs:.0f} s)", flush=True)
            if first:
                print(first, flush=True)
            table.append({"family": family, "seed": seed, "agree": agreeing, "total": total, "first": first})
    out = RESULTS / f"streams{streams}_seeds{'-'.join(map(str, seeds))}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps({"streams": streams, "seeds": list(seeds), "families": list(families)})
    )
    (out / "results.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":  # pragma: no cover
    args = sys.argv[1:]
    if args[:1] == ["--record"]:
        record(families=tuple(a for a in args[1:] if a in FAMILIES) or FAMILIES)
    else:
        fams = tuple(a for a in args if a in FAMILIES) or FAMILIES
        nums = [int(a) for a in args if a.isdigit()]
        main(streams=nums[0] if nums else 100, families=fams)
