"""Collect per-(pair, method) measurements into tables and the ``dvc metrics`` summary."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

# what metrics/summary.json reports per method (mean ± std over pairs)
SUMMARY_KEYS = (
    "train_loss_barrier_mid", "test_loss_barrier_mid", "train_loss_barrier_max", "test_loss_barrier_max",
    "train_acc_barrier_mid", "test_acc_barrier_mid", "train_acc_barrier_max", "test_acc_barrier_max",
    "l2_before", "l2_after", "l2_reduction_pct", "search_seconds",
)


# long table of the iterative searches' per-epoch learning curves (paper Figure 6)
SEARCH_CURVE_COLUMNS = ("pair", "method", "epoch", "l2", "test_loss", "test_acc")


def pair_name(seed_a: int, seed_b: int) -> str:
    """Output paths are built from values: ``seed0-seed1``."""
    return f"seed{seed_a}-seed{seed_b}"


def tables(records: Sequence[dict]) -> dict[str, pd.DataFrame]:
    """``records``: one dict per (pair, method) with keys ``seed_a, seed_b, method, curve``
    (list of rows), ``summary`` (scalars) and ``search`` (search stats).

    Returns ``curves`` (long: one row per pair, method, split, λ), ``pairs`` (wide: one row
    per pair and method with every scalar) and ``search_curves`` (long: one row per pair,
    method and search epoch, from the ``curve`` the iterative searches record)."""
    curves, pairs = [], []
    for rec in records:
        key = {"pair": pair_name(rec["seed_a"], rec["seed_b"]), "seed_a": rec["seed_a"],
               "seed_b": rec["seed_b"], "method": rec["method"]}
        curves += [{**key, **row} for row in rec["curve"]]
        search = {"search_seconds": float(rec["search"].get("seconds", 0.0)),
                  "search_sweeps": int(rec["search"].get("sweeps", 0))}
        pairs.append({**key, **rec["summary"], **search})
    return {"curves": pd.DataFrame(curves), "pairs": pd.DataFrame(pairs),
            "search_curves": search_curves(records)}


def search_curves(records: Sequence[dict]) -> pd.DataFrame:
    """Per-epoch ``l2`` (‖θa − π(θb)‖ with the current hard permutation) and the merged
    midpoint's ``test_loss``/``test_acc``; empty (with these columns) when no search records any."""
    rows = [{"pair": pair_name(rec["seed_a"], rec["seed_b"]), "method": rec["method"],
             **{k: row.get(k) for k in SEARCH_CURVE_COLUMNS[2:]}}
            for rec in records for row in rec["search"].get("curve", [])]
    frame = pd.DataFrame(rows, columns=list(SEARCH_CURVE_COLUMNS))
    return frame.astype({"epoch": "int64", "l2": "float64", "test_loss": "float64", "test_acc": "float64"})


def metrics_summary(pairs: pd.DataFrame, method_order: Sequence[str]) -> dict:
    """``{method: {metric: {mean, std}, n_pairs}}``; std is the sample std (0 for one pair)."""
    out: dict = {}
    for method in method_order:
        rows = pairs[pairs["method"] == method]
        entry: dict = {"n_pairs": int(len(rows))}
        for key in SUMMARY_KEYS:
            values = rows[key].astype(float)
            std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            entry[key] = {"mean": round(float(values.mean()), 6), "std": round(std, 6)}
        out[method] = entry
    return out
