"""The three-model study: how the barrier between π_b(θb) and π_c(θc) (the pair never matched,
the paper's Table 3) and the singular-vector alignment R_0.3 of every pair (its Figure 5) change
with one setting at a time.

Input: the long table of every study point's edges, one row per (point, triple, method, edge) with
the columns of :func:`lmclab.analysis.three_models.three_model_barriers` plus ``point``, ``axis``
and ``value``, and ``stalled`` (:func:`edge_stalled`). :func:`study_table` gives one row per point
and method; :func:`paired_test` compares two methods' b–c barriers over the same triples (a paired
two-sided t-test). A (point, method) whose search stalled in any triple (its hard permutation never
left the start: no alignment, :func:`lmclab.search.wm_sinkhorn.stalled`) measured the start, not the
method; a paper's-WM row whose a–b ⟨θa, π(θb)⟩ is below ``CONVERGED`` of coordinate-descent WM's on
the same pairs (both maximise it) measured a search stopped far from its optimum. Either leaves its
setting without a verdict and its row out of the sign test and the correlations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from lmclab.search.wm_sinkhorn import stalled

CONVERGED = 0.5  # Sinkhorn WM's a–b ⟨θa, π(θb)⟩ over coordinate descent's below this: unconverged
BC = ("test_loss_barrier_mid", "test_loss_barrier_max", "test_acc_barrier_max", "train_loss_barrier_max")
PAPER_WM, PAPER_STE = "wm_sinkhorn", "ste_sinkhorn"


SEARCHED = {"a-b": "b", "a-c": "c", "b-c": "bc"}  # the searches (of θb, θc) behind each edge


def edge_stalled(edge: str, search: Mapping[str, Mapping]) -> bool:
    """Whether a search behind ``edge`` stalled (a–b: θb's, a–c: θc's, b–c: either), from the
    connect stage's ``search`` stats (``"b"``, ``"c"`` → stats with a per-epoch ``curve``)."""
    return any(stalled(search.get(k, {}).get("curve", [])) for k in SEARCHED[edge])


def search_objective(stats: Mapping) -> float | None:
    """⟨θa, π(θb)⟩ of the permutation a search returned, where its stats record it: coordinate-descent
    WM's last sweep, Sinkhorn WM's returned epoch (``best_epoch``); None for the other methods."""
    if isinstance(stats.get("objective"), list) and stats["objective"]:
        return float(stats["objective"][-1])
    rows = [r for r in stats.get("curve", []) if "objective" in r and r.get("epoch") == stats.get("best_epoch")]
    return float(rows[0]["objective"]) if rows else None


def objective_ratio(edges: pd.DataFrame, method: str = PAPER_WM, reference: str = "wm") -> float | None:
    """Mean over triples of ``method``'s a–b ⟨θa, π(θb)⟩ over ``reference``'s (the ``objective``
    column); None where either is not recorded."""
    if "objective" not in edges:
        return None
    ab = edges[edges["edge"] == "a-b"].pivot_table(index="triple", columns="method", values="objective")
    if not {method, reference} <= set(ab.columns):
        return None
    both = ab[[method, reference]].dropna()
    return float((both[method] / both[reference]).mean()) if len(both) else None


def _stalled_count(edges: pd.DataFrame) -> int:
    """Stalled searches among ``edges`` (those of a–b and a–c: one search each; 0 without the column)."""
    if "stalled" not in edges:
        return 0
    return int(edges[edges["edge"].isin(("a-b", "a-c"))]["stalled"].fillna(False).astype(bool).sum())


