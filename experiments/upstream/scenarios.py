"""Deterministic request sequences, written as operations on the PrefixCache contract.

A scenario is a pool (capacity_tokens, page_size) and a list of operations, each a dict:

  {"op": "new", "rid", "prompt": [...], "salt": str | None}   create a request
  {"op": "alloc", "rid", "n": int | None}   allocate; the first call admits (n=None: the whole
                                            remaining prompt after the hit)
  {"op": "run", "rid"}        the model wrote the KV of everything allocated: computed = allocated,
                              then commit (vLLM: nothing to do; SGLang: checkpoint after an extend)
  {"op": "append", "rid", "tokens": [...]}   output tokens appended
  {"op": "release", "rid"}    finished: unpin, KV stays as cache
  {"op": "evict", "n"}        explicit eviction (SGLang only)

Each replayer returns one record per operation: {"ok", "hit", "pages", "usage"} where they apply.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Op = dict[str, Any]


@dataclass
class Scenario:
    name: str
    capacity_tokens: int
    page_size: int
    ops: list[Op] = field(default_factory=list)
    systems: tuple[str, ...] = ("vllm", "sglang")  # which upstream systems it is replayed on
    # Large: for timing and agreement only; never written as a fixture, and the replayers
    # skip their per-op whole-pool records (usage, free queue).
    large: bool = False

    # ------------------------------------------------------------ builders
    def new(self, rid: str, prompt: list[int], salt: str | None = None) -> Scenario:
        self.ops.append({"op": "new", "rid": rid, "prompt": list(prompt), "salt": salt})
        return self

    def alloc(self, rid: str, n: int | None = None) -> Scenario:
        self.ops.append({"op": "alloc", "rid": rid, "n": n})
        return self

    def run(self, rid: str) -> Scenario:
        self.ops.append({"op": "run", "rid": rid})
        return self

    def append(self, rid: str, tokens: list[int]) -> Scenario:
        self.ops.append({"op": "append", "rid": rid, "tokens": list(tokens)})
        return self

    def release(self, rid: str) -> Scenario:
        self.ops.append({"op": "release", "rid": rid})
        return self

    def evict(self, n: int) -> Scenario:
        self.ops.append({"op": "evict", "n": n})
        return self

    def prefill(self, rid: str, prompt: list[int], salt: str | None = None) -> Scenario:
        return self.new(rid, prompt, salt).alloc(rid).run(rid)

    def decode(self, rid: str, tokens: list[int]) -> Scenario:
        for t in tokens:
            self.append(rid, [t]).alloc(rid, 1).run(rid)
        return self

    def whole(self, rid: str, prompt: list[int], salt: str | None = None, out: list[int] = ()) -> Scenario:
        self.prefill(rid, prompt, salt)
        if out:
            self.decode(rid, list(out))
        return self.release(rid)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "capacity_tokens": self.capacity_tokens,
                "page_size": self.page_size, "large": self.large,
                "ops": [{k: v for k, v in op.items() if v is not None} for op in self.ops]}


def eviction_policy_of(scenario: dict[str, Any]) -> str:
    """A stream's ``options.eviction_policy`` (random_streams_sglang's policy families), else lru,
    SGLang's default: what both the upstream drivers and ours replay it under."""
    return str(scenario.get("options", {}).get("eviction_policy", "lru"))


