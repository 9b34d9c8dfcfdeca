"""The transformer study's table (docs "Transformers and MAE"): supervised ViTs against ViTs
pretrained as masked autoencoders, every method, with and without REPAIR, mean ± std over pairs.

Inputs are the ``pairs`` tables of finished runs (``data/tables/pairs.parquet``: one row per pair and
method, every scalar of the measure stage's ``summary.json``) with a column ``p_res_identity`` added
(:func:`identity_fraction` of each pair's permutation). The loss of a supervised run is the test
cross-entropy, of an MAE run the test reconstruction loss (on fixed masks): the two barrier columns
are not on one scale, each is compared within its own run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd
from torch import Tensor

# column of the table -> (pairs column, meaning); REPAIR's barriers are the summary's, plain ones norepair_*
COLUMNS: dict[str, tuple[str, str]] = {
    "B_mid": ("norepair_test_loss_barrier_mid", "test loss barrier at λ = ½"),
    "B_mid_T": (
        "test_loss_barrier_mid_calibrated",
        "test loss barrier at λ = ½, each model's softmax temperature calibrated (Ito et al. 2025; supervised)",
    ),
    "B_mid_C": (
        "test_loss_barrier_mid_circuits",
        "test loss barrier at λ = ½ in circuit space: each head's QKᵀ and OV circuits interpolated (Theus et al. 2025)",
    ),
    "B_max": ("norepair_test_loss_barrier_max", "test loss barrier, max over λ"),
    "B_mid_repair": ("test_loss_barrier_mid", "the same with REPAIR"),
    "B_max_repair": ("test_loss_barrier_max", "the same with REPAIR"),
    "acc_mid": ("norepair_test_acc_barrier_mid", "test accuracy barrier at λ = ½ (points; supervised)"),
    "probe_mid": ("probe_acc_barrier_mid", "linear-probe accuracy barrier at λ = ½ (points; MAE)"),
    "knn_mid": ("knn_acc_barrier_mid", "kNN accuracy barrier at λ = ½ (points; MAE)"),
    "l2_reduction": ("l2_reduction_pct", "‖θa − θb‖ reduction by the alignment (%)"),
    "p_res_identity": ("p_res_identity", "fraction of P_res left at the identity"),
    "search_s": ("search_seconds", "seconds of the search"),
}


def identity_fraction(perm: Mapping[str, Tensor], group: str) -> float:
    """The fraction of ``group``'s units that ``perm`` leaves in place (1 for the identity); NaN when ``perm``
    has no such group or maps it by an orthogonal matrix (a run with ``permute.symmetry: orthogonal``)."""
    p = perm.get(group)
    if p is None or p.ndim != 1:
        return float("nan")
    return float((p == p.new_tensor(range(len(p)))).double().mean())


def study_table(runs: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (run, method) in the order given: ``<column>`` and ``<column>_std`` (over pairs) of
    every :data:`COLUMNS` entry the run has (NaN otherwise) and ``pairs``."""
    rows = []
    for run, pairs in runs.items():
        for method, sub in pairs.groupby("method", sort=False):
            row = {"run": run, "method": method, "pairs": len(sub)}
            for name, (source, _) in COLUMNS.items():
                values = sub[source] if source in sub else pd.Series([float("nan")] * len(sub))
                row[name], row[f"{name}_std"] = float(values.mean()), float(values.std(ddof=1))
            rows.append(row)
    return pd.DataFrame(rows)


def _cell(row: pd.Series, name: str, digits: int) -> str:
    mean, std = row[name], row[f"{name}_std"]
    if pd.isna(mean):
        return "—"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if pd.notna(std) else f"{mean:.{digits}f}"


# the table's columns: (name, title, digits); an OPTIONAL one only when some run measured it
SHOWN = (
    ("B_mid", "B½", 3),
    ("B_mid_repair", "B½ REPAIR", 3),
    ("B_mid_T", "B½ T-calibrated", 3),
    ("B_mid_C", "B½ circuits", 3),
    ("B_max", "B max", 3),
    ("B_max_repair", "B max REPAIR", 3),
    ("acc_mid", "acc B½", 1),
    ("probe_mid", "probe B½", 1),
    ("knn_mid", "kNN B½", 1),
    ("l2_reduction", "L2 −%", 1),
    ("p_res_identity", "P_res id", 2),
    ("search_s", "search s", 1),
)
OPTIONAL = {"B_mid_T", "B_mid_C"}  # measure.calibrate_temperature, measure.circuits


def shown_columns(table: pd.DataFrame) -> list[str]:
    """The names of :data:`SHOWN` the page shows for ``table``: every one but an optional one no run measured."""
    return [n for n, _, _ in SHOWN if n not in OPTIONAL or (n in table and table[n].notna().any())]


def markdown_table(table: pd.DataFrame, label: Callable[[str], str]) -> str:
    """The table in markdown, methods named by ``label(method)``."""
    shown = [(n, title, digits) for n, title, digits in SHOWN if n in shown_columns(table)]
    lines = ["| run | method | " + " | ".join(t for _, t, _ in shown) + " |", "|" + "---|" * (2 + len(shown))]
    for _, r in table.iterrows():
        cells = [_cell(r, name, digits) for name, _, digits in shown]
        lines.append(f"| {r['run']} | {label(r['method'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
