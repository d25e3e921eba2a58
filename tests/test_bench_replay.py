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


def test_the_block_floor_times_each_part_of_the_layout_for_the_run_s_blocks(trace_data, capsys) -> None:  # type: ignore[no-untyped-def]
    from prefixcache.experiments.bench import block_floor

    wall, prompt, hits, decoded = block_floor.engine_seconds(
        "hashchain", block_floor.read_mooncake(block_floor.TRACES["conversation"]), 4
    )
    assert wall > 0 and 0 < hits < prompt and decoded > 0
    parts = block_floor.floor_seconds(prompt - hits, hits, decoded)
    assert list(parts) == ["read stored hashes", "hash decoded blocks", "build keys",
                           "make block objects", "insert keys", "count references",
                           "link freed blocks", "probe hit keys"]
    assert all(seconds > 0 for seconds in parts.values())
    block_floor.main(["--limit", "4", "--rounds", "1"])
    out = capsys.readouterr().out
    assert f"{prompt:,} prompt tokens, {hits:,} hit" in out and "floor of the layout" in out
