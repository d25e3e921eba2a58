"""CLI smoke tests at tiny scale."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from prefixcache.experiments.cli import main
from prefixcache.experiments.inputs.traces import TraceRecord, write_mooncake

TINY = ["--param", "conversations=2", "--param", "turns=2", "--capacity-tokens", "4096"]


def test_run_writes_config_records_summary_and_never_overwrites(tmp_path, capsys) -> None:
    args = ["run", "--workload", "multi-turn-chat", "--backend", "none", *TINY, "--out", str(tmp_path)]
    assert main(args) == 0
    (folder,) = tmp_path.iterdir()
    assert {p.name for p in folder.iterdir()} >= {"config.json", "summary.json"}
    assert any(p.name.startswith("requests.") for p in folder.iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["requests"] == 4 and summary["token_hit_rate"] == 0.0
    assert summary["cache_op_us_per_request"] is None  # cache calls are not timed: no number, not 0
    assert main(args) == 0 and "skipped" in capsys.readouterr().out
    assert main([*args, "--force"]) == 0
    assert len(list(tmp_path.iterdir())) == 2


def test_index_memory_is_measured_only_when_asked(tmp_path) -> None:
    base = ["run", "--workload", "multi-turn-chat", "--backend", "hashchain", *TINY]
    summaries = []
    for extra, out in (([], "plain"), (["--index-memory"], "measured")):
        assert main([*base, "--out", str(tmp_path / out), *extra]) == 0
        (folder,) = (tmp_path / out).iterdir()
        summaries.append(json.loads((folder / "summary.json").read_text()))
    assert summaries[0]["index_bytes"] is None
    assert summaries[1]["index_bytes"] > 0 and summaries[1]["index_bytes_per_cached_token"] > 0


@pytest.mark.parametrize(
    "flag, value, valid",
    [("--workload", "nope", "few-shot"), ("--backend", "nope", "none"), ("--scheduler", "nope", "lpm"),
     ("--clock", "a100", "h200-llama3-8b")],
)
def test_unknown_names_are_errors_listing_the_valid_ones(tmp_path, capsys, flag, value, valid) -> None:
    assert main(["run", flag, value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "valid:" in err and valid in err


def test_trace_prints_the_infinite_cache_hit_rate(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [TraceRecord(0, 1024, 1, (0, 1)), TraceRecord(1, 1024, 1, (0, 2))])
    assert main(["trace", str(path)]) == 0
    assert "infinite-cache block hit rate 25.0%" in capsys.readouterr().out


def test_run_replays_a_trace(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [TraceRecord(0, 600, 2, (0, 1)), TraceRecord(1, 600, 2, (0, 2))])
    assert main(["run", "--trace", str(path), "--backend", "none", "--out", str(tmp_path / "r")]) == 0
    assert "t-none-p16-cap16384-fcfs-b2048-s0-" in capsys.readouterr().out


def test_the_clock_is_a_setting_of_the_run(tmp_path, capsys) -> None:
    """--clock picks the simulated clock: another clock is another run (its name and digest),
    recorded in the summary, and the same cache work takes the roofline's GPU seconds."""
    out = tmp_path / "r"
    base = ["run", "--workload", "multi-turn-chat", "--out", str(out)]
    assert main(base) == 0 and main([*base, "--clock", "cpu"]) == 0  # the default, spelled out
    assert "skipped" in capsys.readouterr().out.splitlines()[-1]
    assert main([*base, "--clock", "h100-llama3-8b"]) == 0
    summaries = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/summary.json")}
    assert len(summaries) == 2
    (gpu,) = [s for name, s in summaries.items() if "-h100-llama3-8b-" in name]
    (cpu,) = [s for name, s in summaries.items() if "-h100-" not in name]
    assert gpu["clock"] == "roofline: Llama-3-8B on H100 SXM" and cpu["clock"].startswith("model-mode CPU")
    assert gpu["token_hit_rate"] == cpu["token_hit_rate"] and gpu["simulated_s"] != cpu["simulated_s"]


def _sweep(tmp_path, grid_lines: str) -> int:
    """``prefixcache sweep`` over a tiny chat grid into tmp_path/res (one job)."""
    grid = tmp_path / "grid.toml"
    grid.write_text(f"{grid_lines}\n[params]\nconversations = 2\nturns = 2\n")
    return main(["sweep", str(grid), "--jobs", "1", "--out", str(tmp_path / "res")])


def test_sweep_is_resumable(tmp_path, capsys) -> None:
    grid = '[grid]\nscheduler = ["fcfs", "lpm"]\n[fixed]\nbackend = "none"\ncapacity_tokens = 4096'
    assert _sweep(tmp_path, grid) == 0
    assert len([p for p in (tmp_path / "res").iterdir() if p.is_dir()]) == 2
    assert _sweep(tmp_path, grid) == 0
    assert "2 finished, 0 to run" in capsys.readouterr().out


