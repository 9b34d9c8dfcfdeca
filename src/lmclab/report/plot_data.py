"""DVC plot data: the curves as small CSV files ``dvc plots show`` / ``dvc plots diff`` read.

DVC cannot read Parquet, so the plot stage writes these from the saved tables (never recomputing):
long tables with one row per point and the series' key columns (``pair``, ``method``, ``seed``),
which the custom templates in ``.dvc/plots/`` colour and facet by. Accuracies are in %.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from lmclab.core.atomic import write_table

# file stem -> the columns it holds (the x and y fields named in dvc.yaml's ``plots:``)
COLUMNS = {
    "interpolation": ("pair", "method", "lam", "test_loss", "test_acc", "train_loss", "train_acc"),
    "training": ("seed", "epoch", "train_loss", "test_loss", "train_acc", "test_acc"),
    "search_curves": ("pair", "method", "epoch", "l2", "test_loss", "test_acc"),
    "wm_objective": ("pair", "method", "sweep", "objective"),
}


def interpolation_points(curves: pd.DataFrame) -> pd.DataFrame:
    """λ → loss and accuracy per pair and method, one column per split. For BatchNorm nets the
    repaired curve (what the barriers report) is kept."""
    if "repair" in curves and curves["repair"].any():
        curves = curves[curves["repair"]]
    wide = curves.pivot_table(
        index=["pair", "method", "lam"], columns="split", values=["loss", "acc"], sort=False
    ).reset_index()
    wide.columns = [f"{split}_{q}" if split else q for q, split in wide.columns]
    for split in ("train", "test"):
        if f"{split}_acc" in wide:
            wide[f"{split}_acc"] *= 100
    return wide.reindex(columns=[c for c in COLUMNS["interpolation"] if c in wide])


def training_points(history: pd.DataFrame) -> pd.DataFrame:
    """Per seed and epoch: train (running mean) and test loss and accuracy."""
    out = history.assign(
        seed=history["seed"].map(lambda s: f"seed{s}"),
        train_acc=100 * history["train_acc"],
        test_acc=100 * history["test_acc"],
    )
    return out.reindex(columns=COLUMNS["training"])


def search_points(search_curves: pd.DataFrame) -> pd.DataFrame:
    """Iterative searches (STE, Sinkhorn): L2 and merged test loss/accuracy per search epoch."""
    return search_curves.assign(test_acc=100 * search_curves["test_acc"]).reindex(columns=COLUMNS["search_curves"])


def plot_tables(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The CSV tables from the summarize tables ``curves``, ``history``, ``search_curves`` and
    ``search_objective`` (WM's ⟨θa, π(θb)⟩ after each sweep)."""
    return {
        "interpolation": interpolation_points(tables["curves"]),
        "training": training_points(tables["history"]),
        "search_curves": search_points(tables["search_curves"]),
        "wm_objective": tables["search_objective"].reindex(columns=COLUMNS["wm_objective"]),
    }


def write_plot_tables(tables: Mapping[str, pd.DataFrame], folder: Path) -> list[Path]:
    """One ``<name>.csv`` per table, each written atomically (``lmclab.core.atomic``)."""
    paths = []
    for name, frame in tables.items():
        write_table(folder / f"{name}.csv", frame, float_format="%.6g")
        paths.append(folder / f"{name}.csv")
    return paths