def paired_test(edges: pd.DataFrame, column: str, first: str = PAPER_WM, second: str = PAPER_STE) -> dict:
    """``first`` vs ``second`` on the b–c ``column`` over the triples both have: the mean paired
    difference (first − second), the two-sided paired t-test's p (None with fewer than 2 triples or
    no spread) and whether ``first`` is below (above) ``second`` in every triple."""
    from scipy import stats

    bc = edges[edges["edge"] == "b-c"].pivot_table(index="triple", columns="method", values=column)
    both = bc[[first, second]].dropna() if {first, second} <= set(bc.columns) else pd.DataFrame()
    if both.empty:
        return {"n": 0, "diff": None, "p": None, "below_in_every": None, "above_in_every": None}
    diff = both[first] - both[second]
    p = float(stats.ttest_rel(both[first], both[second]).pvalue) if len(diff) > 1 and diff.std() > 0 else None
    below, above = bool((diff < 0).all()), bool((diff > 0).all())
    return {"n": len(diff), "diff": float(diff.mean()), "p": p, "below_in_every": below, "above_in_every": above}


def study_table(edges: pd.DataFrame) -> pd.DataFrame:
    """One row per point and method: mean and std over triples of the b–c barriers (``BC``) and of
    R_0.3 on each edge, and for the paper's WM the paired test against the paper's STE on each
    b–c barrier (``p_<column>``; ``below_<column>``, ``above_<column>``: in every triple)."""
    rows = []
    for (point, method), group in edges.groupby(["point", "method"], sort=False):
        row: dict = {
            "point": point,
            "axis": group["axis"].iloc[0],
            "value": group["value"].iloc[0],
            "method": method,
            "n_triples": group["triple"].nunique(),
            "stalled": _stalled_count(group),
        }
        for edge in ("a-b", "a-c", "b-c"):
            on = group[group["edge"] == edge]
            columns = (*BC, "R_0.3") if edge == "b-c" else ("R_0.3", *(["objective"] if "objective" in on else []))
            for column in columns:
                key = column if edge == "b-c" else f"{column}_{edge}"
                row[f"{key}_mean"] = float(on[column].mean())
                row[f"{key}_std"] = float(on[column].std(ddof=1)) if len(on) > 1 else 0.0
        if method == PAPER_WM:
            at = edges[edges["point"] == point]
            row["paired_stalled"] = _stalled_count(at[at["method"].isin((PAPER_WM, PAPER_STE))])
            row["objective_ratio"] = objective_ratio(at)
            for column in BC:
                test = paired_test(at, column)
                row[f"p_{column}"], row[f"below_{column}"] = test["p"], test["below_in_every"]
                row[f"above_{column}"] = test["above_in_every"]
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(row: pd.Series, key: str, digits: int) -> str:
    return f"{row[key + '_mean']:.{digits}f} ± {row[key + '_std']:.{digits}f}"


def study_markdown(table: pd.DataFrame, *, defaults: Mapping[str, str], rebuild: str = "") -> str:
    """The study's page: the table (one row per point and method) and, per point, whether the
    paper's ordering (WM's b–c barriers below STE's in every triple) holds; ``rebuild`` says how
    the page was made."""
    lines = [
        "# Three-model study (Table 3 and Figure 5 on the digits)",
        "",
        "θb and θc are each aligned to θa; b–c is the pair never matched. Mean ± std over triples; "
        "one setting changed from the default run (" + ", ".join(f"{k} {v}" for k, v in defaults.items()) + ").",
        "",
        *([rebuild, ""] if rebuild else []),
        "![three-model study](three_study.png)",
        "",
    ]
    return "\n".join(lines + _table_lines(table) + _ordering_lines(table) + _explanation_lines(table))


def _setting(row: pd.Series) -> str:
    return "default" if row["axis"] == "default" else f"{row['axis']} {row['value']}"