def test_sweep_with_ray_missing_is_a_clear_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nbackend = ["none"]\n')
    assert main(["sweep", str(grid), "--executor", "ray", "--out", str(tmp_path)]) == 2
    assert "needs ray" in capsys.readouterr().err


def test_a_cluster_address_needs_the_ray_executor(tmp_path, capsys) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nbackend = ["none"]\n')
    assert main(["sweep", str(grid), "--address", "auto", "--out", str(tmp_path)]) == 2
    assert "needs --executor ray" in capsys.readouterr().err


# Columns that measure this machine's wall clock: the only ones two executors may differ in.
TIMING_COLUMNS = ["wall_s", "prompt_tokens_per_s", "cache_op_us_per_request"]
REQUEST_TIMING_COLUMNS = ["cache_op_ns", "cache_op_us"]
RAY_GRID = (
    '[grid]\nscheduler = ["fcfs", "lpm"]\nbackend = ["hashchain", "radix"]\n[fixed]\ncapacity_tokens = 4096'
)


def _sweep_with(tmp_path, out: str, *flags: str) -> int:
    grid = tmp_path / "grid.toml"
    grid.write_text(f"{RAY_GRID}\n[params]\nconversations = 2\nturns = 2\n")
    return main(["sweep", str(grid), "--out", str(tmp_path / out), *flags])


