"""The replay benchmark's phases (``make bench``): block hashing is timed wherever the hasher
hashes, so a hashing variant reports a share of it and a variant that hashes nothing none."""

from __future__ import annotations

import pandas as pd
from prefixcache.experiments.bench import replay


def test_the_replay_bench_times_block_hashing_where_blocks_are_hashed(tmp_path, trace_data) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "replay.csv"
    replay.main(["--limit", "20", "--repeat", "1", "--only", "hashchain-p16-sha256", "radix-p16",
                 "--out", str(out)])
    share = pd.read_csv(out).set_index("variant")["hash_frac"]
    assert share["hashchain-p16-sha256"] > 0.01, "sha256 block hashing went untimed"
    assert share["radix-p16"] == 0
