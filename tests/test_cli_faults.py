"""Bad input and faults through the command line: every row gives a clear error (rc 2, one line
naming what is wrong) or a visible warning, and never a lost or wrong result (issue 29).

Rows that need their own setup (result identity, interrupted and concurrent runs, the base
install, the sweep's request sets) are tests of their own below the table. The lifecycle's API
misuse is tests/test_lifecycle_misuse.py; the trace readers' own table tests/test_trace_input.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from prefixcache.experiments import run_config, run_store, runs
from prefixcache.experiments.cli import main
from prefixcache.experiments.inputs.traces import TraceRecord, write_mooncake

REPO = Path(__file__).resolve().parents[1]
TINY = ["--param", "conversations=2", "--param", "turns=2", "--capacity-tokens", "4096"]
CHAT = ["run", "--workload", "multi-turn-chat", *TINY]


def finished_summary(folder: Path, cfg: dict) -> dict | None:
    from prefixcache.experiments.run_store import finished_summary

    return finished_summary(folder, cfg)


def read_config(folder: Path) -> dict:
    from prefixcache.experiments.run_store import read_config

    return read_config(folder)


def run_name(cfg: dict) -> str:
    return run_store.run_name(cfg)


def _trace(path: Path, lengths: list[int], *, first_id: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_mooncake(path, [TraceRecord(i, n, 2, tuple(range(first_id, first_id + -(-n // 512))))
                          for i, n in enumerate(lengths)])
    return path


def _lines(path: Path, *rows: str) -> Path:
    path.write_text("".join(f"{r}\n" for r in rows))
    return path


def _folders(out: Path) -> list[Path]:
    if not out.exists():
        return []
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that gets as far as simulating fails the test: the error had to come first."""
    monkeypatch.setattr(runs, "simulate", lambda *a, **k: pytest.fail("simulated before the error"))


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}'

