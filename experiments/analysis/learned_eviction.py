"""Exploratory (issue 14, not in ``make reproduce``): learned eviction after LRB (Song et al.,
NSDI'20) in the block model of ``eviction_model.py``, as the strongest learned baseline.

At each eviction round, sample max(64, 2 x needed) evictable leaves, predict for each the log of
the requests until its next lookup (capped at ``--window``) with a gradient-boosted regressor, and evict
the ones predicted furthest. Features are online only: the block's age, lifetime, touches,
previous reuse gap, depth and blocks after it in its last request; that request's hit fraction
against all history and against the cache, prompt and output tokens, blocks, and the gap since
its deepest hit block was last touched. Training rows are the sampled candidates, labelled from
the trace; round 0 samples under age (sampled LRU), later rounds under the previous model.

- ``insample``: trained on rows from the whole trace it is scored on (it sees the labels of its
  own test: an optimistic ceiling for this feature set, not a policy);
- ``half``: trained only on rows before the middle minus ``--window`` (labels censored there), scored
  on the second half: the honest number.

Needs scikit-learn, which the project does not install:

    pip install scikit-learn
    python -m prefixcache.experiments.analysis.learned_eviction mooncake-conversation 3000000 half \
        --rounds 3 --window 2000
"""
from __future__ import annotations

import argparse
import bisect
import random
import time

import numpy as np
from prefixcache.experiments.analysis import bounds
from prefixcache.experiments.analysis.eviction_model import ReuseOracle
from prefixcache.experiments.analysis.metrics import block_id_hit_rates, block_id_trace
from prefixcache.experiments.figures.common import MOONCAKE_TRACES
from prefixcache.experiments.inputs.traces import MOONCAKE_BLOCK, read_mooncake

NEVER = 1 << 40


class B:  # an evictable-tree block
    __slots__ = ("key", "parent", "kids", "last", "prev", "born", "hits", "depth", "tail", "req", "pos")


def run(trace, records, cap, predictor, uses, rng, window, collect=None):
    """Hit tokens per request; ``predictor(features)`` -> predicted log remaining time (the
    largest go). ``collect``: (list, share of rounds) to append (request, features, labels) to."""
    cache: dict[int, B] = {}
    leaves: list[B] = []
    seen_touch: dict[int, int] = {}
    reqf: list[tuple] = []
    out = []

    def add_leaf(b):
        b.pos = len(leaves)
        leaves.append(b)

    def drop_leaf(b):
        last = leaves.pop()
        if last is not b:
            leaves[b.pos] = last
            last.pos = b.pos
        b.pos = -1

    def feats(bs, now):
        rows = []
        for b in bs:
            f = reqf[b.req]
            rows.append((now - b.last, now - b.born, b.hits, (b.last - b.prev) if b.prev >= 0 else -1,
                         b.depth, b.tail, *f))
        return np.asarray(rows, dtype=float)

    for r, (look, ins) in enumerate(zip(trace.lookups, trace.inserts, strict=True)):
        hit = bounds.cached_prefix(look, cache)
        out.append(hit)
        inf = bounds.cached_prefix(look, seen_touch)
        sess = r - seen_touch[look[inf - 1]] if inf else -1
        rec = records[r]
        reqf.append((inf / max(1, len(look)), hit / max(1, len(look)), rec.input_length,
                     rec.output_length, len(ins), sess))
        parent = None
        for depth, key in enumerate(ins):
            b = cache.get(key)
            if b is None:
                b = B()
                b.key, b.parent, b.kids, b.prev, b.born, b.hits, b.depth = key, parent, 0, -1, r, 0, depth
                b.last = r
                b.pos = -1
                cache[key] = b
                if parent is not None:
                    parent.kids += 1
                    if parent.pos >= 0:
                        drop_leaf(parent)
                add_leaf(b)  # leaf until a child arrives
            else:
                b.prev, b.last = b.last, r
            b.hits += 1
            b.tail = len(ins) - 1 - depth
            b.req = r
            seen_touch[key] = r
            parent = b
        while len(cache) > cap:
            need = len(cache) - cap
            k = min(len(leaves), max(64, 2 * need))
            cands = rng.sample(leaves, k)
            x = feats(cands, r)
            pred = predictor(x)
            if collect is not None and rng.random() < collect[1]:
                ys = []
                for b in cands:
                    lst = uses.get(b.key, ())
                    i = bisect.bisect_right(lst, r)
                    nxt = lst[i] if i < len(lst) else NEVER
                    ys.append(np.log1p(min(nxt - r, window)))
                collect[0].append((r, x, np.asarray(ys)))
            order = np.argsort(-pred)[:need]
            for j in order:
                b = cands[j]
                if b.pos < 0:
                    continue
                drop_leaf(b)
                del cache[b.key]
                up = b.parent
                if up is not None and cache.get(up.key) is up:
                    up.kids -= 1
                    if up.kids == 0:
                        add_leaf(up)
    return [h * trace.page_size for h in out]


def main() -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", choices=sorted(MOONCAKE_TRACES))
    parser.add_argument("capacities", help="tokens, comma-separated")
    parser.add_argument("mode", choices=["insample", "half"])
    parser.add_argument("--rounds", type=int, default=2, help="training rounds after sampled LRU")
    parser.add_argument("--window", type=int, default=2000, help="label cap, in requests")
    args = parser.parse_args()
    source, mode, window = args.source, args.mode, args.window
    records = read_mooncake(MOONCAKE_TRACES[source])
    trace = block_id_trace(records, "C2")
    mid = len(records) // 2
    uses = ReuseOracle(trace).uses  # key -> requests that look it up, ascending
    for cap_t in (int(c) for c in args.capacities.split(",")):
        cap = cap_t // MOONCAKE_BLOCK
        lru = bounds.lru_hits(trace, cap)
        bel = bounds.belady_hits(trace, cap)
        part = slice(mid, None) if mode == "half" else slice(None)
        def rate(h, part=part):
            return block_id_hit_rates(records[part], h[part])[0]
        rl, rb = rate(lru), rate(bel)
        rng = random.Random(0)
        t0 = time.time()
        def age(x):
            return x[:, 0]
        data = []
        h0 = run(trace, records, cap, age, uses, rng, window, (data, 0.3))
        r0 = rate(h0)
        for it in range(args.rounds):
            use = [d for d in data if mode != "half" or d[0] < mid - window]
            if not use:
                parser.error(f"no training rows before request {mid - window}: lower --window")
            xs = np.concatenate([d[1] for d in use])
            ys = np.concatenate([d[2] for d in use])
            model = HistGradientBoostingRegressor(max_iter=150, random_state=0).fit(xs, ys)
            new = []
            h = run(trace, records, cap, model.predict, uses, random.Random(it + 1), window, (new, 0.3))
            data.extend(new)
            ri = rate(h)
            print(f"{source} {cap_t/1e6:.0f}M {mode} it{it}: lru {rl:.4f} bel {rb:.4f} sampled-lru {r0:.4f} "
                  f"({(r0-rl)/(rb-rl):+.0%}) learned {ri:.4f} ({(ri-rl)/(rb-rl):+.0%}) "
                  f"rows {len(ys)} {time.time()-t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
