"""Table: the two designs side by side, feature by feature (from the reference behaviours
each backend reproduces, vLLM v1 and SGLang 0.5). Writes ``generated/features.tex``."""

from __future__ import annotations

from pathlib import Path

from prefixcache.experiments.figures.plotting import figure_main, write_table_tex

# (feature, hashchain = vLLM v1 APC, radix = SGLang RadixCache)
FEATURES: list[tuple[str, str, str]] = [
    ("Index", "hash table of chained block hashes", "radix tree of token runs"),
    ("What a key names", "a whole prefix, through the chain", "a path from the root"),
    ("Match granularity", "whole blocks (default 16 tokens)", "tokens (page 1) or pages"),
    ("Lookup", "hash full blocks, probe until first miss", "walk, compare (galloping), split"),
    ("Published", "at allocation, before the KV is written", "after each prefill chunk and at finish"),
    ("Duplicates", "tolerated; block tables append-only", "freed at insert; page table re-pointed"),
    ("Sharing", "ref count per block", "lock count up the path to the root"),
    ("Eviction unit", "block, LRU free queue (lazy)", "leaf, heap by policy"),
    ("Eviction order", "reverse per request; unhashed first", "LRU, LFU, FIFO, MRU, FILO, priority, SLRU"),
    ("Namespaces", "extra keys in the hash (LoRA, mm, salt)", "extra key splits the root"),
    ("Reserved page 0", "null block", "padding slot"),
    ("Hybrid / sliding window", "coordinator fixed point (Sec.~\\ref{sec:hybrid})",
     "SWA and Mamba tree classes (Sec.~\\ref{sec:hybrid})"),
]


def make(results: Path, paper: Path) -> list[Path]:
    rows = [[f, h, r] for f, h, r in FEATURES]
    return [write_table_tex(paper, "features", ["", "hashchain (vLLM)", "radix (SGLang)"], rows,
                            "p{3.0cm}p{4.6cm}p{4.6cm}",
                            "The hash is the prefix vs the tree is the prefix: what each backend reproduces.",
                            "tab:features")]


def main(argv: list[str] | None = None) -> int:
    return figure_main(make, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
