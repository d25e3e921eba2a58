"""A picture of a sweep: one measure against one setting, from the table ``prefixcache sweep``
writes (one row per cell: its config, then its summary).

A numeric ``x`` (capacity_tokens, page_size, arrival_scale) is a line with a marker per cell,
on a log axis when it spans two decades or more; any other ``x`` (backend, scheduler) is a bar
per value. ``hue`` splits lines or bars, ``col`` draws one panel per value. Where cells repeat
(the same x, hue and col over several seeds) the line or bar is their mean with a 95%
bootstrap confidence interval, seeded so the file is the same on every run; where they do not,
no interval is drawn. Rows that are averaged together but differ in a setting of the grid
(say page_size, left out of x, hue and col) draw a warning: the interval would then mix
settings, not seeds.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from prefixcache.experiments.figures.plotting import PALETTE  # noqa: E402

BOOTSTRAP_SEED = 0


def plot_sweep(
    table: str | Path | pd.DataFrame,
    x: str,
    y: str,
    hue: str | None = None,
    out: str | Path | None = None,
    col: str | None = None,
) -> Path:
    """Draw ``y`` against ``x`` from a sweep table (a .csv or .parquet path, or a DataFrame)
    and save it as a PNG at ``out`` (default: beside the table, ``<table>.<y>.png``); returns
    the path. ValueError naming the valid columns when x, y (numeric), hue or col is not one."""
    if out is None:
        if isinstance(table, pd.DataFrame):
            raise ValueError("plot_sweep needs out= (a .png path) when the table is a DataFrame")
        out = Path(table).with_suffix(f".{y}.png")
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plot_sweep writes PNG; out must end in .png, got {str(out)!r}")
    fig = sweep_figure(table, x, y, hue=hue, col=col)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Written whole or not at all: a half-written figure is never left under its name.
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
        os.close(fd)
        try:
            fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    finally:
        plt.close(fig)
    return out


def sweep_figure(
    table: str | Path | pd.DataFrame, x: str, y: str, hue: str | None = None, col: str | None = None
) -> Figure:
    """The figure ``plot_sweep`` saves, one Axes per ``col`` value (the caller closes it)."""
    df = read_sweep_table(table)
    _check_columns(df, x, y, hue, col)
    df = df[df[y].notna()]
    if df.empty:
        raise ValueError(f"column {y!r} has no values to plot")
    keys = [c for c in (x, hue, col) if c is not None]
    repeats = bool(df.groupby(keys, dropna=False).size().max() > 1)
    _warn_if_settings_are_mixed(df, keys)
    numeric_x = _is_numeric(df[x])
    data = df.copy()
    hue_order = None
    if hue is not None:  # categories, in the column's own order (2 before 16), never a colour scale
        hue_order = [str(v) for v in _ordered(data[hue])]
        data[hue] = data[hue].map(str)
    palette = {h: PALETTE[h] for h in hue_order} if hue_order and set(hue_order) <= set(PALETTE) else None
    col_order = _ordered(data[col]) if col is not None else None
    common = dict(data=data, x=x, y=y, hue=hue, hue_order=hue_order, palette=palette, col=col,
                  col_order=col_order, errorbar=("ci", 95) if repeats else None, seed=BOOTSTRAP_SEED,
                  height=3.0, aspect=1.3)
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        if numeric_x:
            grid = sns.relplot(kind="line", marker="o", **common)
        else:
            grid = sns.catplot(kind="bar", order=_ordered(data[x]), **common)
        grid.set_axis_labels(x, y)
        if numeric_x:
            _numeric_x_axis(grid.axes.flat, data[x])
    return grid.figure


def read_sweep_table(table: str | Path | pd.DataFrame) -> pd.DataFrame:
    """A sweep table from a .csv or .parquet file (a DataFrame is taken as it is)."""
    if isinstance(table, pd.DataFrame):
        return table
    path = Path(table)
    if path.is_dir() or not path.exists():
        raise FileNotFoundError(f"no sweep table at {path} (a .csv or .parquet written by prefixcache sweep)")
    readers = {".csv": pd.read_csv, ".parquet": pd.read_parquet}
    if path.suffix not in readers:
        raise ValueError(f"a sweep table is a .csv or .parquet file, got {path}")
    return readers[path.suffix](path)


def _check_columns(df: pd.DataFrame, x: str, y: str, hue: str | None, col: str | None) -> None:
    columns = ", ".join(map(str, df.columns))
    for role, name in (("x", x), ("hue", hue), ("col", col)):
        if name is not None and name not in df.columns:
            raise ValueError(f"{role}={name!r} is not a column of the sweep table; columns: {columns}")
    numeric = [c for c in df.columns if _is_numeric(df[c])]
    if y not in numeric:
        what = "is not a column of the sweep table" if y not in df.columns else "is not a numeric column"
        raise ValueError(f"y={y!r} {what}; numeric columns: {', '.join(map(str, numeric))}")


def grid_columns() -> list[str]:
    """The settings of a sweep cell, as table columns: the CLI's config keys but the seed
    (workload parameters are spread out as ``param_*``)."""
    from prefixcache.experiments.run_config import DEFAULTS

    return [k for k in DEFAULTS if k not in ("seed", "params")]


def _warn_if_settings_are_mixed(df: pd.DataFrame, keys: list[str]) -> None:
    """Rows averaged into one point must agree on every setting but the seed."""
    grid = grid_columns()
    settings = [c for c in df.columns if (c in grid or str(c).startswith("param_")) and c not in keys]
    if not settings:
        return
    varying = df.groupby(keys, dropna=False)[settings].nunique(dropna=False).max()
    mixed = [f"{c} ({int(n)} values)" for c, n in varying.items() if n > 1]
    if mixed:
        warnings.warn(
            f"each point averages cells that differ in {', '.join(mixed)}, not only in seed: "
            "make it x, hue or col, or filter the table first",
            stacklevel=3,
        )


def _numeric_x_axis(axes: object, values: pd.Series) -> None:
    """Log scale from two decades up (all x > 0); one tick per cell value when they are few."""
    ticks = sorted(values.dropna().unique())
    low, high = ticks[0], ticks[-1]
    log = low > 0 and high / low >= 100
    for ax in axes:  # type: ignore[attr-defined]
        if log:
            ax.set_xscale("log")
        if len(ticks) <= 12:
            ax.set_xticks(ticks, [_tick_label(v) for v in ticks])
            ax.minorticks_off()


def _tick_label(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _is_numeric(s: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)


def _ordered(s: pd.Series) -> list:
    """A column's values: sorted when numeric, else in order of first appearance (grid order)."""
    values = list(pd.unique(s.dropna()))
    return sorted(values) if _is_numeric(s) else values