def _toks(n: int, seed: int, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def scripted(page_size: int) -> list[Scenario]:
    """The scripted scenarios at one page size (4 for vLLM's block walkthrough, 1 or 4 SGLang)."""
    B = page_size
    S = lambda name, cap: Scenario(f"{name}_p{B}", cap, B)  # noqa: E731
    out: list[Scenario] = []

    # The article's walkthrough: A of 16 tokens, then B sharing A's first 3 blocks.
    a = list(range(1, 17))
    b = a[:12] + [901, 902, 903, 904, 905]
    s = S("walkthrough", 64)
    s.prefill("A", a).prefill("B", b).release("A").release("B")
    s.whole("C", a).whole("D", b)
    out.append(s)

    # Exact repeats of the same prompt, sequential and concurrent.
    p = _toks(22, 1)
    s = S("exact_repeat", 96)
    s.whole("r1", p).whole("r2", p).prefill("r3", p).prefill("r4", p).release("r4").release("r3")
    s.whole("r5", p)
    out.append(s)

    # Prompts of exactly k blocks: the n-1 cap recomputes the last block into a new block.
    s = S("exact_blocks", 96)
    for k in (1, 2, 3):
        q = _toks(k * max(B, 4), 10 + k)
        s.whole(f"k{k}a", q).whole(f"k{k}b", q).whole(f"k{k}c", q)
    out.append(s)

    # Divergence inside a block.
    base = _toks(13, 3)
    s = S("diverge_in_block", 96)
    s.whole("d0", base + [7, 7, 7])
    for i, cut in enumerate((5, 6, 9, 10, 14)):
        s.whole(f"d{i + 1}", base[:cut] + [800 + i] * 6)
    out.append(s)

    # Multi-turn growth: each turn's prompt = previous prompt + output + new user tokens.
    s = S("multi_turn", 160)
    conv = _toks(9, 4)
    for turn in range(4):
        outp = _toks(5, 40 + turn)
        s.whole(f"t{turn}", conv, out=outp)
        conv = conv + outp + _toks(3 + turn, 50 + turn)
    out.append(s)

    # Several requests live at once, interleaved decode, out-of-order release.
    sys_p = _toks(10, 5)
    s = S("concurrent", 160)
    for i in range(3):
        s.prefill(f"c{i}", sys_p + _toks(3 + i, 60 + i))
    for step in range(3):
        for i in range(3):
            s.decode(f"c{i}", [500 + 10 * i + step])
    s.release("c1").release("c0")
    s.whole("c3", sys_p + _toks(3, 60))
    s.release("c2")
    s.whole("c4", sys_p + _toks(4, 61))
    out.append(s)

    # Chunked prefill: the second request arrives while the first is mid-prompt.
    long = _toks(27, 6)
    s = S("chunked", 128)
    s.new("L", long).alloc("L", 8).run("L").new("M", long[:20] + [1, 2, 3])
    s.alloc("M").run("M").alloc("L", 8).run("L").alloc("L").run("L")
    s.release("M").release("L").whole("N", long)
    out.append(s)

    # Eviction under a small pool: LRU order and reverse-order free matter.
    s = S("eviction_lru", 10 * B + B if B > 1 else 40)
    n = 2 * B + 1 if B > 1 else 9
    for i in range(6):
        s.whole(f"e{i}", _toks(n, 70 + i))
    s.whole("e6", _toks(n, 70))  # the first prompt again: evicted or not?
    s.whole("e7", _toks(n, 75))  # the most recent one
    s.whole("e8", _toks(3 * n, 80))
    s.whole("e9", _toks(n, 74))
    out.append(s)

    # Eviction of a shared prefix: children go first, then the shared parent.
    s = S("eviction_tree", 12 * B + B if B > 1 else 52)
    root = _toks(2 * B + 2 if B > 1 else 10, 90)
    for i in range(4):
        s.whole(f"f{i}", root + _toks(B + 2 if B > 1 else 6, 91 + i))
    s.whole("g", _toks(6 * B + 1 if B > 1 else 30, 99))
    s.whole("h", root + _toks(B + 2 if B > 1 else 6, 91))
    out.append(s)

    # Salts: the same tokens under different salts never share.
    p = _toks(14, 7)
    s = S("salts", 128)
    s.whole("s0", p).whole("s1", p, salt="alice").whole("s2", p, salt="bob")
    s.whole("s3", p, salt="alice").whole("s4", p)
    out.append(s)
    return out


def seeded(page_size: int, seed: int, num_requests: int = 16) -> Scenario:
    """Random prompts drawn from a few shared prefixes, some live at once, a tight pool."""
    rng = random.Random(seed)
    B = page_size
    cap = 48 * max(B, 1) if B > 1 else 160
    s = Scenario(f"seeded{seed}{'' if num_requests == 16 else f'x{num_requests}'}_p{B}", cap, B)
    prefixes = [_toks(rng.randrange(4, 20), 1000 * seed + i) for i in range(4)]
    live: list[str] = []
    for i in range(num_requests):
        rid = f"q{i}"
        prompt = rng.choice(prefixes)[: rng.randrange(2, 21)] + _toks(rng.randrange(1, 9), 7000 * seed + i)
        s.prefill(rid, prompt)
        if rng.random() < 0.5:
            s.decode(rid, [rng.randrange(1000) for _ in range(rng.randrange(1, 4))])
        live.append(rid)
        while len(live) > 2 or (live and rng.random() < 0.4):
            s.release(live.pop(rng.randrange(len(live))))
    for rid in live:
        s.release(rid)
    return s


def mooncake(page_size: int, num_requests: int = 200, max_output: int = 16,
             capacity_tokens: int = 1 << 19) -> Scenario | None:
    """The first ``num_requests`` requests of the Mooncake conversation trace, one after
    another, each decoding up to ``max_output`` tokens, in a pool that must evict: real
    prompts (about 13k tokens each) for timing the upstream code. None without the trace."""
    from prefixcache.experiments.inputs.traces import iter_requests, read_mooncake

    try:
        records = read_mooncake("mooncake_conversation_trace.jsonl")
    except FileNotFoundError:
        return None
    s = Scenario(f"mooncake_conversation{num_requests}_p{page_size}", capacity_tokens, page_size, large=True)
    for i, req in enumerate(iter_requests(records, limit=num_requests)):
        out = _toks(min(req.max_new_tokens, max_output), 90_000 + i, vocab=32_000)
        s.whole(req.request_id, [int(t) for t in req.prompt_token_ids], out=out)
    return s


def all_scenarios(large: bool = True) -> Iterator[Scenario]:
    """The scripted and seeded scenarios, then (``large``, trace present) the trace ones, each
    built when the caller's loop reaches it, so that a later trace scenario's prompts (millions
    of Python ints) are not on the heap while an earlier scenario is replayed."""
    out: list[Scenario] = []
    for sc in scripted(4):
        out.append(sc)
    for sc in scripted(1):
        sc.systems = ("sglang",)  # vLLM block_size 1 is legal but not interesting
        out.append(sc)
    for seed in (1, 2, 3):
        out.append(seeded(4, seed))
        sc = seeded(1, seed)
        sc.systems = ("sglang",)
        out.append(sc)
    sc = seeded(1, 3, num_requests=24)  # its last requests evict leaves whose LRU stamps differ
    sc.systems = ("sglang",)
    out.append(sc)
    ev = Scenario("explicit_evict_p1", 64, 1, systems=("sglang",))
    ev.whole("x0", _toks(12, 200)).whole("x1", _toks(12, 201)).whole("x2", _toks(12, 200)[:6] + [1, 2, 3])
    ev.evict(5).whole("x3", _toks(12, 201)).evict(100).whole("x4", _toks(12, 200))
    out.append(ev)
    yield from out
    if not large:
        return
    for page_size in (16, 1):  # 1: SGLang's default page, one token
        trace = mooncake(page_size)
        if trace is None:
            return
        if page_size == 1:
            trace.systems = ("sglang",)
        yield trace
