"""Host-tier (vLLM 0.33 OffloadingConnector) scenarios and the engine loop both sides replay.

``replay(case, side)`` is one small scheduler, the same for vLLM's real connector
(vllm_offload_driver.py) and for our hashchain backend (``OursOffload`` below). Each step it
lets the side begin the step; schedules the running requests (the rest of the prefill, or one
decode token; a request loading from the host computes once the side reports its load done);
admits waiting requests first come first served (a deferred lookup, vLLM's None, skips the
request this step); ends the schedule (vLLM: build_connector_meta); computes, samples one
token per request that reached its end and releases the finished ones; and lets the side end
the step. Nothing is preempted (the pools are sized for it). ``clear_gpu_at`` steps drop every
GPU block no request holds (vLLM ``evict_blocks``), so that the host tier has to serve.

The fixtures hold, and the test compares: a record per admission (step, GPU hit, external
hit, steps deferred); per step, the chunks stored and evicted, each named by the request and
chunk index that first stored its key; the external_prefix_cache_* counters.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Protocol

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig

GPU_BLOCK = 16


class Side(Protocol):
    def begin_step(self) -> None: ...
    def lookup(self, rid: str) -> tuple[int, int | None]: ...  # (GPU hit, external or None)
    def admit(self, rid: str, local: int, external: int, n: int) -> bool: ...
    def extend(self, rid: str, n: int) -> bool: ...
    def computed(self, rid: str, n: int, token: int | None) -> None: ...
    def finish(self, rid: str) -> None: ...
    def schedule_end(self, scheduled: dict[str, int], new: list[str]) -> None: ...
    def end_step(self) -> None: ...
    def clear_gpu(self) -> None: ...
    def take_keys(self) -> tuple[list[tuple[str, int, bytes]], list[bytes]]: ...  # stored, evicted
    def loaded(self, rid: str) -> bool: ...  # its host load is acknowledged
    def num_computed(self, rid: str) -> int: ...
    def num_tokens(self, rid: str) -> int: ...
    def metrics(self) -> dict[str, int]: ...
    def take_events(self) -> list[dict[str, Any]]: ...  # KV events as JSON (cases with kv_events)


def replay(case: dict[str, Any], side: Side) -> dict[str, Any]:
    reqs = {r["rid"]: r for r in case["requests"]}
    arrivals: dict[int, list[str]] = {}
    for r in case["requests"]:
        arrivals.setdefault(r["arrival"], []).append(r["rid"])
    waiting: deque[str] = deque()
    running: list[str] = []
    loading: dict[str, int] = {}  # rid -> its admission step (computes from the next one)
    outputs: dict[str, int] = {}
    deferred: dict[str, int] = {}
    admissions: list[list[Any]] = []
    steps: list[dict[str, Any]] = []
    events: list[list[Any]] = []  # [step, the step's KV events], cases with kv_events only
    names: dict[bytes, str] = {}  # key -> "rid:chunk" of the request that first stored it

    def record(step: int, stored: list[tuple[str, int, bytes]], evicted: list[bytes]) -> None:
        for rid, idx, key in stored:
            names.setdefault(key, f"{rid}:{idx}")
        if not (stored or evicted):
            return
        if not steps or steps[-1]["step"] != step:
            steps.append({"step": step, "stored": [], "evicted": []})
        steps[-1]["stored"] += [names[k] for *_, k in stored]
        steps[-1]["evicted"] += [names[k] for k in evicted]

    last_event = max([*arrivals, *case.get("clear_gpu_at", ())])
    idle = 0
    error: str | None = None
    for step in range(case.get("max_steps", 400)):
        waiting.extend(arrivals.get(step, ()))
        if step in case.get("clear_gpu_at", ()):
            side.clear_gpu()  # every GPU block no request holds drops its hash
        side.begin_step()
        record(step - 1, *side.take_keys())  # ours builds the last step's stores only now
        scheduled: dict[str, int] = {}
        for rid in running:
            if rid in loading:
                if not side.loaded(rid):
                    continue
                del loading[rid]
            n = side.num_tokens(rid) - side.num_computed(rid)
            if n < 1 or not side.extend(rid, n):
                error = f"{rid}: no room at step {step}"  # the loop has no preemption
                break
            scheduled[rid] = n
        if error is not None:
            break
        new: list[str] = []
        for rid in list(waiting):
            local, external = side.lookup(rid)
            if external is None:
                deferred[rid] = deferred.get(rid, 0) + 1
                continue
            n = side.num_tokens(rid) - local - external
            if not side.admit(rid, local, external, n):
                break
            waiting.remove(rid)
            running.append(rid)
            new.append(rid)
            admissions.append([step, rid, local, external, deferred.get(rid, 0)])
            if external:
                loading[rid] = step
            else:
                scheduled[rid] = n
        side.schedule_end(scheduled, new)
        finished: list[str] = []
        for rid, n in scheduled.items():
            done = side.num_computed(rid) + n >= side.num_tokens(rid)
            token = None
            if done and outputs.get(rid, 0) < reqs[rid]["max_new"]:
                outputs[rid] = outputs.get(rid, 0) + 1
                token = 10_000 + step  # the sampled token: any value both sides agree on
            side.computed(rid, n, token)
            if done and outputs.get(rid, 0) >= reqs[rid]["max_new"]:
                finished.append(rid)
        for rid in finished:
            running.remove(rid)
            side.finish(rid)
        side.end_step()
        record(step, *side.take_keys())
        if case.get("kv_events"):
            drained = side.take_events()
            if drained:
                events.append([step, drained])
        if waiting or running or step < last_event:
            idle = 0
        else:
            idle += 1
            if idle > 3:  # in-flight stores acknowledged too
                break
    out = {"admissions": admissions, "steps": steps, "metrics": side.metrics()}
    if case.get("kv_events"):
        out["events"] = events
    if error is not None:  # the records up to it are compared too
        out["error"] = error
    return out


# ------------------------------------------------------------------------ our side
class OursOffload:
    """Our hashchain backend with a host tier, as the loop drives it."""

    def __init__(self, case: dict[str, Any]) -> None:
        cfg = CacheConfig(capacity_tokens=case["gpu_blocks"] * GPU_BLOCK, page_size=GPU_BLOCK)
        tier = HostTierConfig(
            capacity_tokens=case["host_chunks"] * case["chunk"],
            block_size=case["chunk"],
            eviction_policy=case.get("policy", "lru"),
            store_threshold=case.get("store_threshold", 0),
            offload_prompt_only=case.get("prompt_only", True),
        )
        self.cache = make_cache(
            "hashchain", cfg, host_tier=tier, host_ack_delay=case.get("ack_delay", 0),
            kv_events=bool(case.get("kv_events")),
        )  # fmt: skip
        self.reqs = {r["rid"]: Request(r["rid"], r["prompt"]) for r in case["requests"]}
        self._matches: dict[str, Any] = {}
        self.stored: list[tuple[str, int, bytes]] = []  # (rid, chunk index, key)
        self.evicted: list[bytes] = []
        connector = self.cache.offload.connector
        manager = connector.manager
        prepare_store = manager.prepare_store

        def spy(keys: list[bytes], ctx: Any) -> Any:
            out = prepare_store(keys, ctx)
            if out is not None:
                self.evicted += out.evicted_keys
                tpc = case["chunk"]
                self.stored += [(ctx.req_id, ctx.key_positions[k] // tpc - 1, k) for k in out.keys_to_store]
            return out

        manager.prepare_store = spy  # type: ignore[method-assign]

    def begin_step(self) -> None:
        self.cache.host_tier.advance_transfers()

    def lookup(self, rid: str) -> tuple[int, int | None]:
        m = self.cache.lookup(self.reqs[rid])
        self._matches[rid] = m
        return m.tokens, (None if m.pending else m.external_tokens)

    def admit(self, rid: str, local: int, external: int, n: int) -> bool:
        m = self._matches.pop(rid)
        req = self.reqs[rid]
        if external and m.host_tokens:
            # vLLM's async load: the admission reserves only the hit (allocate_slots with
            # num_new_tokens=0); the rest comes at its first schedule after the load.
            return self.cache.allocate(req, 0, m)
        # The loop counts a full-prompt external hit as vLLM does; we load one token less.
        return self.cache.allocate(req, n + external - m.host_tokens, m)

    def extend(self, rid: str, n: int) -> bool:
        return self.cache.allocate(self.reqs[rid], n)

    def computed(self, rid: str, n: int, token: int | None) -> None:
        req = self.reqs[rid]
        req.num_computed_tokens += n
        self.cache.commit(req)
        if token is not None:
            req.append_output_token_ids([token])

    def finish(self, rid: str) -> None:
        self.cache.release(self.reqs[rid])

    def schedule_end(self, scheduled: dict[str, int], new: list[str]) -> None:
        return  # our store jobs are built at the next advance_transfers

    def end_step(self) -> None:
        self.cache.check_invariants()

    def clear_gpu(self) -> None:
        # As the recorder: vLLM's evict_blocks on every free block with a hash (the same ids, in
        # the same order: ascending, so the BlockRemoved order is the harness's on both sides).
        pool = self.cache.block_pool
        free_cached = [b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0 and b.block_hash is not None]
        self.cache.evict_blocks(sorted(free_cached))

    def take_keys(self) -> tuple[list[tuple[str, int, bytes]], list[bytes]]:
        out = (self.stored, self.evicted)
        self.stored, self.evicted = [], []
        return out

    def loaded(self, rid: str) -> bool:
        status = self.cache.offload.connector._req_status[rid]
        return not any(not self.cache.offload.connector._jobs[j].is_store for j in status.transfer_jobs)

    def num_computed(self, rid: str) -> int:
        return self.reqs[rid].num_computed_tokens

    def num_tokens(self, rid: str) -> int:
        return self.reqs[rid].num_tokens

    def metrics(self) -> dict[str, int]:
        return self.cache.host_tier.metrics()

    def take_events(self) -> list[dict[str, Any]]:
        from prefixcache.experiments.upstream.kv_event_cases import event_json

        return [event_json(e) for e in self.cache.kv_events.take_events()]


# ------------------------------------------------------------------------ the cases
def _case(name: str, requests: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    base = {"name": name, "gpu_blocks": 400, "chunk": 64, "host_chunks": 100, "requests": requests}
    base.update(kw)
    return base


def _req(rid: str, prompt: list[int], max_new: int = 1, arrival: int = 0) -> dict[str, Any]:
    return {"rid": rid, "prompt": prompt, "max_new": max_new, "arrival": arrival}


def _random_case(seed: int, policy: str, **kw: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    bases = [[rng.randrange(1, 50_000) for _ in range(rng.randrange(64, 260))] for _ in range(4)]
    requests = []
    arrival = 0
    for i in range(24):
        base = rng.choice(bases)
        share = rng.randrange(0, len(base) + 1)
        prompt = base[:share] + [rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 60))]
        arrival += rng.choice((1, 2, 3, 4))
        requests.append(_req(f"q{i}", prompt, rng.randrange(0, 4), arrival))
    clear = tuple(range(5, arrival, 5))
    options = {"gpu_blocks": 48, "host_chunks": 16, "policy": policy, "clear_gpu_at": clear, **kw}
    return _case(f"random{seed}_{policy}", requests, **options)


def cases() -> list[dict[str, Any]]:
    a1000 = list(range(1, 1001))
    a256 = list(range(5001, 5257))
    b128 = list(range(7001, 7129))
    p1024 = list(range(9001, 10025))
    return [
        # 6: 1000-token prompt -> 15 chunks of 64 stored, 40 tokens never; a later request
        # sharing 336 tokens on the GPU loads chunks 5..14 (624 tokens).
        _case(
            "scenario_6",
            [
                _req("A", a1000, 1, 0),
                _req("P", a1000[:336] + [1], 0, 8),
                _req("B", a1000 + [2, 3], 1, 14),
            ],
            clear_gpu_at=(6,),
        ),  # fmt: skip
        # 7: A's prompt is looked up while A's store is in flight: HIT_PENDING defers B (not a
        # miss) until the store is acknowledged, then B loads it (the GPU copy was cleared).
        _case("scenario_7", [_req("A", a256 + [11], 0, 0), _req("B", a256 + [12], 1, 1)], clear_gpu_at=(1,)),
        # 8: host of 4 chunks; A stores a1-a4, B stores b1, b2 evicting a4, a3; A's prefix
        # then hits 2 chunks.
        _case(
            "scenario_8",
            [
                _req("A", a256 + [1], 1, 0),
                _req("B", b128 + [2], 1, 4),
                _req("C", a256 + [3], 1, 10),
            ],
            host_chunks=4,
            clear_gpu_at=(9,),
        ),  # fmt: skip
        _case(
            "scenario_8_arc",
            [
                _req("A", a256 + [1], 1, 0),
                _req("B", b128 + [2], 1, 4),
                _req("C", a256 + [3], 1, 10),
            ],
            host_chunks=4,
            clear_gpu_at=(9,),
            policy="arc",
        ),  # fmt: skip
        # 9: a 1024-token prompt fully on the host, GPU 0: external 1024, 1023 loaded.
        _case("scenario_9", [_req("A", p1024, 1, 0), _req("B", p1024, 1, 8)], clear_gpu_at=(6,)),
        _case(
            "ack_delay_2",
            [_req("A", a256 + [11], 0, 0), _req("B", a256 + [12], 1, 1)],
            clear_gpu_at=(1,),
            ack_delay=2,
        ),  # fmt: skip
        _case(
            "store_threshold_2",
            [
                _req("A", a256 + [1], 0, 0),
                _req("B", a256 + [2], 0, 3),
                _req("C", a256 + [3], 0, 8),
            ],
            store_threshold=2,
            clear_gpu_at=(2, 7),
        ),  # fmt: skip
        _random_case(1, "lru"),
        _random_case(2, "lru"),
        _random_case(3, "arc"),
        _random_case(4, "lru", chunk=32, host_chunks=20),
        _random_case(5, "lru", host_chunks=6),
        _random_case(6, "arc", host_chunks=6),
        _random_case(7, "lru", host_chunks=8, prompt_only=False),
        _random_case(8, "arc", host_chunks=8, ack_delay=1),
        _random_case(9, "lru", chunk=16, host_chunks=24, store_threshold=2),
        _random_case(10, "arc", chunk=48, host_chunks=7, store_threshold=2),
        _random_case(11, "lru", chunk=48, host_chunks=5, ack_delay=1, prompt_only=False),
    ]


def fidelity_cases() -> list[dict[str, Any]]:
    """Issue 33's host-tier cases, where random streams found us apart from vLLM 0.33 (recorded
    into tests/fixtures/upstream/fidelity/, tests/test_hashchain_fidelity_cases.py)."""
    y, x, tail = list(range(100, 164)), list(range(300, 364)), list(range(500, 564))
    a = list(range(1000, 1127))
    b = list(range(2000, 2073))
    c = a[:111] + list(range(3000, 3033))
    d = list(range(4000, 4166))
    e = a[:111] + list(range(5000, 5017))
    finish_order = [
        _req("A", a, 1, 0),
        _req("B", b, 1, 3),
        _req("C", c, 1, 5),
        _req("D", d, 1, 5),
        _req("E", e, 1, 10),
    ]
    return [
        # 1: L loads Y's chunk asynchronously; vLLM allocates only the 4 blocks being loaded
        # (and the rest once the load is done), so X's blocks survive for M.
        _case(
            "async_load_allocates_loaded_blocks",
            [
                _req("Y", y, 1, 0),
                _req("X", x, 1, 4),
                _req("L", y + tail, 1, 6),
                _req("M", x + [7, 8, 9], 1, 7),
            ],
            gpu_blocks=10, chunk=16, ack_delay=2, clear_gpu_at=(3,),
        ),  # fmt: skip
        # 2: C and D finish in one step; D's store found no room while B's was in flight (ack
        # delay 1), so it is made at D's finish. Every final store of a step comes before any
        # on_request_finished: D's evicts by the ranks before C's recency is committed.
        _case(
            "final_stores_before_finish_lru", finish_order,
            chunk=16, host_chunks=14, prompt_only=False, ack_delay=1, clear_gpu_at=(9,),
        ),  # fmt: skip
        _case(
            "final_stores_before_finish_arc", finish_order,
            chunk=16, host_chunks=14, prompt_only=False, ack_delay=1, clear_gpu_at=(9,), policy="arc",
        ),  # fmt: skip
        # 3: the blocks a load filled are cached (one BlockStored) when the load is reported,
        # the computed block at the next allocation (a second, parent the third block's hash).
        _case(
            "loaded_blocks_event_batch",
            [_req("A", list(range(700, 748)), 1, 0),
             _req("B", list(range(700, 748)) + list(range(800, 816)), 1, 5)],
            chunk=16, clear_gpu_at=(4,), kv_events=True,
        ),  # fmt: skip
    ]
