"""A picture of a sweep (experiments/plot.py): written as a PNG from a table or a DataFrame,
lines for a numeric x and bars otherwise, 95% intervals only where cells repeat over seeds,
a log axis from two decades up, and clear errors naming the columns."""

from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from prefixcache.experiments.plot import plot_sweep, sweep_figure


def sweep(seeds: int = 2, capacities: tuple[int, ...] = (2048, 8192, 32768)) -> pd.DataFrame:
    """2 backends x 3 capacities x ``seeds`` seeds, hit rates that differ by seed."""
    rows = [
        {"backend": b, "capacity_tokens": c, "page_size": 16, "seed": s, "config": f"{b}-{c}-s{s}",
         "token_hit_rate": 0.1 * i + 0.02 * s + (0.05 if b == "radix" else 0.0), "ttft_p50_s": 1.0 / (i + 1)}
        for b in ("hashchain", "radix") for i, c in enumerate(capacities) for s in range(seeds)
    ]
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def bands(fig) -> int:
    return sum(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)


def bars(ax) -> int:
    return sum(len(container) for container in ax.containers)


def test_a_sweep_csv_is_drawn_to_a_png_beside_it(tmp_path) -> None:
    table = tmp_path / "grid-sweep.csv"
    sweep().to_csv(table, index=False)
    path = plot_sweep(table, "capacity_tokens", "token_hit_rate", hue="backend")
    assert path == tmp_path / "grid-sweep.token_hit_rate.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_the_same_table_gives_the_same_bytes(tmp_path) -> None:
    pytest.importorskip("pyarrow")
    table = tmp_path / "grid-sweep.parquet"
    sweep().to_parquet(table, index=False)
    a = plot_sweep(table, "capacity_tokens", "token_hit_rate", hue="backend", out=tmp_path / "a.png")
    b = plot_sweep(sweep(), "capacity_tokens", "token_hit_rate", hue="backend", out=tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes()  # bootstrap intervals are seeded


def test_repeated_seeds_draw_a_95_percent_band_and_single_cells_none() -> None:
    fig = sweep_figure(sweep(seeds=2), "capacity_tokens", "token_hit_rate", hue="backend")
    assert bands(fig) == 2  # one per backend
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("capacity_tokens", "token_hit_rate")
    drawn = [line for line in ax.lines if len(line.get_xdata())]  # not the legend's handles
    assert len(drawn) == 2 and {line.get_marker() for line in drawn} == {"o"}
    assert bands(sweep_figure(sweep(seeds=1), "capacity_tokens", "token_hit_rate", hue="backend")) == 0


def test_a_categorical_x_is_bars_with_error_bars_only_where_seeds_repeat() -> None:
    fig = sweep_figure(sweep(seeds=2), "backend", "token_hit_rate", hue="capacity_tokens")
    ax = fig.axes[0]
    assert bars(ax) == 6 and len(ax.lines) == 6  # a bar and an error bar per cell
    assert [t.get_text() for t in ax.get_xticklabels()] == ["hashchain", "radix"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["2048", "8192", "32768"]  # numeric order
    ax = sweep_figure(sweep(seeds=1), "backend", "token_hit_rate", hue="capacity_tokens").axes[0]
    assert bars(ax) == 6 and len(ax.lines) == 0


@pytest.mark.parametrize("capacities, scale",
                         [((1024, 16384, 262144), "log"), ((1024, 4096, 16384), "linear")])
def test_x_is_logarithmic_from_two_decades_up(capacities, scale) -> None:
    ax = sweep_figure(sweep(capacities=capacities), "capacity_tokens", "ttft_p50_s", hue="backend").axes[0]
    assert ax.get_xscale() == scale
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in capacities]


def test_col_draws_one_panel_per_value() -> None:
    fig = sweep_figure(sweep(), "capacity_tokens", "token_hit_rate", col="backend")
    assert [ax.get_title() for ax in fig.axes] == ["backend = hashchain", "backend = radix"]
    assert bands(fig) == 2


def test_averaging_over_a_setting_that_varies_is_warned_of() -> None:
    df = pd.concat([sweep(seeds=1), sweep(seeds=1).assign(page_size=1)])
    with pytest.warns(UserWarning, match=r"differ in page_size \(2 values\), not only in seed"):
        sweep_figure(df, "capacity_tokens", "token_hit_rate", hue="backend")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep_figure(df, "capacity_tokens", "token_hit_rate", hue="backend", col="page_size")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x": "capacity", "y": "token_hit_rate"},
         r"x='capacity' is not a column of the sweep table; columns: backend, capacity_tokens, page_size"),
        ({"x": "capacity_tokens", "y": "hit_rate"},
         r"y='hit_rate' is not a column .*; numeric columns: capacity_tokens, page_size, seed, token_hit"),
        ({"x": "capacity_tokens", "y": "backend"}, r"y='backend' is not a numeric column; numeric columns: "),
        ({"x": "capacity_tokens", "y": "token_hit_rate", "hue": "backends"},
         "hue='backends' is not a column"),
        ({"x": "capacity_tokens", "y": "token_hit_rate", "col": "pages"}, r"col='pages' is not a column"),
    ],
)
def test_a_name_that_is_not_a_column_is_an_error_listing_the_columns(tmp_path, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        plot_sweep(sweep(), out=tmp_path / "x.png", **kwargs)
    assert not (tmp_path / "x.png").exists()


def test_bad_tables_and_outputs_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs out= .* when the table is a DataFrame"):
        plot_sweep(sweep(), "capacity_tokens", "token_hit_rate")
    with pytest.raises(ValueError, match="out must end in .png"):
        plot_sweep(sweep(), "capacity_tokens", "token_hit_rate", out=tmp_path / "x.pdf")
    with pytest.raises(FileNotFoundError, match="no sweep table at"):
        plot_sweep(tmp_path / "missing.csv", "capacity_tokens", "token_hit_rate")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ValueError, match="a sweep table is a .csv or .parquet file"):
        plot_sweep(tmp_path / "t.json", "capacity_tokens", "token_hit_rate")
    with pytest.raises(ValueError, match="'ttft_p50_s' has no values"):
        sweep_figure(sweep().assign(ttft_p50_s=float("nan")), "capacity_tokens", "ttft_p50_s")
