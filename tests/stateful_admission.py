"""The admission rules the hybrid lifecycle machines share: admit with a fresh match, or take
a match and admit with it rules later (by then stale: the cache must revalidate it, never
trust it). A machine defines ``_admit(req, match, chunk, what)``, ``cache`` and ``max_chunk``."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, multiple, rule

from prefixcache import Request


class AdmissionRules(RuleBasedStateMachine):
    waiting = Bundle("waiting")
    matched = Bundle("matched")  # (a waiting request, the match taken for it back then)
    max_chunk = 32
    cache: Any

    def _admit(self, req: Request, match: Any, chunk: int, what: str) -> Any:
        raise NotImplementedError

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
