"""RadixKey.match (one vectorised compare, ``common_prefix_length``) against the galloping
search it replaced and SGLang's per-token Python loop, one line per prefix length, on edges
that match whole (a checkpoint's walk) and edges that differ inside (a lookup's last edge).

    python -m prefixcache.experiments.bench.radix_match
"""

from __future__ import annotations

import timeit

import numpy as np
from prefixcache.backends.radix import RadixKey

SIZES = {"16": 16, "1k": 1 << 10, "12k": 12_000, "256k": 1 << 18}


def loop_match(a: list[int], b: list[int]) -> int:
    """SGLang's ``_key_match_page_size1``: one Python step per token."""
    i = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        i += 1
    return i


def galloping_match(a: np.ndarray, b: np.ndarray) -> int:
    """The search RadixKey.match used before (c2d2b27): compare windows of 1, 2, 4 ... tokens
    as byte strings, then bisect the first window that differs (O(log n) numpy calls)."""
    n = min(len(a), len(b))
    lo, width = 0, 1
    while lo < n:
        hi = min(lo + width, n)
        if a[lo:hi].tobytes() != b[lo:hi].tobytes():
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a[lo:mid].tobytes() == b[lo:mid].tobytes():
                    lo = mid
                else:
                    hi = mid
            break
        lo, width = hi, width * 2
    return lo


def pair(n: int, differ: bool) -> tuple[list[int], list[int]]:
    """Two sequences sharing exactly n tokens, then (differ) one token apart, or both n long."""
    a = [(7 * i + 3) % 50_000 for i in range(n)]
    return (a + [1], a + [2]) if differ else (a, list(a))


def best_seconds(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    number = max(1, int(0.05 / max(timeit.timeit(fn, number=1), 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main() -> None:
    for differ in (False, True):
        for name, n in SIZES.items():
            la, lb = pair(n, differ)
            ka, kb = RadixKey(la), RadixKey(lb)
            a, b = ka.token_ids, kb.token_ids
            assert ka.match(kb) == loop_match(la, lb) == galloping_match(a, b) == n
            ours = best_seconds(lambda ka=ka, kb=kb: ka.match(kb))
            gallop = best_seconds(lambda a=a, b=b: galloping_match(a, b))
            loop = best_seconds(lambda la=la, lb=lb: loop_match(la, lb))
            edge = "differs after" if differ else "whole edge of"
            print(f"{edge} {name:>4} tokens: loop {loop * 1e6:10.1f} us  galloping "
                  f"{gallop * 1e6:7.1f} us  match {ours * 1e6:6.1f} us  (x{gallop / ours:4.1f} galloping)")


if __name__ == "__main__":
    main()
