"""Both index structures drawn from the real backends' state after a small request list: the
hashchain's cached blocks (chained hashes, physical block ids) with its free queue, and the
radix tree's nodes (token runs, KV slots). ``prefixcache show`` draws any list; the paper's
first figure draws the seed article's block_size = 4 walkthrough (``WALKTHROUGH``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch
from prefixcache.backends.radix.tree import TreeNode

from prefixcache import CacheConfig, Request, make_cache

# The seed article's section 6: A has 16 tokens (4 blocks); B shares A's first 3 blocks and
# diverges in block 3. C shares A's first 10 tokens: a block cache keeps 8 of them, the tree 10.
WALKTHROUGH: list[list[int]] = [
    list(range(16)),
    list(range(12)) + [20, 21, 22, 23],
    list(range(10)) + [30, 31, 32, 33, 34, 35],
]
CAPACITY_PAGES = 16


@dataclass
class Block:
    block_id: int
    tokens: tuple[int, ...]
    key: str  # the chained hash, shortened
    parent: int | None  # the block id of the previous block in the chain


@dataclass
class Node:
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    children: list[Node]


@dataclass
class Snapshot:
    hits: dict[str, list[int]]  # backend -> hit tokens per request
    blocks: list[Block]  # hashchain's cached blocks
    free_queue: list[int]  # hashchain's free block ids, eviction order (head first)
    tree: Node  # radix root


def run_requests(prompts: Sequence[Sequence[int]], page_size: int) -> Snapshot:
    """Each prompt in turn through a fresh hashchain (``page_size``) and radix (page 1) cache:
    lookup, allocate, commit, release (as a finished request leaves its KV cached)."""
    if not prompts or any(len(p) < 2 for p in prompts):
        raise ValueError("show needs requests of at least 2 tokens each")
    hashchain = make_cache("hashchain", CacheConfig(CAPACITY_PAGES * page_size, page_size))
    radix = make_cache("radix", CacheConfig(CAPACITY_PAGES * page_size, 1))
    hits: dict[str, list[int]] = {"hashchain": [], "radix": []}
    blocks: dict[int, Block] = {}
    for i, prompt in enumerate(prompts):
        for name, cache in (("hashchain", hashchain), ("radix", radix)):
            req = Request(f"r{i}", list(prompt))
            match = cache.lookup(req)
            if not cache.allocate(req, req.num_tokens - match.tokens, match):
                raise ValueError(f"request {i} does not fit in {CAPACITY_PAGES} pages (a small list only)")
            hits[name].append(match.tokens)
            req.num_computed_tokens = req.num_tokens
            cache.commit(req)
            if name == "hashchain":
                table = cache.page_table(req)
                for j, block_id in enumerate(table[: len(prompt) // page_size]):
                    tokens = tuple(prompt[j * page_size : (j + 1) * page_size])
                    blocks[block_id] = Block(block_id, tokens, "", table[j - 1] if j else None)
            cache.release(req)
    pool = hashchain.block_pool  # type: ignore[attr-defined]
    cached = []
    for block_id, b in blocks.items():
        key = pool.blocks[block_id].block_hash
        if key is not None:
            b.key = bytes(key)[:3].hex()
            cached.append(b)
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    return Snapshot(hits, cached, free, _tree(radix.tree.root_node))  # type: ignore[attr-defined]


def _tree(node: TreeNode) -> Node:
    tokens = tuple(int(t) for t in node.key.token_ids) if node.key is not None else ()
    slots = tuple(int(s) for s in node.value) if node.value is not None else ()
    children = [_tree(c) for c in node.children.values()]
    return Node(tokens, slots, sorted(children, key=lambda c: c.tokens))


def _run(tokens: Sequence[int]) -> str:
    """Token ids as the article writes them: t0..t3 for a consecutive run."""
    if not tokens:
        return "root"
    if list(tokens) == list(range(tokens[0], tokens[0] + len(tokens))) and len(tokens) > 2:
        return f"t{tokens[0]}..t{tokens[-1]}"
    return " ".join(f"t{t}" for t in tokens)


def draw(snap: Snapshot, page_size: int, path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.2, 3.0))
    box = dict(boxstyle="round,pad=0.3", fc="white", ec="0.3", lw=0.8)
    # hashchain: a block's depth is its chain position; siblings stack downward
    depth: dict[int, int] = {}
    for b in snap.blocks:
        depth[b.block_id] = 0 if b.parent is None else depth.get(b.parent, 0) + 1
    rows: dict[int, int] = {}
    placed: dict[int, tuple[float, float]] = {}
    for b in sorted(snap.blocks, key=lambda b: (depth[b.block_id], b.tokens)):
        d = depth[b.block_id]
        parent_row = placed[b.parent][1] if b.parent in placed else 0.0
        row = max(rows.get(d, -1) + 1, parent_row)
        rows[d] = row
        placed[b.block_id] = (d, row)
        left.text(d, -row, f"block {b.block_id}\n{_run(b.tokens)}\nh={b.key}", ha="center", va="center",
                  fontsize=6, bbox=box)
        if b.parent in placed:
            px, py = placed[b.parent]
            _arrow(left, (px + 0.38, -py), (d - 0.38, -row))
    n_rows = max(rows.values(), default=0) + 1
    queue = " ".join(str(i) for i in snap.free_queue[:12]) + (" ..." if len(snap.free_queue) > 12 else "")
    left.text(-0.4, -n_rows - 0.2, f"free queue, eviction first: {queue}", fontsize=6, ha="left")
    left.set_xlim(-0.6, max(depth.values(), default=0) + 0.6)
    left.set_ylim(-n_rows - 0.6, 0.6)
    left.set_title(f"hashchain (vLLM): chained hashes, B={page_size}", fontsize=8)
    left.axis("off")

    # radix: a node's depth is its distance from the root
    counter = [0]

    def place(node: Node, d: int) -> float:
        ys = [place(c, d + 1) for c in node.children]
        y = sum(ys) / len(ys) if ys else float(counter[0])
        if not ys:
            counter[0] += 1
        label = _run(node.tokens) if node.tokens else "root"
        if node.slots:
            label += f"\nslots {node.slots[0]}..{node.slots[-1]}"
        right.text(d, -y, label, ha="center", va="center", fontsize=6, bbox=box)
        for cy in ys:
            _arrow(right, (d + 0.35, -y), (d + 1 - 0.35, -cy))
        return y

    place(snap.tree, 0)
    right.set_xlim(-0.5, _height(snap.tree) + 0.5)
    right.set_ylim(-counter[0], 1)
    right.set_title("radix (SGLang): the tree, page 1", fontsize=8)
    right.axis("off")
    hits = "; ".join(f"r{i}: {h} / {r}" for i, (h, r) in enumerate(
        zip(snap.hits["hashchain"], snap.hits["radix"], strict=True)))
    fig.text(0.5, 0.01, f"hit tokens per request (hashchain / radix): {hits}", ha="center", fontsize=6)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(fig)
    return path


def _arrow(ax: plt.Axes, start: tuple[float, float], end: tuple[float, float]) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="->", mutation_scale=8, lw=0.7, color="0.3"))


def _height(node: Node) -> int:
    return 1 + max((_height(c) for c in node.children), default=0) if node.children else 0


def parse_requests(text: str) -> list[list[int]]:
    """``"0 1 2 3; 0 1 2 9"``: requests separated by ``;``, token ids by spaces or commas."""
    out = []
    for part in text.split(";"):
        ids = part.replace(",", " ").split()
        if ids:
            try:
                out.append([int(t) for t in ids])
            except ValueError:
                raise ValueError(f"token ids must be integers, got {part.strip()!r}") from None
    return out
