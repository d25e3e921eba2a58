"""The error every ``check_invariants`` raises, and the check that raises it."""

from __future__ import annotations


class InvariantError(AssertionError):
    """``check_invariants`` found the cache's bookkeeping inconsistent."""


def ensure(condition: bool, message: str) -> None:
    """Raise InvariantError(message) unless condition holds (never stripped by ``-O``)."""
    if not condition:
        raise InvariantError(message)


def check_usage(pool: str, usage: tuple[int, ...], total: int) -> None:
    """Raise InvariantError unless a pool's (free, evictable, in use) page counts are none
    negative and add up to ``total`` (every cache's pool, each pool of a hybrid, a host tier)."""
    ensure(min(usage) >= 0, f"{pool} pool: negative count in {usage}")
    ensure(sum(usage) == total, f"{pool} pool: free + evictable + in use = {sum(usage)} != {total}")
