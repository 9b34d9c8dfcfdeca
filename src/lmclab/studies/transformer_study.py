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
    """The fraction of ``group``'s units that ``perm`` leaves in place (1 for the identity)."""
    p = perm[group]
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


def markdown_table(table: pd.DataFrame, label: Callable[[str], str]) -> str:
    """The table in markdown, methods named by ``label(method)``."""
    names = (
        "B½",
        "B½ REPAIR",
        "B max",
        "B max REPAIR",
        "acc B½",
        "probe B½",
        "kNN B½",
        "L2 −%",
        "P_res id",
        "search s",
    )
    lines = ["| run | method | " + " | ".join(names) + " |", "|" + "---|" * (2 + len(names))]
    for _, r in table.iterrows():
        cells = [
            _cell(r, "B_mid", 3),
            _cell(r, "B_mid_repair", 3),
            _cell(r, "B_max", 3),
            _cell(r, "B_max_repair", 3),
            _cell(r, "acc_mid", 1),
            _cell(r, "probe_mid", 1),
            _cell(r, "knn_mid", 1),
            _cell(r, "l2_reduction", 1),
            _cell(r, "p_res_identity", 2),
            _cell(r, "search_s", 1),
        ]
        lines.append(f"| {r['run']} | {label(r['method'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
