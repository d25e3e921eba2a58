"""CLI smoke tests at tiny scale."""

from __future__ import annotations

import json

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
    [("--workload", "nope", "few-shot"), ("--backend", "nope", "none"), ("--scheduler", "nope", "lpm")],
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
    assert "t-none-fcfs" in capsys.readouterr().out


def test_sweep_is_resumable(tmp_path, capsys) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[grid]\nscheduler = ["fcfs", "lpm"]\n[fixed]\nbackend = "none"\ncapacity_tokens = 4096\n'
        "[params]\nconversations = 2\nturns = 2\n"
    )
    out = tmp_path / "res"
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(out)]) == 0
    assert len(list(out.iterdir())) == 2
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(out)]) == 0
    assert "2 finished, 0 to run" in capsys.readouterr().out


def test_sweep_with_ray_missing_is_a_clear_error(tmp_path, capsys) -> None:
    pytest.importorskip("joblib")
    try:
        import ray  # noqa: F401

        pytest.skip("ray is installed")
    except ImportError:
        pass
    grid = tmp_path / "grid.toml"
    grid.write_text('[grid]\nbackend = ["none"]\n')
    assert main(["sweep", str(grid), "--executor", "ray", "--out", str(tmp_path)]) == 2
    assert "needs ray" in capsys.readouterr().err


def test_reproduce_hands_its_options_to_the_paper_pipeline(tmp_path, monkeypatch) -> None:
    # The pipeline itself runs end to end in tests/test_figures.py; here only the hand-over.
    from prefixcache.experiments.figures import reproduce

    seen: list[list[str]] = []
    monkeypatch.setattr(reproduce, "main", lambda argv: seen.append(argv) or 0)
    assert main(["reproduce", "--scale", "full", "--force", "--out", str(tmp_path), "--no-pdf"]) == 0
    assert seen == [["--scale", "full", "--out", str(tmp_path), "--paper", "paper", "--force", "--no-pdf"]]
    with pytest.raises(SystemExit):
        main(["reproduce", "--scale", "huge"])
