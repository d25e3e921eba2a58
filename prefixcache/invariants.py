"""The error every ``check_invariants`` raises, and the check that raises it."""

from __future__ import annotations


class InvariantError(AssertionError):
    """``check_invariants`` found the cache's bookkeeping inconsistent."""


def ensure(condition: bool, message: str) -> None:
    """Raise InvariantError(message) unless condition holds (never stripped by ``-O``)."""
    if not condition:
        raise InvariantError(message)
