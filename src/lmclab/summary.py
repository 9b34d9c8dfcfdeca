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


def pair_name(seed_a: int, seed_b: int) -> str:
    """Output paths are built from values: ``seed0-seed1``."""
    return f"seed{seed_a}-seed{seed_b}"


def tables(records: Sequence[dict]) -> dict[str, pd.DataFrame]:
    """``records``: one dict per (pair, method) with keys ``seed_a, seed_b, method, curve``
    (list of rows), ``summary`` (scalars) and ``search`` (search stats).

    Returns ``curves`` (long: one row per pair, method, split, λ) and ``pairs`` (wide: one row
    per pair and method with every scalar)."""
    curves, pairs = [], []
    for rec in records:
        key = {"pair": pair_name(rec["seed_a"], rec["seed_b"]), "seed_a": rec["seed_a"],
               "seed_b": rec["seed_b"], "method": rec["method"]}
        curves += [{**key, **row} for row in rec["curve"]]
        search = {"search_seconds": float(rec["search"].get("seconds", 0.0)),
                  "search_sweeps": int(rec["search"].get("sweeps", 0))}
        pairs.append({**key, **rec["summary"], **search})
    return {"curves": pd.DataFrame(curves), "pairs": pd.DataFrame(pairs)}


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


THREE_KEYS = ("test_loss_barrier_max", "test_loss_barrier_mid", "test_acc_barrier_max", "test_acc_barrier_mid",
              "train_loss_barrier_max", "train_acc_barrier_max", "l2")


def triple_name(seeds: Sequence[int]) -> str:
    return "-".join(f"seed{s}" for s in seeds)


def three_tables(records: Sequence[dict]) -> dict[str, pd.DataFrame]:
    """``records``: one per (triple, method) with ``seeds``, ``method``, ``edges`` (rows),
    ``curves`` and ``landscape`` (rows). Returns ``three_edges``, ``three_curves``, ``landscape``."""
    out: dict[str, list] = {"three_edges": [], "three_curves": [], "landscape": []}
    for rec in records:
        key = {"triple": triple_name(rec["seeds"]), "method": rec["method"]}
        out["three_edges"] += [{**key, **row} for row in rec["edges"]]
        out["three_curves"] += [{**key, **row} for row in rec["curves"]]
        out["landscape"] += [{**key, **row} for row in rec["landscape"]]
    return {name: pd.DataFrame(rows) for name, rows in out.items()}


def _mean_std(values: pd.Series) -> dict[str, float]:
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {"mean": round(float(values.mean()), 6), "std": round(std, 6)}


def three_summary(edges: pd.DataFrame, method_order: Sequence[str]) -> dict:
    """``{method: {edge: {metric: {mean, std}}}}`` over triples (Table 3 reports edge b-c)."""
    return {m: {edge: {k: _mean_std(rows[k].astype(float)) for k in THREE_KEYS}
                for edge, rows in edges[edges["method"] == m].groupby("edge")}
            for m in method_order}


def merge_many_summary(evaluation: pd.DataFrame, trace: dict) -> dict:
    """Test accuracy/loss of the MergeMany average, naive average, ensemble and mean member."""
    test = evaluation[evaluation["split"] == "test"].set_index("model")
    members = test[test.index.str.startswith("seed")]
    out = {name: {"test_acc": round(float(test.loc[name, "acc"]), 6), "test_loss": round(float(test.loc[name, "loss"]), 6)}
           for name in ("MergeMany average", "naive average", "ensemble")}
    out["members mean"] = {"test_acc": round(float(members["acc"].mean()), 6),
                           "test_loss": round(float(members["loss"].mean()), 6)}
    out["iterations"] = trace["iterations"]
    return out
