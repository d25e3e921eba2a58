"""Table and values: the routing study's full grid (``results/routing_full``, which only
``make routing-full`` writes; committed). Reads its table and writes ``generated/routing_full.tex``
and ``generated/routing_full_values.tex`` (``routFull...`` macros; ``routFullRan`` is ``no`` until
a slice of the grid is complete).

A slice is one (trace, replicas, capacity, load) point of the routers part; it is complete when
every router of the full grid ran on both designs there. Per complete slice and design: each
router's token hit rate with its 95% bootstrap interval over conversations, the routers whose
interval reaches the best router's (not told apart from it), and the pairs of routers whose
intervals do not overlap (the ranking the data supports). Across the complete slices
(``generated/routing_full_rank.tex``): in how many each router is in the best group, its range of
hit rates, and, where the greedy oracle falls out of the best group, its load imbalance there
against the best router's.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pandas as pd
from prefixcache.experiments.figures.fig_routing import DESIGN_WORD, ROUTER_WORD
from prefixcache.experiments.figures.plotting import fmt, write_macros, write_table_tex
from prefixcache.experiments.figures.study_routing import DESIGNS, FULL, ROUTERS, SCALE, configs

SLICE = ["source", "replicas", "capacity_tokens", "load"]


def load_full(results: Path) -> tuple[pd.DataFrame, dict] | None:
    """The committed full grid's table and meta, or None where it never ran."""
    folder = results / FULL
    if not (folder / "summary.csv").exists():
        return None
    return pd.read_csv(folder / "summary.csv"), json.loads((folder / "meta.json").read_text())


def complete_slices(df: pd.DataFrame) -> list[tuple]:
    """The slices of the routers part where every full-grid router ran on every design, in the
    grid's own order (conversation first, then the smallest cluster)."""
    routers = df[df["part"] == "routers"]
    want = {(d, r) for d in DESIGNS for r in SCALE["full"]["routers"]}
    done = [key for key, g in routers.groupby(SLICE)
            if set(zip(g["design"], g["label"], strict=True)) == want]
    return sorted(done, key=lambda k: (k[0] != "mooncake-conversation", k[3] != 0.8, k[1], k[2], k[3]))