def test_sweep_on_a_local_ray_matches_joblib_and_resumes(tmp_path, capsys) -> None:
    """Ray for real: the CLI starts a local Ray with 2 CPUs, runs every cell as a task, and the
    table and per-request files equal joblib's in every column but measured timings."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")
    assert _sweep_with(tmp_path, "joblib", "--jobs", "2") == 0
    try:
        code = _sweep_with(tmp_path, "ray", "--executor", "ray", "--jobs", "2")
    except Exception as e:  # only a machine where Ray cannot start at all may skip
        pytest.skip(f"a local Ray could not start here: {type(e).__name__}: {e}")
    assert code == 0 and not ray.is_initialized(), "the sweep shuts down the Ray it started"
    printed = capsys.readouterr().out
    assert "4 to run" in printed and printed.count("token hit rate") == 8

    def table(out: str) -> pd.DataFrame:
        return pd.read_csv(tmp_path / out / "grid-sweep.csv").drop(columns=TIMING_COLUMNS)

    pd.testing.assert_frame_equal(table("ray"), table("joblib"))
    for cell in table("joblib")["config"]:
        ray_rows, joblib_rows = (
            pd.read_parquet(tmp_path / out / cell / "requests.parquet").drop(columns=REQUEST_TIMING_COLUMNS)
            for out in ("ray", "joblib")
        )
        pd.testing.assert_frame_equal(ray_rows, joblib_rows)
        assert (tmp_path / "ray" / cell / "config.json").read_text() == (
            tmp_path / "joblib" / cell / "config.json"
        ).read_text()

    # Resumable as joblib is: a lost cell is the only one run again.
    lost = table("ray")["config"].iloc[1]
    for f in (tmp_path / "ray" / lost).iterdir():
        f.unlink()
    (tmp_path / "ray" / lost).rmdir()
    assert _sweep_with(tmp_path, "ray", "--executor", "ray", "--jobs", "2") == 0
    assert "3 finished, 1 to run" in capsys.readouterr().out
    pd.testing.assert_frame_equal(table("ray"), table("joblib"))


def test_reproduce_hands_its_options_to_the_paper_pipeline(tmp_path, monkeypatch) -> None:
    # The pipeline itself runs end to end in tests/test_figures.py; here only the hand-over.
    from prefixcache.experiments.figures import reproduce

    seen: list[list[str]] = []
    monkeypatch.setattr(reproduce, "main", lambda argv: seen.append(argv) or 0)
    assert main(["reproduce", "--scale", "full", "--force", "--out", str(tmp_path), "--no-pdf"]) == 0
    assert seen == [["--scale", "full", "--out", str(tmp_path), "--paper", "paper", "--force", "--no-pdf"]]
    with pytest.raises(SystemExit):
        main(["reproduce", "--scale", "huge"])


# ---------------------------------------------------------------- honesty (issue 13, item 12)
def _trace(tmp_path, lengths: list[int]):
    """A Mooncake trace with requests of the given prompt lengths (512-token hash blocks)."""
    path = tmp_path / "t.jsonl"
    blocks = [tuple(range(100 * i, 100 * i - (-n // 512))) for i, n in enumerate(lengths)]
    records = [TraceRecord(i, n, 2, ids) for i, (n, ids) in enumerate(zip(lengths, blocks, strict=True))]
    write_mooncake(path, records)
    return path


def _run_trace(path, out, *extra: str) -> int:
    return main(["run", "--trace", str(path), "--backend", "hashchain", "--out", str(out), *extra])


def test_oversize_requests_are_reported_in_the_summary_line_and_warned_of(tmp_path, capsys) -> None:
    path = _trace(tmp_path, [600, 5000, 700])
    with pytest.warns(UserWarning, match="1 of 3 requests are larger than the cache"):
        assert _run_trace(path, tmp_path / "r", "--capacity-tokens", "2048") == 0
    out = capsys.readouterr().out
    assert "of 2 requests" in out and "1 rejected (larger than the cache" in out
    (folder,) = (tmp_path / "r").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rejected"] == 1 and summary["requests"] == 3


def test_a_cache_smaller_than_every_request_is_an_error(tmp_path, capsys) -> None:
    path = _trace(tmp_path, [600, 700])
    assert _run_trace(path, tmp_path / "r", "--capacity-tokens", "100") == 2
    assert "all 2 requests are larger than the cache" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_limit_below_one_is_an_error(tmp_path, capsys, limit: str) -> None:
    path = _trace(tmp_path, [600, 700])
    assert _run_trace(path, tmp_path / "r", "--limit", limit) == 2
    assert "--limit must be an int >= 1" in capsys.readouterr().err


def test_limit_is_part_of_the_folder_name_whenever_given(tmp_path, capsys) -> None:
    path = _trace(tmp_path, [600, 700, 800])
    assert _run_trace(path, tmp_path / "r", "--limit", "2") == 0
    assert _run_trace(path, tmp_path / "r") == 0
    assert _run_trace(path, tmp_path / "r", "--limit", "3") == 0
    names = sorted(p.name for p in (tmp_path / "r").iterdir())
    base = "t-hashchain-p16-cap16384-lru-fcfs-b2048-s0"
    assert [n.rsplit("-", 1)[0] for n in names] == [base, f"{base}-first2", f"{base}-first3"]
    assert "skipped" not in capsys.readouterr().out
    requests = [json.loads((tmp_path / "r" / n / "summary.json").read_text())["requests"] for n in names]
    assert requests == [3, 2, 3]


def test_an_empty_trace_is_an_error(tmp_path, capsys) -> None:
    path = _trace(tmp_path, [])
    assert _run_trace(path, tmp_path / "r") == 2
    assert "holds no requests" in capsys.readouterr().err


def test_a_trace_run_records_the_trace_not_a_workload(tmp_path) -> None:
    path = _trace(tmp_path, [600, 700])
    assert _run_trace(path, tmp_path / "r") == 0
    (folder,) = (tmp_path / "r").iterdir()
    config = json.loads((folder / "config.json").read_text())
    assert config["trace"] == str(path) and config["workload"] is None
    assert _run_trace(path, tmp_path / "r", "--param", "turns=3") == 2  # workload parameters


def test_sweep_writes_one_tidy_table_and_advances_per_finished_cell(tmp_path, monkeypatch, capsys) -> None:
    import tqdm.auto
    from prefixcache.experiments import runs

    events: list[str] = []

    class Bar(tqdm.auto.tqdm):  # type: ignore[misc, name-defined]
        def __init__(self, *args: object, **kwargs: object) -> None:
            if kwargs.get("unit") == "cell":  # shown although stderr is no terminal here
                kwargs["disable"] = False
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if getattr(self, "unit", None) == "cell":  # the sweep's bar, not a run's
                events.append("bar")
            return super().update(n)

    real = runs.simulate
    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.setattr(runs, "simulate", lambda *a, **k: events.append("cell") or real(*a, **k))
    grid = '[grid]\nscheduler = ["fcfs", "lpm"]\nbackend = ["none", "radix"]\n[fixed]\ncapacity_tokens = 4096'
    assert _sweep(tmp_path, grid) == 0
    out = tmp_path / "res"
    assert events.count("cell") == 4 and events.count("bar") == 4
    last_cell = len(events) - 1 - events[::-1].index("cell")
    assert events.index("bar") < last_cell, f"the bar moved only after every cell: {events}"
    table = pd.read_csv(out / "grid-sweep.csv")
    assert len(table) == 4 and set(table["backend"]) == {"none", "radix"}
    assert {"scheduler", "param_turns", "token_hit_rate", "rejected"} <= set(table.columns)
    assert pd.read_parquet(out / "grid-sweep.parquet")["config"].tolist() == table["config"].tolist()


def test_help_lists_choices_and_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # undo the wrapping
    for expected in ("dfs-offline", "radix", "shared-doc-qa", "(default: hashchain)", "(default: fcfs)",
                     "(default: 16384)", "(default: all)"):
        assert expected in text
    assert "(default: None)" not in text


def test_the_offline_dfs_order_runs_under_the_papers_name(tmp_path) -> None:
    from prefixcache.experiments.inputs.workloads import make_workload

    from prefixcache.scheduler import dfs_weight_order

    args = ["run", "--workload", "generated-shared-prefix", "--param", "shuffle=true", "--backend", "radix",
            "--scheduler", "dfs-offline", "--out", str(tmp_path)]
    assert main(args) == 0
    (folder,) = tmp_path.iterdir()
    df = pd.read_parquet(folder / "requests.parquet")
    admitted = df.sort_values(["admission_step", "admission_time"], kind="stable")["request_id"].tolist()
    fcfs = [r.request_id for r in make_workload("generated-shared-prefix", shuffle=True).generate()]
    workload = make_workload("generated-shared-prefix", shuffle=True)
    expected = [r.request_id for r in dfs_weight_order(workload.generate())]
    assert expected != fcfs  # the order is not arrival order already
    assert admitted[:8] == expected[:8]


def test_show_draws_both_structures_from_the_backends_state(tmp_path, capsys) -> None:
    from prefixcache.experiments.figures.structures import WALKTHROUGH, run_requests

    snap = run_requests(WALKTHROUGH, 4)
    # the seed article: B hits A's 3 blocks; C shares 10 tokens, a 4-token block cache keeps 8
    assert snap.hits == {"hashchain": [0, 12, 8], "radix": [0, 12, 10]}
    by_id = {b.block_id: b for b in snap.blocks}
    assert len(by_id) == 7 and all(b.parent is None or b.parent in by_id for b in snap.blocks)
    assert {b.tokens for b in snap.blocks} >= {(0, 1, 2, 3), (12, 13, 14, 15), (20, 21, 22, 23)}
    assert [c.tokens for c in snap.tree.children] == [tuple(range(10))]  # split where C diverges
    assert set(snap.free_queue) >= set(by_id)  # released: every cached block is evictable
    out = tmp_path / "s.png"
    assert main(["show", "--requests", "1 2 3 4 5; 1 2 3 9 9", "--page-size", "2", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    assert "request 1: 5 tokens, hit hashchain 2, radix 3" in capsys.readouterr().out
    assert main(["show", "--requests", "1 x", "--out", str(out)]) == 2
    assert main(["show", "--requests", "1", "--out", str(out)]) == 2
    assert "at least 2 tokens" in capsys.readouterr().err


def test_backend_options_reach_the_cache_and_name_the_folder(tmp_path, capsys) -> None:
    """--option key=value is handed to make_cache (here vLLM's use_eagle, which drops a block
    of every hit: the hit rate falls); an option the backend does not take is a clear error."""
    base = ["run", "--workload", "multi-turn-chat", "--backend", "hashchain", *TINY, "--out", str(tmp_path)]
    assert main(base) == 0
    assert main([*base, "--option", "use_eagle=true"]) == 0
    by_options = {bool(json.loads((p / "config.json").read_text())["options"]): p for p in tmp_path.iterdir()}
    plain, eagle = by_options[False], by_options[True]
    assert eagle.name.rsplit("-", 1)[0] == plain.name.rsplit("-", 1)[0]  # options live in the digest
    config = json.loads((eagle / "config.json").read_text())
    assert config["options"] == {"use_eagle": True}
    rates = [json.loads((p / "summary.json").read_text())["token_hit_rate"] for p in (plain, eagle)]
    assert rates[1] < rates[0]
    capsys.readouterr()
    assert main([*base, "--option", "no_such_option=1"]) == 2
    assert "no_such_option" in capsys.readouterr().err


def test_bad_host_tier_flags_are_errors_before_any_work(tmp_path, capsys) -> None:
    base = ["run", "--workload", "multi-turn-chat", "--backend", "hashchain", *TINY, "--out", str(tmp_path)]
    assert main([*base, "--host-tokens", "-5"]) == 2
    assert "capacity_tokens must be positive" in capsys.readouterr().err
    assert main([*base, "--host-tokens", "8192", "--host-eviction-policy", "fifo"]) == 2
    assert "unknown host eviction_policy 'fifo'" in capsys.readouterr().err
    assert main([*base, "--host-eviction-policy", "arc"]) == 2  # no size: not a 2x tier in silence
    assert "a host tier needs a size" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