# (id, how to build the argv from tmp_path, a piece of the error). Every row: rc 2, the piece in
# stderr, no traceback, and no result folder written.
ERRORS = [
    ("missing trace", lambda t: ["run", "--trace", str(t / "nope.jsonl")], "not found"),
    ("empty trace", lambda t: ["run", "--trace", str(_lines(t / "e.jsonl"))], "no requests"),
    ("malformed line", lambda t: ["run", "--trace", str(_lines(t / "m.jsonl", GOOD, "{oops"))], ":2"),
    ("json array as trace", lambda t: ["run", "--trace", str(_lines(t / "a.jsonl", f"[{GOOD}]"))], "a.jsonl"),
    ("folder as trace", lambda t: ["run", "--trace", str(t)], "not a file"),
    ("trace of unknown format", lambda t: ["run", "--trace", str(_lines(t / "x.txt", GOOD))], ".jsonl"),
    ("NaN timestamp", lambda t: ["run", "--trace", str(_lines(
        t / "n.jsonl", GOOD, GOOD.replace('"timestamp": 0', '"timestamp": NaN')))], ":2"),
    ("negative length", lambda t: ["run", "--trace", str(_lines(
        t / "l.jsonl", GOOD.replace("600", "-600")))], "input_length"),
    ("capacity 0", lambda t: [*CHAT, "--capacity-tokens", "0"], "--capacity-tokens must be an int >= 1"),
    ("capacity negative", lambda t: [*CHAT, "--capacity-tokens", "-16"], "--capacity-tokens must be"),
    ("capacity huge", lambda t: [*CHAT, "--capacity-tokens", str(10**13)], "memory"),
    ("capacity below two pages", lambda t: [*CHAT, "--capacity-tokens", "20"], "at least 2"),
    ("page size 0", lambda t: [*CHAT, "--page-size", "0"], "--page-size must be an int >= 1"),
    ("page size negative", lambda t: [*CHAT, "--page-size", "-4"], "--page-size must be"),
    ("page size huge", lambda t: [*CHAT, "--page-size", str(2**20)], "at least 2"),
    ("token budget 0", lambda t: [*CHAT, "--token-budget", "0"], "--token-budget must be"),
    ("seed negative", lambda t: [*CHAT, "--seed", "-1"], "--seed must be"),
    ("limit 0", lambda t: [*CHAT, "--limit", "0"], "--limit must be an int >= 1"),
    ("unknown backend", lambda t: [*CHAT, "--backend", "vllm"], "valid: hashchain, none, radix"),
    ("unknown scheduler", lambda t: [*CHAT, "--scheduler", "sjf"], "valid: "),
    ("unknown workload", lambda t: ["run", "--workload", "chatty"], "few-shot"),
    ("unknown eviction policy", lambda t: [*CHAT, "--eviction-policy", "belady"],
     "takes: eviction_policy: lru"),
    ("eviction policy for none", lambda t: [*CHAT, "--backend", "none", "--eviction-policy", "lru"],
     "takes no eviction policy"),
    ("unknown layout", lambda t: [*CHAT, "--layout", "llama-like"], "presets: dense"),
    ("layout not JSON", lambda t: [*CHAT, "--layout", "[oops"], "not JSON"),
    ("unknown --option", lambda t: [*CHAT, "--option", "use_eagles=true"], "valid: dedupe, free_order"),
    ("bad --option value", lambda t: [*CHAT, "--option", "use_eagle=maybe"], "must be a bool"),
    ("--option without =", lambda t: [*CHAT, "--option", "use_eagle"], "expects key=value"),
    ("layout twice", lambda t: [*CHAT, "--layout", "dense", "--option", "layout=gemma3-like"], "given twice"),
    ("trace and workload", lambda t: ["run", "--trace", str(_trace(t / "t.jsonl", [600])),
                                      "--workload", "rag"], "not both"),
    ("--param with a trace", lambda t: ["run", "--trace", str(_trace(t / "t.jsonl", [600])),
                                        "--param", "turns=3"], "a trace takes none"),
    ("host policy without a size", lambda t: [*CHAT, "--host-eviction-policy", "arc"], "needs a size"),
    ("arrival scale 0", lambda t: [*CHAT, "--arrival-scale", "0"], "--arrival-scale must be"),
    ("arrival scale nan", lambda t: [*CHAT, "--arrival-scale", "nan"], "--arrival-scale must be"),
    ("--out is a file", lambda t: [*CHAT, "--out", str(_lines(t / "f"))], "is a file"),
    ("--out under a file", lambda t: [*CHAT, "--out", str(_lines(t / "f") / "sub")], "not writable"),
    ("show --out is a folder", lambda t: ["show", "--out", str(t)], "is a folder"),
    ("non-integer token ids", lambda t: ["show", "--requests", "1,a;2", "--out", str(t / "s.png")],
     "must be integers"),
    ("policy class not importable", lambda t: [*CHAT, "--eviction-policy", "no_such_mod:Cls"], "no_such_mod"),
    ("all prompts beyond capacity", lambda t: ["run", "--trace", str(_trace(t / "big.jsonl", [9000])),
                                               "--capacity-tokens", "4096"], "larger than the cache"),
    ("missing sweep file", lambda t: ["sweep", str(t / "nope.toml")], "does not exist"),
    ("sweep file not TOML", lambda t: ["sweep", str(_lines(t / "g.toml", "[grid"))], "not TOML"),
    ("sweep file empty", lambda t: ["sweep", str(_lines(t / "g.toml"))], "no cells"),
    ("sweep [options] typo", lambda t: ["sweep", str(_lines(t / "g.toml", "[option]", "use_eagle = true"))],
     "unknown section(s) [option]"),
    ("sweep [grd] typo", lambda t: ["sweep", str(_lines(t / "g.toml", "[grd]", "seed = [0]"))], "[grd]"),
    ("sweep unknown key", lambda t: ["sweep", str(_lines(t / "g.toml", "[fixed]", "capacity = 4096"))],
     "unknown config key(s) ['capacity']"),
    ("sweep empty grid list", lambda t: ["sweep", str(_lines(t / "g.toml", "[grid]", "seed = []"))],
     "empty list"),
    ("sweep grid scalar", lambda t: ["sweep", str(_lines(t / "g.toml", "[grid]", "seed = 1"))],
     "not a list"),
    ("sweep key in grid and fixed", lambda t: ["sweep", str(_lines(
        t / "g.toml", "[grid]", "seed = [0, 1]", "[fixed]", "seed = 2"))], "in both"),
    ("sweep table path is a folder", lambda t: ["sweep", str(_lines(t / "g.toml", "[fixed]", "seed = 0")),
                                                "--out", str((t / "o" / "g-sweep.csv").mkdir(parents=True)
                                                             or t / "o")], "is a folder"),
    ("sweep without a file", lambda t: ["sweep"], "--example"),
    ("plot of a missing column",
     lambda t: ["plot", str(_table(t)), "--x", "capacity", "--y", "token_hit_rate"],
     "capacity"),
]