def separated_pairs(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(better, worse) for every pair of routers whose 95% intervals do not overlap."""
    out = []
    for a, b in combinations(rows.itertuples(), 2):
        if a.hit_rate_lo > b.hit_rate_hi:
            out.append((a.label, b.label))
        elif b.hit_rate_lo > a.hit_rate_hi:
            out.append((b.label, a.label))
    return out


def slice_rows(routers: pd.DataFrame, key: tuple) -> pd.DataFrame:
    """The routers part's rows of one slice, both designs."""
    mask = pd.Series(True, index=routers.index)
    for column, value in zip(SLICE, key, strict=True):
        mask &= routers[column] == value
    return routers[mask]


def standings(routers: pd.DataFrame, slices: list[tuple]) -> pd.DataFrame:
    """One row per complete slice, design and router: its hit rate and load imbalance (CV of
    active requests over replicas), whether it is in the best group, and the slice's best
    router's imbalance and number of separated pairs."""
    out = []
    for key in slices:
        at = slice_rows(routers, key)
        for design in DESIGNS:
            rows = at[at["design"] == design]
            best, top = set(best_group(rows)), rows.loc[rows["token_hit_rate"].idxmax()]
            pairs = len(separated_pairs(rows))
            out += [dict(slice=key, design=design, label=r.label, hit=r.token_hit_rate, cv=r.imbalance_cv,
                         in_best=r.label in best, top_cv=top["imbalance_cv"], pairs=pairs)
                    for r in rows.itertuples()]
    return pd.DataFrame(out)


def ranking_values(ranks: pd.DataFrame, labels: list[str]) -> dict[str, str]:
    """Per design: the routers in the best group of every slice (in ``labels`` order), the range
    of separated pairs, and the slices where the oracle is out of the best group (its imbalance
    there, and the best router's)."""
    values = {}
    for design in DESIGNS:
        key, d = DESIGN_WORD[design], ranks[ranks["design"] == design]
        count = d.groupby("label")["in_best"].sum()
        always = [label for label in labels if count.get(label) == d["slice"].nunique()]
        values[f"routFull{key}AlwaysBest"] = names(always) if always else "none"
        values[f"routFull{key}PairsMin"] = str(int(d["pairs"].min()))
        values[f"routFull{key}PairsMax"] = str(int(d["pairs"].max()))
        out = d[(d["label"] == "oracle") & ~d["in_best"]]
        values[f"routFull{key}OracleOut"] = str(len(out))
        if len(out):
            values[f"routFull{key}OracleOutCv"] = fmt(float(out["cv"].mean()), 2)
            values[f"routFull{key}OracleOutTopCv"] = fmt(float(out["top_cv"].mean()), 2)
    return values


def ranking_table(paper: Path, ranks: pd.DataFrame, labels: list[str]) -> Path:
    """Per router and design: the slices where it is in the best group, and its hit-rate range."""
    header = ["router"] + [f"{DESIGN_WORD[d].lower()}: {c}" for d in DESIGNS for c in ("best in", "hit \\%")]
    total = ranks["slice"].nunique()
    rows = []
    for label in labels:
        row = [label]
        for design in DESIGNS:
            r = ranks[(ranks["design"] == design) & (ranks["label"] == label)]
            row += [f"{int(r['in_best'].sum())}/{total}", f"{pct(r['hit'].min())}--{pct(r['hit'].max())}"]
        rows.append(row)
    return write_table_tex(
        paper, "routing_full_rank", header, rows, "l" + "r" * (len(header) - 1),
        "Routers across the full grid's complete slices: in how many each is in the best group (its "
        "95\\% interval reaches the best router's), and its lowest and highest token hit \\%.",
        "tab:routing-full-rank",
    )


def best_group(rows: pd.DataFrame) -> list[str]:
    """The best router (highest hit rate) and every router whose interval reaches its interval."""
    best = rows.loc[rows["token_hit_rate"].idxmax()]
    tied = rows[rows["hit_rate_hi"] >= best["hit_rate_lo"]]
    return list(tied.sort_values("token_hit_rate", ascending=False)["label"])


def pct(x: float) -> str:
    return fmt(float(x) * 100)


def names(labels: list[str]) -> str:
    return ", ".join(f"\\texttt{{{label}}}" for label in labels)


def make(results: Path, paper: Path) -> list[Path]:
    loaded = load_full(results)
    total = len(configs("full")[0])
    values: dict[str, str] = {"routFullRan": "no", "routFullStarted": "no", "routFullCellsTotal": str(total)}
    placeholders = []  # the paper inputs the tables only when a slice is complete
    for stem in ("routing_full", "routing_full_rank"):
        placeholder = paper / "generated" / f"{stem}.tex"
        placeholder.parent.mkdir(parents=True, exist_ok=True)
        placeholder.write_text(f"% generated by prefixcache.experiments.figures ({stem}): no slice yet\n")
        placeholders.append(placeholder)
    if loaded is None:
        return [*placeholders, write_macros(paper, "routing_full_values", values)]
    df, meta = loaded
    if meta["cells_total"] != total:
        raise ValueError(f"{FULL}: a table of {meta['cells_total']} cells, the study has {total}")
    cells = df[df["part"] != "global"]
    values.update(
        routFullStarted="yes",
        routFullCellsDone=str(len(cells)),
        routFullComplete="yes" if len(cells) == total else "no",
        routFullCellHours=fmt(float(cells["wall_s"].sum()) / 3600, 1),
        routFullCellMinutes=fmt(float(cells["wall_s"].mean()) / 60, 1),
        routFullExecutor=str(meta["executor"]),
        routFullMachine=str(meta["machine"]).replace("_", "\\_"),  # (x86_64: LaTeX text)
    )
    slices = complete_slices(df)
    values["routFullSlices"] = str(len(slices))
    out = []
    if slices:
        values["routFullRan"] = "yes"
        routers = df[df["part"] == "routers"]
        shown = slices[:2]
        header = ["router"] + [
            f"{s.removeprefix('mooncake-')[:4]}. {n}x{fmt(c / 1e6, 0)}M {fmt(load * 100, 0)}\\% {d[:5]}."
            for s, n, c, load in shown for d in DESIGNS
        ]
        labels = [r[0] for r in ROUTERS if r[0] in SCALE["full"]["routers"]]
        table = {label: [label] for label in labels}
        for k, (source, n, cap, load) in enumerate(shown):
            at = slice_rows(routers, (source, n, cap, load))
            for design in DESIGNS:
                rows = at[at["design"] == design]
                for r in rows.itertuples():
                    cell = f"{pct(r.token_hit_rate)} [{pct(r.hit_rate_lo)}, {pct(r.hit_rate_hi)}]"
                    table[r.label].append(cell)
                if k:
                    continue  # the values describe the first slice; the table shows both
                key = DESIGN_WORD[design]
                pairs = separated_pairs(rows)
                values[f"routFull{key}Best"] = names(best_group(rows))
                values[f"routFull{key}BestHit"] = pct(rows["token_hit_rate"].max())
                values[f"routFull{key}Pairs"] = str(len(pairs))
                values[f"routFull{key}AllPairs"] = str(len(rows) * (len(rows) - 1) // 2)
                for r in rows.itertuples():
                    values[f"routFull{ROUTER_WORD[r.label]}{key}Hit"] = pct(r.token_hit_rate)
            if not k:
                values.update(
                    routFullTrace=source.removeprefix("mooncake-"),
                    routFullReplicas=str(n),
                    routFullCapacityM=fmt(cap / 1e6, 0),
                    routFullLoad=fmt(load * 100, 0),
                    routFullRequests=str(int(at["requests"].iloc[0])),
                )
        out.append(write_table_tex(
            paper, "routing_full", header, [table[label] for label in labels], "l" + "r" * (len(header) - 1),
            "Routers on whole Mooncake traces (the full grid's complete slices: trace, replicas x "
            "tokens a replica, load, design): token hit \\% with its 95\\% bootstrap interval over "
            "conversations.", "tab:routing-full", fit_width=True,
        ))
        ranks = standings(routers, slices)
        values.update(ranking_values(ranks, labels))
        out.append(ranking_table(paper, ranks, labels))
    out.append(write_macros(paper, "routing_full_values", values))
    return out if slices else [*placeholders, *out]
