"""Exploratory (issue 14, not in ``make reproduce``): how well can what a cache sees of a request
predict whether, and how soon, the blocks it leaves are looked up again?

Per request of a whole Mooncake trace (convention C2), label its last cached block: reused at
all, and reused within H requests (H about what a 1M / 3M / 10M-token LRU holds). Features are
all online: the request's hit fraction against everything seen before, its lookup and insert
lengths, prompt and output tokens, new blocks, the gap (requests, seconds) since the deepest
block it hit was last touched, and how much of that block's last request it covers. A gradient-
boosted classifier is trained on the first half of the trace and scored (ROC AUC) on the
second. Needs scikit-learn, which the project does not install:

    pip install scikit-learn && python -m prefixcache.experiments.analysis.reuse_predictability
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np
from prefixcache.experiments.analysis.metrics import block_id_trace
from prefixcache.experiments.figures.common import MOONCAKE_TRACES
from prefixcache.experiments.inputs.traces import read_mooncake

FEATURES = ["hit_fraction", "lookup_blocks", "insert_blocks", "prompt_tokens", "output_tokens",
            "new_blocks", "gap_requests", "gap_seconds", "parent_covered"]
HORIZONS = (85, 250, 850)  # requests a 1M / 3M / 10M-token LRU holds, roughly (conversation)
NEVER = 1 << 40


def features_and_gaps(source: str) -> tuple[np.ndarray, np.ndarray]:
    """One row per request with cached blocks; the gap to its last block's next lookup."""
    records = read_mooncake(MOONCAKE_TRACES[source])
    trace = block_id_trace(records, "C2")
    uses: dict[int, list[int]] = defaultdict(list)
    for r, look in enumerate(trace.lookups):
        for key in look:
            uses[key].append(r)
    owner: dict[int, int] = {}
    touched: dict[int, tuple[int, float]] = {}
    rows, gaps = [], []
    for r, (look, ins, rec) in enumerate(zip(trace.lookups, trace.inserts, records, strict=True)):
        hit = 0
        while hit < len(look) and look[hit] in owner:
            hit += 1
        if hit:
            t_req, t_s = touched[look[hit - 1]]
            prior = (r - t_req, rec.timestamp - t_s, hit / max(1, len(trace.inserts[owner[look[hit - 1]]])))
        else:
            prior = (-1, -1.0, 0.0)
        if ins:
            later = uses.get(ins[-1], [])
            i = bisect.bisect_right(later, r)
            gaps.append(later[i] - r if i < len(later) else NEVER)
            rows.append([hit / max(1, len(look)), len(look), len(ins), rec.input_length,
                         rec.output_length, len(ins) - hit, *prior])
        for key in ins:
            owner[key] = r
            touched[key] = (r, rec.timestamp)
    return np.asarray(rows, dtype=float), np.asarray(gaps)


def main() -> int:
    from sklearn.ensemble import HistGradientBoostingClassifier  # type: ignore[import-not-found]
    from sklearn.metrics import roc_auc_score  # type: ignore[import-not-found]

    for source in ("mooncake-conversation", "mooncake-synthetic"):
        x, gaps = features_and_gaps(source)
        half = len(gaps) // 2
        for label, y in [("reused", gaps < NEVER), *[(f"within {h}", gaps <= h) for h in HORIZONS]]:
            y = y.astype(int)
            model = HistGradientBoostingClassifier(max_iter=200, random_state=0).fit(x[:half], y[:half])
            auc = roc_auc_score(y[half:], model.predict_proba(x[half:])[:, 1])
            print(f"{source:22s} {label:11s} AUC {auc:.3f} (base rate {y[half:].mean():.3f})")
        print(f"{source:22s} tails reused by the very next request: {(gaps == 1).mean():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
