"""The lifecycle machine every design's stateful test builds on, with a shadow KV model.

Requests interleave lookup / allocate (fresh and stale matches, failures included) / prefill
chunks / decode / release / preemption / eviction / reset through the common interface. The
shadow model (``ShadowKV``, one per pool or KV group) records which token prefix's KV was last
written into every slot (KV at position p depends on the namespace and tokens 0..p). After
every rule:

* ``check_invariants()`` holds;
* every live request reads its own KV at every position its layers read (pinned pages are
  never evicted, reused or overwritten), also just before the model computes its next tokens;
* every hit hands back slots holding exactly the request's own prefix, also when the match was
  taken rules before the allocate that consumes it (the cache revalidates it, never trusts it);
* a failed allocate and a refused reset change nothing.

A design's machine is a small subclass: ``start`` builds its cache and shadows, ``tables``
names the page tables the shadows read, and the hooks below say what differs (what fits, how a
chunk ends, what more an admission or every rule checks). Where a design draws its requests,
chunks or evictions from other ranges, it takes the rule with its own ranges
(tests/stateful_rules.py); ``reset`` is a rule only where a machine declares it
(``reset = rule()(Lifecycle.reset)``).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from prefixcache import Match, Request
from tests.stateful_rules import MATCHED, VOCAB, WAITING, Namespace, evict_rule, new_request_rule, step_rule
from tests.strategies import NAMESPACES


class ShadowKV:
    """What each slot of one pool (one KV group) holds: (namespace, tokens up to the position)
    of the KV last written there. ``window``: the group's layers read only the last
    ``window - 1`` positions (an older page may be freed, even reused); ``state``: a recurrent
    state per block, the block of the last computed position holding the state after it."""

    def __init__(
        self, page_size: int, window: int | None = None, state: bool = False, name: str = ""
    ) -> None:
        self.page_size = page_size
        self.window = window
        self.state = state
        self.name = name
        self.slots: dict[int, tuple] = {}

    @staticmethod
    def prefix(req: Request, length: int) -> tuple:
        return (req.namespace, tuple(req.all_token_ids[:length]))

    @classmethod
    def content(cls, req: Request, pos: int) -> tuple:
        return cls.prefix(req, pos + 1)

    def slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.page_size] * self.page_size + pos % self.page_size

    def write(self, table: list[int], req: Request, start: int, stop: int) -> None:
        where = f"{req.request_id}{self.name}"
        if self.state:  # the state after token stop - 1, in its block
            block = table[-(-stop // self.page_size) - 1]
            assert block != 0, f"{where}: writes its state into page 0"
            self.slots[block] = self.content(req, stop - 1)
            return
        for pos in range(start, stop):
            assert table[pos // self.page_size] != 0, f"{where}: writes position {pos} into page 0"
            self.slots[self.slot(table, pos)] = self.content(req, pos)

    def reads(self, num_computed: int) -> range:
        """Positions a layer of this group reads for the next token."""
        if self.window is None:
            return range(num_computed)
        return range(max(0, num_computed - (self.window - 1)), num_computed)

    def check(self, table: list[int], req: Request, num_computed: int, what: str) -> None:
        where = f"{what}: {req.request_id}{self.name}"
        if self.state:
            if num_computed:
                block = table[-(-num_computed // self.page_size) - 1]
                assert block != 0, f"{where} reads its state from page 0"
                got = self.slots.get(block)
                assert got == self.content(req, num_computed - 1), f"{where} reads the state of {got}"
            return
        if self.window is None:
            assert 0 not in table, f"{where}: page 0 handed out"
        for pos in self.reads(num_computed):
            assert table[pos // self.page_size] != 0, f"{where} reads page 0 at {pos}"
            got = self.slots.get(self.slot(table, pos))
            assert got == self.content(req, pos), (
                f"{where} position {pos} reads KV of {got}, expected its own prefix"
            )


def group_shadows(groups: list[Any], page_size: int) -> list[ShadowKV]:
    """One shadow per KV group (``kv_groups()``): a group's layers keep their own KV."""
    return [
        ShadowKV(page_size, g.window, g.kind == "mamba", f" group {i} ({g.kind})")
        for i, g in enumerate(groups)
    ]