def _table(tmp: Path) -> Path:
    path = tmp / "sweep.csv"
    table = {"capacity_tokens": [1, 2], "token_hit_rate": [0.1, 0.2], "backend": ["a", "a"]}
    pd.DataFrame(table).to_csv(path)
    return path


@pytest.mark.parametrize("build, piece", [pytest.param(b, p, id=i) for i, b, p in ERRORS])
def test_bad_input_is_one_clear_error_before_any_result(tmp_path, capsys, monkeypatch, build, piece) -> None:
    argv = build(tmp_path)
    if "--out" not in argv and argv[0] in ("run", "sweep"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert piece in err, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert not _folders(tmp_path / "out"), "a failed command left a result folder"


WARNINGS = [
    ("page size 3", lambda t: [*CHAT, "--page-size", "3"], "not a power of two"),
    ("descending timestamps", lambda t: ["run", "--trace", str(_lines(
        t / "d.jsonl", GOOD.replace('"timestamp": 0', '"timestamp": 5000'), GOOD))],
     "out of timestamp order"),
    ("some prompts beyond capacity", lambda t: ["run", "--trace", str(_trace(t / "t.jsonl", [600, 9000])),
                                                "--capacity-tokens", "4096"], "token_hit_rate_all"),
]


@pytest.mark.parametrize("build, piece", [pytest.param(b, p, id=i) for i, b, p in WARNINGS])
def test_what_is_accepted_with_a_doubt_is_warned_of(tmp_path, build, piece) -> None:
    with pytest.warns(UserWarning) as caught:
        assert main([*build(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert [str(w.message) for w in caught if piece in str(w.message)], [str(w.message) for w in caught]
    (folder,) = _folders(tmp_path / "out")
    assert finished_summary(folder, read_config(folder)) is not None


def test_a_warning_is_one_line_without_its_source(tmp_path) -> None:
    proc = _cli(*CHAT, "--page-size", "3", "--out", str(tmp_path))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (line,) = err.splitlines()
    assert line.startswith("prefixcache: warning: page size 3 is not a power of two"), err


# ------------------------------------------------------------------------------ 1. identity
def _summary(out: Path, name_part: str = "") -> dict:
    (folder,) = [f for f in _folders(out) if name_part in f.name]
    return json.loads((folder / "summary.json").read_text())


def test_two_traces_of_one_name_are_two_runs(tmp_path, capsys) -> None:
    a = _trace(tmp_path / "a" / "t.jsonl", [600, 600, 600])
    b = _trace(tmp_path / "b" / "t.jsonl", [1200, 1300], first_id=50)
    grid = _lines(tmp_path / "g.toml", "[grid]", f'trace = ["{a}", "{b}"]', "[fixed]", 'backend = "radix"')
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    table = pd.read_csv(tmp_path / "o" / "g-sweep.csv")
    assert table["requests"].tolist() == [3, 2]
    assert table["prefill_tokens_computed"].nunique() == 2


def test_an_edited_trace_is_a_new_run_not_a_stale_skip(tmp_path, capsys) -> None:
    path = _trace(tmp_path / "t.jsonl", [600, 600])
    argv = ["run", "--trace", str(path), "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    _trace(path, [600, 600, 600])
    assert main(argv) == 0
    assert "skipped" not in capsys.readouterr().out
    assert sorted(_summary_of(f)["requests"] for f in _folders(tmp_path / "o")) == [2, 3]


def _summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.parametrize("damage", ["delete requests", "empty summary", "truncate requests"])
def test_a_damaged_folder_is_not_finished(tmp_path, capsys, damage) -> None:
    argv = [*CHAT, "--out", str(tmp_path)]
    assert main(argv) == 0
    (folder,) = _folders(tmp_path)
    good = _summary_of(folder)
    if damage == "delete requests":
        (folder / "requests.parquet").unlink()
    elif damage == "empty summary":
        (folder / "summary.json").write_text("")
    else:
        (folder / "requests.parquet").write_bytes(b"PAR1")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="is not a finished run"):
        assert main(argv) == 0
    assert "skipped" not in capsys.readouterr().out
    assert [f.name for f in _folders(tmp_path)] == [folder.name]  # replaced, not beside it
    assert _summary_of(folder)["token_hit_rate"] == good["token_hit_rate"]
    assert finished_summary(folder, read_config(folder)) is not None


def test_an_explicit_default_is_the_same_run(tmp_path, capsys) -> None:
    assert main([*CHAT, "--out", str(tmp_path)]) == 0
    for same in (["--eviction-policy", "lru"], ["--eviction-policy", "LRU"],
                 ["--option", "eviction_policy=lru"],
                 ["--arrival-scale", "1"], ["--seed", "0"]):
        assert main([*CHAT, *same, "--out", str(tmp_path)]) == 0
        assert "skipped (finished earlier)" in capsys.readouterr().out, same
    assert len(_folders(tmp_path)) == 1


def test_folder_names_are_readable(tmp_path, capsys) -> None:
    assert main([*CHAT, "--backend", "radix", "--eviction-policy", "lfu", "--option", "need_sort=true",
                 "--out", str(tmp_path)]) == 0
    (folder,) = _folders(tmp_path)
    stem, digest = folder.name.rsplit("-", 1)
    assert stem == "multi-turn-chat-radix-p16-cap4096-lfu-fcfs-b2048-s0" and len(digest) == 10
    assert json.loads((folder / "config.json").read_text())["options"] == {"need_sort": True}


def test_sweep_options_section_reaches_every_cell(tmp_path, capsys) -> None:
    grid = _lines(tmp_path / "g.toml", "[grid]", 'backend = ["hashchain", "radix"]', "[fixed]",
                  "capacity_tokens = 4096", 'eviction_policy = "gdsf"', "[params]", "conversations = 2",
                  "turns = 2", "[options]", "kv_events = true")
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    configs = [json.loads((f / "config.json").read_text()) for f in _folders(tmp_path / "o")]
    assert [(c["eviction_policy"], c["options"]) for c in configs] == [("gdsf", {"kv_events": True})] * 2


def test_the_printed_example_is_a_valid_sweep(capsys) -> None:
    assert main(["sweep", "--example"]) == 0
    text = capsys.readouterr().out
    from prefixcache.experiments.sweep_file import _cells

    cells = _cells(tomllib.loads(text), run_config.full_config)
    assert len(cells) == 12 and {c["backend"] for c in cells} == {"hashchain", "radix"}
    assert "#" in text  # commented


# ------------------------------------------------------------------------------ concurrency, SIGINT
def _default_sigint() -> None:
    # As a shell starts a command: a library earlier in this test process may have left
    # SIGINT ignored, and an ignored disposition survives exec (Python then installs no
    # KeyboardInterrupt handler, so the run would finish and exit 0).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
    return subprocess.Popen([sys.executable, "-m", "prefixcache", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_default_sigint, **kw)


def test_concurrent_forced_runs_and_sweeps_into_one_out_lose_nothing(tmp_path) -> None:
    out = tmp_path / "o"
    assert main([*CHAT, "--out", str(out)]) == 0
    procs = [_cli(*CHAT, "--force", "--out", str(out)) for _ in range(2)]
    grid = _lines(tmp_path / "g.toml", "[grid]", "seed = [0, 1, 2]", "[fixed]", "capacity_tokens = 4096",
                  "[params]", "conversations = 2", "turns = 2")
    procs += [_cli("sweep", str(grid), "--jobs", "1", "--out", str(out)) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    folders = _folders(out)
    seed0 = [f for f in folders if "-s0-" in f.name]
    assert len(seed0) == 3, [f.name for f in folders]  # the first run and two forced reruns
    assert len(folders) == 5  # seeds 1 and 2 once each, though two sweeps ran them
    for f in folders:
        assert finished_summary(f, read_config(f)) is not None
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(pd.read_csv(out / "g-sweep.csv")) == 3


LONG = ["--param", "conversations=6000", "--param", "turns=4", "--backend", "radix"]  # ~10 s


def _interrupt(proc: subprocess.Popen, ready) -> tuple[int, str]:
    # A generous wait for ``ready``: on a loaded 2-core machine the first cell can take minutes
    deadline = time.monotonic() + 300
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_sigint_mid_run_writes_nothing_and_a_rerun_runs_it(tmp_path) -> None:
    out = tmp_path / "o"
    rc, err = _interrupt(_cli("run", "--workload", "multi-turn-chat", *LONG, "--out", str(out)),
                         lambda: out.exists())
    assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    assert list(out.iterdir()) == []  # neither a folder nor a temporary one
    cfg = run_config.full_config({"params": {"conversations": 6000, "turns": 4}, "backend": "radix"})
    assert finished_summary(out / run_name(cfg), cfg) is None


def test_sigint_mid_sweep_keeps_finished_cells_and_resumes(tmp_path) -> None:
    out = tmp_path / "o"
    grid = _lines(tmp_path / "g.toml", "[grid]", "seed = [0, 1]", "[fixed]", 'backend = "radix"',
                  "[params]", "conversations = 6000", "turns = 4")
    # The first cell (seed 0) finishes, then the sweep is interrupted inside the second.
    rc, err = _interrupt(_cli("sweep", str(grid), "--jobs", "1", "--out", str(out)),
                         lambda: len(_folders(out)) >= 1)
    assert rc == 130 and "interrupted" in err, err
    from prefixcache.experiments.sweep_file import read_sweep

    cells = read_sweep(grid, run_config.full_config)
    done = [c for c in cells if finished_summary(out / run_name(c), c) is not None]
    assert [c["seed"] for c in done] == [0]
    assert [f.name for f in _folders(out)] == [run_name(cells[0])]


# ------------------------------------------------------------------------------ 5. request sets
def test_hit_rates_over_all_requests_and_over_the_common_set(tmp_path, capsys) -> None:
    """Cells whose capacity drops some prompts change their rate's request set; the table
    offers the rate over the requests every cell admitted, and warns."""
    path = _trace(tmp_path / "t.jsonl", [1000, 1000, 6000, 1000, 6000, 1000])
    grid = _lines(tmp_path / "g.toml", "[grid]", "capacity_tokens = [4096, 16384]", "[fixed]",
                  f'trace = "{path}"', 'backend = "radix"', "page_size = 1")
    with pytest.warns(UserWarning, match="admitted different requests.*token_hit_rate_common"):
        assert main(["sweep", str(grid), "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    table = pd.read_csv(tmp_path / "o" / "g-sweep.csv")
    small, large = table.sort_values("capacity_tokens").to_dict("records")
    assert (small["admitted"], small["rejected"], large["admitted"]) == (4, 2, 6)
    # Over all requests a rejected one is a miss: the denominator is the same in both cells.
    frames = {read_config(f)["capacity_tokens"]: pd.read_parquet(f / "requests.parquet")
              for f in _folders(tmp_path / "o")}
    for row in (small, large):
        df = frames[row["capacity_tokens"]]
        assert row["token_hit_rate_all"] == pytest.approx(df.loc[~df.rejected, "hit_tokens"].sum()
                                                          / df["prompt_tokens"].sum())
        common = df[df.request_id.isin(frames[4096].loc[~frames[4096].rejected, "request_id"])]
        rate = common.hit_tokens.sum() / common.prompt_tokens.sum()
        assert row["token_hit_rate_common"] == pytest.approx(rate)
    assert small["token_hit_rate_common"] == pytest.approx(small["token_hit_rate"])


# ------------------------------------------------------------------------------ 6. arrivals
def test_arrival_scale_rescales_gaps_from_the_first(tmp_path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    write_mooncake(path, [TraceRecord(1000 * i + 500, 500, 2, (i,)) for i in range(4)])
    arrivals = []
    for scale in ("1", "0.5"):
        out = tmp_path / scale
        assert main(["run", "--trace", str(path), "--arrival-scale", scale, "--out", str(out)]) == 0
        (folder,) = _folders(out)
        arrivals.append(pd.read_parquet(folder / "requests.parquet")["arrival_time"].to_numpy())
    first = arrivals[0][0]
    assert arrivals[1] == pytest.approx(first + (arrivals[0] - first) * 0.5)
    assert "arrivals0.5" in _folders(tmp_path / "0.5")[0].name


def test_out_of_order_azure_rows_never_arrive_before_zero(tmp_path, capsys) -> None:
    path = _lines(tmp_path / "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens",
                  "2023-11-16 18:15:50.000,500,10", "2023-11-16 18:15:30.000,400,10",
                  "2023-11-16 18:16:10.000,300,10")
    with pytest.warns(UserWarning, match="out of timestamp order"):
        assert main(["run", "--trace", str(path), "--out", str(tmp_path / "o")]) == 0
    (folder,) = _folders(tmp_path / "o")
    df = pd.read_parquet(folder / "requests.parquet")
    assert df["arrival_time"].min() >= 0 and df["arrival_time"].is_monotonic_increasing
    assert df["ttft_s"].max() < 5.0  # no 20 s of queueing made up by a negative arrival


def test_trace_output_survives_a_closed_pipe(tmp_path) -> None:
    path = _trace(tmp_path / "t.jsonl", [600] * 50)
    proc = _cli("trace", str(path))
    proc.stdout.close()  # the reader is gone before a line is written
    with proc.stderr:
        err = proc.stderr.read()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# ------------------------------------------------------------------------------ 9, 10. install, noise
EXTRAS_BLOCKED = ["seaborn", "matplotlib", "pympler", "ray", "zmq", "msgspec"]


def test_the_base_install_runs_every_results_command(tmp_path) -> None:
    """Without any extra (their modules made unimportable), run, sweep and trace work and the
    commands that draw say in one line which extra adds what they need."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    core = {d.split(">")[0].split("=")[0] for d in deps}
    assert {"pandas", "pyarrow", "joblib", "numpy", "tqdm"} <= core
    trace = _trace(tmp_path / "t.jsonl", [600, 700])
    grid = _lines(tmp_path / "g.toml", "[grid]", "seed = [0, 1]", "[fixed]", f'trace = "{trace}"')
    block = "; ".join(f"sys.modules[{m!r}] = None" for m in EXTRAS_BLOCKED)
    for argv, rc, piece in (
        (["run", "--trace", str(trace), "--out", str(tmp_path / "o")], 0, "token hit rate"),
        (["sweep", str(grid), "--jobs", "1", "--out", str(tmp_path / "o")], 0, "sweep table"),
        (["trace", str(trace)], 0, "requests"),
        (["plot", str(tmp_path / "o" / "g-sweep.csv"), "--x", "seed", "--y", "token_hit_rate"], 2,
         "pip install 'prefixcache[paper]'"),
    ):
        code = f"import sys; {block}; from prefixcache.experiments.cli import main; sys.exit(main({argv!r}))"
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert res.returncode == rc, res.stderr
        assert piece in res.stdout + res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["run", "sweep", "plot", "trace", "show", "reproduce", None])
def test_help_is_plain_text(capsys, command) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"] if command else ["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and "usage: prefixcache" in out


def test_the_summary_line_has_ttft_and_the_sweep_prints_above_its_bar(tmp_path, capsys) -> None:
    assert main([*CHAT, "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out
    assert "TTFT p50 " in line and " p99 " in line
    assert _summary_of(_folders(tmp_path)[0])["ttft_p50_s"] > 0


# ------------------------------------------------------------------------------ 8. a user's policy
USER_POLICY = '''
class NewestFirst:
    """Evict the newest entry first (the opposite of FIFO)."""

    def priority(self, entry):
        return -entry.creation_time
'''


def test_a_users_policy_class_runs_from_the_command_line_in_both_backends(tmp_path) -> None:
    """``--eviction-policy module:Class`` in both designs, also in a sweep's worker processes
    (which import the module themselves)."""
    (tmp_path / "userpol.py").write_text(USER_POLICY)
    grid = _lines(tmp_path / "g.toml", "[grid]", 'backend = ["hashchain", "radix"]', "[fixed]",
                  "capacity_tokens = 1024", 'eviction_policy = "userpol:NewestFirst"', "[params]",
                  "conversations = 4", "turns = 3")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, "-m", "prefixcache", "sweep", str(grid), "--jobs", "2",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=180)
    assert res.returncode == 0, res.stderr
    table = pd.read_csv(tmp_path / "o" / "g-sweep.csv")
    assert set(table["eviction_policy"]) == {"userpol:NewestFirst"} and len(table) == 2
    assert all("userpol.NewestFirst" in f.name for f in _folders(tmp_path / "o"))
    assert (table["evicted_tokens"] > 0).all()  # the small pool evicted: the policy chose
    lru = _lines(tmp_path / "lru.toml", *grid.read_text().replace("userpol:NewestFirst", "lru").splitlines())
    assert main(["sweep", str(lru), "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    lru_table = pd.read_csv(tmp_path / "o" / "lru-sweep.csv")
    assert (table["prefill_tokens_computed"] != lru_table["prefill_tokens_computed"]).all()
