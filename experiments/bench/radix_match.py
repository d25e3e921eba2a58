"""Galloping RadixKey.match vs SGLang's per-token Python loop, one line per prefix length.

    python -m prefixcache.experiments.bench.radix_match
"""

from __future__ import annotations

import timeit

from prefixcache.backends.radix import RadixKey

SIZES = {"1k": 1 << 10, "32k": 1 << 15, "256k": 1 << 18}


def loop_match(a: list[int], b: list[int]) -> int:
    """SGLang's ``_key_match_page_size1``: one Python step per token."""
    i = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        i += 1
    return i


def best_seconds(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    number = max(1, int(0.05 / max(timeit.timeit(fn, number=1), 1e-7)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main() -> None:
    for name, n in SIZES.items():
        a = [(7 * i + 3) % 50_000 for i in range(n)]
        la, lb = a + [1], a + [2]
        ka, kb = RadixKey(la), RadixKey(lb)
        assert ka.match(kb) == loop_match(la, lb) == n
        gallop = best_seconds(lambda ka=ka, kb=kb: ka.match(kb))
        loop = best_seconds(lambda la=la, lb=lb: loop_match(la, lb))
        print(
            f"prefix {name:>4} ({n:>6} tokens): loop {loop * 1e6:10.1f} us  "
            f"galloping {gallop * 1e6:8.1f} us  speedup x{loop / gallop:7.1f}"
        )


if __name__ == "__main__":
    main()