def _table_lines(table: pd.DataFrame) -> list[str]:
    """One row per point and method: the b–c barriers, R_0.3 of every edge, the a–b objective."""
    lines = [
        "| setting | method | triples | loss b–c ½ | loss b–c | acc b–c | train loss b–c "
        "| R_0.3 a–b | R_0.3 a–c | R_0.3 b–c | ⟨θa, π(θb)⟩ a–b |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        cells = [_cell(r, c, 3 if "loss" in c else 2) for c in BC]
        cells += [_cell(r, f"R_0.3_{e}", 3) for e in ("a-b", "a-c")] + [_cell(r, "R_0.3", 3)]
        known = r.get("objective_a-b_mean")
        cells.append("—" if known is None or known != known else _cell(r, "objective_a-b", 1))
        lines.append(f"| {_setting(r)} | {_method_cell(r)} | {r['n_triples']} | " + " | ".join(cells) + " |")
    return lines


def _ordering_lines(table: pd.DataFrame) -> list[str]:
    """Per point, the paper's ordering on each b–c barrier (:func:`_verdict`), and how to read a cell."""
    lines = ["", "## Does the paper's ordering hold? (WM Sinkhorn's b–c barrier below STE Sinkhorn's)", ""]
    lines += ["| setting | " + " | ".join(BC) + " |", "|---|" + "---|" * len(BC)]
    for _, r in table[table["method"] == PAPER_WM].iterrows():
        lines.append(f"| {_setting(r)} | " + " | ".join(_verdict(r, c) for c in BC) + " |")
    return lines + [
        "",
        "Cell: yes = WM below STE in every triple, reversed = STE below WM in every triple, mixed = "
        "neither; with the paired two-sided t-test's p over triples. A search that stalled (its hard "
        "permutation never left the start: no alignment, so the row measures the start, not the method), "
        f"or a Sinkhorn WM whose a–b ⟨θa, π(θb)⟩ is below {CONVERGED:g} of coordinate-descent WM's on the same "
        "pairs (unconverged), leaves its setting without a verdict and out of the statistics below.",
        "",
    ]


def _explanation_lines(table: pd.DataFrame) -> list[str]:
    """The paper's explanation measured (:func:`r_explains_ordering`, :func:`r_tracks_barrier`), given
    three rows of the paper's methods at least."""
    if len(table[table["method"].isin((PAPER_WM, PAPER_STE))]) < 3:
        return []
    track, paired = r_tracks_barrier(table), r_explains_ordering(table)
    return [
        "The paper's explanation (better-aligned dominant singular directions, a lower barrier), "
        f"measured: within a setting, WM − STE in b–c R_0.3 and in the b–c test loss barrier at ½ "
        f"have opposite signs in {paired['opposite']} of {paired['n']} settings (two-sided sign test "
        f"p {paired['p_sign']:.2g}; Spearman ρ of the two differences {_num(paired['rho'])}). Pooled "
        f"over the {track['n']} (setting, method) rows, b–c R_0.3 against the barrier: ρ = "
        f"{track['rho']:.2f} (p {track['p']:.2g}); settings differ in the barrier's scale.",
        "",
    ]


def _method_cell(row: pd.Series) -> str:
    n = _count(row.get("stalled"))
    return row["method"] + (f" (**stalled** in {n} of {2 * row['n_triples']} searches)" if n else "")


def _num(value: float | None) -> str:
    return "—" if value is None or value != value else f"{value:.2f}"


def ordering(row: pd.Series, column: str = "test_loss_barrier_mid") -> str | None:
    """The paper's ordering at one point (the paper's WM row): ``holds`` (WM's b–c barrier below
    STE's in every triple), ``reversed`` (above in every triple), ``mixed``; ``stalled`` when a
    search of either method stalled there, ``unconverged`` when WM's objective ratio is below
    ``CONVERGED``; None without a test."""
    below, above = row.get(f"below_{column}"), row.get(f"above_{column}")
    if below is None or below != below:
        return None
    if _count(row.get("paired_stalled")):
        return "stalled"
    if _unconverged(row):
        return "unconverged"
    return "holds" if below else ("reversed" if above else "mixed")


def _unconverged(row: pd.Series) -> bool:
    ratio = row.get("objective_ratio")
    return ratio is not None and ratio == ratio and ratio < CONVERGED


def _count(value) -> int:
    """A stalled count read from a table row (0 when missing or NaN: a table from before the column)."""
    return 0 if value is None or value != value else int(value)


def _verdict(row: pd.Series, column: str) -> str:
    found, p = ordering(row, column), row[f"p_{column}"]
    if found is None:
        return "—"
    if found == "stalled":
        return "— (a search stalled)"
    if found == "unconverged":
        return f"— (WM unconverged: ⟨θa, π(θb)⟩ {row['objective_ratio']:.2f} of coordinate descent's)"
    word = {"holds": "yes", "reversed": "reversed", "mixed": "mixed"}[found]
    return word + (f" (p {p:.3g})" if p is not None and p == p else "")


def study_summary(table: pd.DataFrame, column: str = "test_loss_barrier_mid") -> dict:
    """Per setting, the paper's ordering on ``column`` (see :func:`ordering`) with both methods'
    mean b–c barriers; and R's relation to the barrier (:func:`r_tracks_barrier`)."""
    means = table.set_index(["point", "method"])[f"{column}_mean"]
    settings = []
    for _, r in table[table["method"] == PAPER_WM].iterrows():
        settings.append(
            {
                "setting": _setting(r),
                "ordering": ordering(r, column),
                "WM": float(means[(r["point"], PAPER_WM)]),
                "STE": float(means.get((r["point"], PAPER_STE), float("nan"))),
                "p": r[f"p_{column}"],
            }
        )
    return {
        "column": column,
        "settings": settings,
        "r_tracks_barrier": r_tracks_barrier(table),
        "r_explains_ordering": r_explains_ordering(table),
    }


def r_tracks_barrier(table: pd.DataFrame, methods: Sequence[str] = (PAPER_WM, PAPER_STE)) -> dict:
    """Spearman ρ across the study's points and methods between R_0.3 of b–c and the b–c test
    midpoint barrier (the paper: better-aligned dominant directions, lower barrier → ρ < 0); rows
    with a stalled or unconverged search are left out."""
    from scipy import stats

    rows = _searched(table[table["method"].isin(methods)])
    rho, p = stats.spearmanr(rows["R_0.3_mean"], rows["test_loss_barrier_mid_mean"])
    return {"rho": float(rho), "p": float(p), "n": len(rows)}


def failed(row: pd.Series) -> bool:
    """Whether a table row's searches stalled or (the paper's WM) did not converge: it measured them,
    not the method."""
    return _count(row.get("stalled")) > 0 or _unconverged(row)


def _searched(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``table`` that did not fail (:func:`failed`)."""
    return table[[not failed(r) for _, r in table.iterrows()]]


def r_explains_ordering(table: pd.DataFrame, first: str = PAPER_WM, second: str = PAPER_STE) -> dict:
    """Within each setting, ``first`` − ``second`` in b–c R_0.3 (dR) against the same difference in
    the b–c test midpoint barrier (dB): the paper's explanation predicts opposite signs (the method
    that aligns b and c's dominant singular directions better has the lower barrier). Returns the
    number of settings with opposite signs, the two-sided sign test's p (binomial, ½) and Spearman's
    ρ of dR against dB; settings where either method's search stalled or did not converge are left out."""
    from scipy import stats

    at = _searched(table).set_index(["point", "method"])
    points = [p for p in dict.fromkeys(table["point"]) if (p, first) in at.index and (p, second) in at.index]
    d_r = [at.loc[(p, first), "R_0.3_mean"] - at.loc[(p, second), "R_0.3_mean"] for p in points]
    d_b = [
        at.loc[(p, first), "test_loss_barrier_mid_mean"] - at.loc[(p, second), "test_loss_barrier_mid_mean"]
        for p in points
    ]
    opposite = sum(r * b < 0 for r, b in zip(d_r, d_b, strict=True))
    p_sign = float(stats.binomtest(opposite, len(points), 0.5).pvalue) if points else None
    rho = float(stats.spearmanr(d_r, d_b)[0]) if len(points) > 2 else None
    return {"n": len(points), "opposite": opposite, "p_sign": p_sign, "rho": rho}
