"""Figure 1: the two index structures after the seed article's block_size = 4 walkthrough,
drawn from the real backends' state (``structures.py``; ``prefixcache show`` draws any list).
Writes ``figures/structures``."""

from __future__ import annotations

from pathlib import Path

from prefixcache.experiments.figures.plotting import figure_main
from prefixcache.experiments.figures.structures import WALKTHROUGH, draw, run_requests

PAGE = 4


def make(results: Path, paper: Path) -> list[Path]:
    snap = run_requests(WALKTHROUGH, PAGE)
    out = paper / "figures"
    draw(snap, PAGE, out / "structures.png")
    return [draw(snap, PAGE, out / "structures.pdf")]


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