class Lifecycle(RuleBasedStateMachine):
    waiting = WAITING
    matched = MATCHED
    page_size = 4
    max_chunk = 32
    max_prompt: int | None = None  # prompts are cut to this many tokens
    max_length: int | None = None  # requests stop decoding at this many tokens
    SEEN: ClassVar[defaultdict[str, Counter[str]]] = defaultdict(Counter)  # a design's own, per machine
    cache: Any
    shadows: list[ShadowKV]

    @property
    def name(self) -> str:  # a machine may name itself with a class attribute
        return type(self).__name__

    def count(self, what: str) -> None:
        self.SEEN[self.name][what] += 1

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.live_reqs: dict[str, Request] = {}
        self.corpus: list[tuple[tuple[int, ...], Namespace]] = []  # what requests asked and computed
        self.counter = 0
        self.start()

    # ------------------------------------------------------------ what a design says
    def start(self) -> None:
        """Build ``self.cache`` and ``self.shadows``."""
        raise NotImplementedError

    def tables(self, req: Request) -> list[list[int]]:
        """The page tables the shadows read, one per shadow."""
        return [self.cache.page_table(req)]

    def fits(self, tokens: int, req: Request | None = None) -> bool:
        """Whether ``tokens`` tokens of a request (``req``: one already live) can ever fit."""
        return -(-tokens // self.page_size) <= self.cache.num_usable_pages()

    def admissible(self, req: Request, tokens: int) -> bool:
        """Whether an admission with room for ``tokens`` tokens can ever fit."""
        return self.fits(tokens)

    def chunk(self, req: Request, start: int, want: int) -> int:
        """Tokens to compute from ``start``: ``want``, capped at the request's end."""
        return min(want, req.num_tokens - start)

    def hit_of(self, match: Match) -> int:
        return match.tokens

    def check_match(self, req: Request, match: Match) -> None:
        """What a revalidated match must be against a fresh lookup."""

    def check_hit(self, req: Request, match: Match, what: str) -> None:
        """Just after the admission with ``match``: the hit hands back the request's own KV."""
        self._check(req, req.num_computed_tokens, what)

    def tokens_to_reserve(self, match: Match, n: int) -> int:
        return n

    def begin(self, req: Request, match: Match, n: int) -> None:
        """What follows an admission: the first chunk is computed."""
        self._compute(req, n)

    def commit(self, req: Request) -> None:
        self.cache.commit(req)

    def more_state(self) -> tuple:
        """Cache state beyond usage and page tables that a failed call must leave as it was."""
        return ()

    def after_reset(self) -> None:
        pass

    def check_more(self) -> None:
        """Checked after every rule, after the live requests' KV."""

    # ------------------------------------------------------------ the shared bodies
    def snapshot(self) -> tuple:
        c = self.cache
        live = {
            r.request_id: (tuple(map(tuple, self.tables(r))), r.num_computed_tokens) for r in c.live_requests
        }
        return (c.usage(), live, self.more_state())

    def _write(self, req: Request, start: int, stop: int) -> None:
        for shadow, table in zip(self.shadows, self.tables(req), strict=True):
            shadow.write(table, req, start, stop)

    def _check(self, req: Request, num_computed: int, what: str) -> None:
        for shadow, table in zip(self.shadows, self.tables(req), strict=True):
            shadow.check(table, req, num_computed, what)

    def _compute(self, req: Request, n: int) -> None:
        """The model computes the next n tokens: the first reads the KV before it, which must
        be the request's own now (after the allocate); the engine advances and commits."""
        start = req.num_computed_tokens
        self._check(req, start, "about to compute")
        self._write(req, start, start + n)
        req.num_computed_tokens += n
        self.commit(req)

    def _allocate(self, req: Request, n: int, match: Match | None = None) -> bool:
        """``allocate``; False leaves the cache as it was (and an admission's request not live)."""
        before = self.snapshot()
        if self.cache.allocate(req, n, match):
            return True
        assert self.snapshot() == before, f"a failed {'allocate' if match else 'extend'} changed the cache"
        assert match is None or not self.cache.is_live(req)
        return False

    def _pick(self, data: st.DataObject, among: Any = None) -> Request:
        return self.live_reqs[data.draw(st.sampled_from(sorted(self.live_reqs if among is None else among)))]

    def _remember(self, req: Request) -> None:
        self.corpus.append((tuple(req.all_token_ids), (req.cache_salt, req.lora_name)))

    def _new_request(self, share: int, suffix: list[int], ns: Namespace = (None, None)) -> Request:
        """A prompt sharing up to ``share`` tokens with an earlier one (``ns``: (salt, LoRA))."""
        base = self.rng.choice(self.corpus)[0] if self.corpus else ()
        tokens = (base[:share] + tuple(suffix))[: self.max_prompt]
        self.counter += 1
        self.corpus.append((tokens, ns))
        return Request(f"r{self.counter}", tokens, cache_salt=ns[0], lora_name=ns[1])

    def _admit(self, req: Request, match: Match, chunk: int, what: str):  # type: ignore[no-untyped-def]
        """Admit ``req`` with ``match`` (whatever changed since it was taken) and begin it: back
        to waiting when there is no room now, dropped when it can never fit (the contract tests
        check that ValueError)."""
        current = self.cache.revalidate(match)
        self.check_match(req, current)
        hit = self.hit_of(current)
        assert 0 <= hit <= req.num_tokens - 1
        n = self.chunk(req, hit, chunk)
        if not self.admissible(req, hit + n):
            return multiple()
        if not self._allocate(req, self.tokens_to_reserve(current, n), current):
            return multiple(req)
        assert req.num_computed_tokens == hit
        self.check_hit(req, current, what)
        self.live_reqs[req.request_id] = req
        self.begin(req, current, n)
        return multiple()

    def _step(self, req: Request, chunk: int, decode: int = 1) -> None:
        """The next prefill chunk of ``req``, or ``decode`` decode steps once its prompt is
        done; a step with no room stops there."""
        for _ in range(1 if req.num_computed_tokens < req.num_tokens else decode):
            if req.num_computed_tokens == req.num_tokens:
                if self.max_length is not None and req.num_tokens >= self.max_length:
                    return
                req.append_output_token_ids(self.rng.randrange(VOCAB))
                chunk = 1
            n = self.chunk(req, req.num_computed_tokens, chunk)
            if not self.fits(req.num_computed_tokens + n, req) or not self._allocate(req, n):
                return
            self._compute(req, n)

    def release_request(self, req: Request, preempt: bool):  # type: ignore[no-untyped-def]
        del self.live_reqs[req.request_id]
        self._release(req)
        if not preempt:
            return multiple()
        # The engine's part of a preemption: recompute later (mostly hitting its own KV).
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        return multiple(req)

    def _release(self, req: Request) -> None:
        self.cache.release(req)
        assert not self.cache.is_live(req)
        self._remember(req)

    def _evict(self, num_tokens: int) -> int:
        in_use = self.cache.usage().in_use
        freed = self.cache.evict(num_tokens)
        assert freed >= 0
        assert self.cache.usage().in_use == in_use, "evict touched pinned pages"
        return freed

    def reset(self) -> None:
        """Everything cached goes, or, while requests are live, nothing changes."""
        before = self.snapshot()
        if self.cache.reset():
            assert not self.live_reqs and self.cache.usage().evictable == 0
            self.after_reset()
        else:
            assert self.live_reqs and self.snapshot() == before, "a refused reset changed the cache"

    # ------------------------------------------------------------ rules
    new_request = new_request_rule(share=24, suffix=12, namespaces=NAMESPACES)
    step = step_rule(chunk=16)
    evict = evict_rule(64)

    @rule(target=waiting, req=consumes(waiting), chunk=st.integers(1, 32))
    def admit(self, req: Request, chunk: int):  # type: ignore[no-untyped-def]
        return self._admit(req, self.cache.lookup(req), min(chunk, self.max_chunk), "hit")

    @rule(target=matched, req=consumes(waiting))
    def look_up(self, req: Request):  # type: ignore[no-untyped-def]
        return multiple((req, self.cache.lookup(req)))

    @rule(target=waiting, item=consumes(matched), chunk=st.integers(1, 32))
    def admit_with_match(self, item: tuple, chunk: int):  # type: ignore[no-untyped-def]
        req, match = item
        return self._admit(req, match, min(chunk, self.max_chunk), "hit of a stale match")

    @precondition(lambda self: self.live_reqs)
    @rule(target=waiting, data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool):  # type: ignore[no-untyped-def]
        return self.release_request(self._pick(data), preempt)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.count("steps")
        self.cache.check_invariants()
        for req in self.live_reqs.values():
            assert self.cache.is_live(req)
            self._check(req, req.num_computed_tokens, "live request")
        self.check_more()


class HostTierLifecycle(Lifecycle):
    """A cache given a host tier: a hit may be partly loaded from host (``host_tokens``), and a
    failed call leaves the host pages as they were too."""

    def more_state(self) -> tuple:
        return (self.cache.host_tier.usage(),)

    def hit_of(self, match: Match) -> int:
        return match.tokens + match.host_tokens

    def check_hit(self, req: Request, match: Match, what: str) -> None:
        """A hit from host hands back that prefix's KV too."""
        assert self.cache.host_tier.loaded_tokens(req) == match.host_tokens
        if match.host_tokens:
            self.count("host hits")
        super().check_hit(req, match, f"{what} (host part {match.host_tokens})")
