"""Collect per-(pair, method) measurements into tables and the ``dvc metrics`` summary."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from scipy import stats

from lmclab.alignment import output_scale

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
    curves, pairs, taylor, bounds = [], [], [], []
    for rec in records:
        key = {"pair": pair_name(rec["seed_a"], rec["seed_b"]), "seed_a": rec["seed_a"],
               "seed_b": rec["seed_b"], "method": rec["method"]}
        curves += [{**key, **row} for row in rec["curve"]]
        search = {"search_seconds": float(rec["search"].get("seconds", 0.0)),
                  "search_sweeps": int(rec["search"].get("sweeps", 0))}
        pairs.append({**key, **rec["summary"], **search})
        taylor += [{**key, **row, "barrier": _real_gap(rec["curve"], row["split"], row["lam"])}
                   for row in rec.get("taylor", [])]
        bounds += [{**key, **row} for row in rec.get("theorem42", [])]
    out = {"curves": pd.DataFrame(curves), "pairs": pd.DataFrame(pairs)}
    if taylor:  # records carry the analyze stage's outputs (Taylor curve, Theorem 4.2 rows)
        out.update(taylor=pd.DataFrame(taylor), theorem42=pd.DataFrame(bounds))
    return out


def _real_gap(curve: Sequence[dict], split: str, lam: float) -> float:
    """``L(θ(λ)) − (λ L(θa) + (1−λ) L(θb))`` read off the measured curve (NaN if λ was not measured)."""
    loss = {r["lam"]: r["loss"] for r in curve if r["split"] == split}
    if lam not in loss:
        return float("nan")
    return loss[lam] - (lam * loss[1.0] + (1 - lam) * loss[0.0])


def output_scales(spectra: pd.DataFrame) -> pd.DataFrame:
    """Figure 8: per seed, the least-squares α with ``s^ref_{L,i} ≈ α s^seed_{L,i}`` of the output
    layer, the reference being the first seed; ``adjusted`` = α · s (one row per singular value)."""
    out = spectra[spectra["output"]].sort_values(["seed", "index"])
    ref_seed = out["seed"].iloc[0]
    ref = out[out["seed"] == ref_seed]["singular_value"].to_numpy()
    frames = []
    for seed, sub in out.groupby("seed", sort=False):
        alpha = output_scale(ref, sub["singular_value"].to_numpy())
        frames.append(sub.assign(reference_seed=ref_seed, alpha=alpha, adjusted=alpha * sub["singular_value"]))
    return pd.concat(frames, ignore_index=True)


def table1(pairs: pd.DataFrame, methods: Sequence[str], split: str = "test", level: float = 0.05) -> pd.DataFrame:
    """Table 1 per method: real ``B_½``, Taylor estimate, Diff. = Taylor − real, with a paired
    two-sided t-test over pairs of Taylor vs real (``scipy.stats.ttest_rel``; NaN for one pair),
    and the L2 distances with the reduction rate. Means and sample stds over pairs."""
    rows = []
    for method in methods:
        r = pairs[pairs["method"] == method]
        real, taylor = r[f"{split}_loss_barrier_mid"], r[f"{split}_taylor_barrier_mid"]
        row: dict = {"method": method, "split": split, "n_pairs": len(r)}
        for name, values in (("barrier", real), ("taylor", taylor), ("diff", taylor - real),
                             ("l2_before", r["l2_before"]), ("l2_after", r["l2_after"]),
                             ("reduction_pct", r["l2_reduction_pct"])):
            row[f"{name}_mean"] = float(values.mean())
            row[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        test = stats.ttest_rel(taylor, real) if len(r) > 1 else None
        row["t_stat"] = float(test.statistic) if test else float("nan")
        row["p_value"] = float(test.pvalue) if test else float("nan")
        row["significant"] = bool(test is not None and test.pvalue < level)
        rows.append(row)
    return pd.DataFrame(rows)


def metrics_summary(pairs: pd.DataFrame, method_order: Sequence[str]) -> dict:
    """``{method: {metric: {mean, std}, n_pairs}}``; std is the sample std (0 for one pair)."""
    out: dict = {}
    for method in method_order:
        rows = pairs[pairs["method"] == method]
        entry: dict = {"n_pairs": int(len(rows))}
        extra = [k for k in rows.columns if k == "test_taylor_barrier_mid" or k.startswith("R_")]
        for key in (*SUMMARY_KEYS, *extra):
            values = rows[key].astype(float)
            std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            entry[key] = {"mean": round(float(values.mean()), 6), "std": round(std, 6)}
        out[method] = entry
    return out
