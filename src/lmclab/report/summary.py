"""Collect per-(pair, method) measurements into tables and the ``dvc metrics`` summary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from scipy import stats

# what metrics/summary.json reports per method (mean ± std over pairs)
SUMMARY_KEYS = (
    "train_loss_barrier_mid",
    "test_loss_barrier_mid",
    "train_loss_barrier_max",
    "test_loss_barrier_max",
    "train_acc_barrier_mid",
    "test_acc_barrier_mid",
    "train_acc_barrier_max",
    "test_acc_barrier_max",
    "l2_before",
    "l2_after",
    "l2_reduction_pct",
    "search_seconds",
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
    per pair and method with every scalar), ``search_curves`` (long: one row per pair, method and
    search epoch of the iterative searches), ``search_objective`` (WM's ⟨θa, π(θb)⟩ after each
    sweep, sweep 0 = before the first) and, when the records carry them, ``taylor``, ``theorem42``, ``alignment``
    (each layer's share of R_γ), ``cka`` and ``families`` (the barriers by family of layers)."""
    curves, pairs, taylor, bounds, layers, cka, families = [], [], [], [], [], [], []
    for rec in records:
        key = {
            "pair": pair_name(rec["seed_a"], rec["seed_b"]),
            "seed_a": rec["seed_a"],
            "seed_b": rec["seed_b"],
            "method": rec["method"],
        }
        curves += [{**key, **row} for row in rec["curve"]]
        search = {
            "search_seconds": float(rec["search"].get("seconds", 0.0)),
            "search_sweeps": int(rec["search"].get("sweeps", 0)),
        }
        pairs.append({**key, **rec["summary"], **search})
        taylor += [
            {**key, **row, "barrier": _real_gap(rec["curve"], row["split"], row["lam"])}
            for row in rec.get("taylor", [])
        ]
        bounds += [{**key, **row} for row in rec.get("theorem42", [])]
        layers += [{**key, **row} for row in rec.get("alignment", [])]
        cka += [{**key, **row} for row in rec.get("cka", [])]
        families += [{**key, **row} for row in rec.get("families", [])]
    out = {
        "curves": pd.DataFrame(curves),
        "pairs": pd.DataFrame(pairs),
        "search_curves": search_curves(records),
        "search_objective": search_objective(records),
    }
    if taylor:  # records carry the analyze stage's outputs (Taylor curve, Theorem 4.2 rows)
        out.update(taylor=pd.DataFrame(taylor), theorem42=pd.DataFrame(bounds))
    if layers:  # the measure stage's per-layer R_γ rows
        out["alignment"] = pd.DataFrame(layers)
    if cka:  # the measure stage's CKA rows (layer × pair of models)
        out["cka"] = pd.DataFrame(cka)
    if families:  # the measure stage's barriers by family (measure.family_barriers)
        out["families"] = pd.DataFrame(families)
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
    from lmclab.analysis.alignment import output_scale  # imports torch: only here, summarize stays light

    out = spectra[spectra["output"]].sort_values(["seed", "index"])
    ref_seed = out["seed"].iloc[0]
    ref = out[out["seed"] == ref_seed]["singular_value"].to_numpy()
    frames = []
    for _, sub in out.groupby("seed", sort=False):
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
        for name, values in (
            ("barrier", real),
            ("taylor", taylor),
            ("diff", taylor - real),
            ("l2_before", r["l2_before"]),
            ("l2_after", r["l2_after"]),
            ("reduction_pct", r["l2_reduction_pct"]),
        ):
            row[f"{name}_mean"] = float(values.mean())
            row[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        test = stats.ttest_rel(taylor, real) if len(r) > 1 else None
        row["t_stat"] = float(test.statistic) if test else float("nan")
        row["p_value"] = float(test.pvalue) if test else float("nan")
        row["significant"] = bool(test is not None and test.pvalue < level)
        rows.append(row)
    return pd.DataFrame(rows)


def search_curves(records: Sequence[dict]) -> pd.DataFrame:
    """Per-epoch ``l2`` (‖θa − π(θb)‖ with the current hard permutation) and the merged
    midpoint's ``test_loss``/``test_acc``; empty (with these columns) when no search records any."""
    rows = [
        {
            "pair": pair_name(rec["seed_a"], rec["seed_b"]),
            "method": rec["method"],
            **{k: row.get(k) for k in SEARCH_CURVE_COLUMNS[2:]},
        }
        for rec in records
        for row in rec["search"].get("curve", [])
    ]
    frame = pd.DataFrame(rows, columns=list(SEARCH_CURVE_COLUMNS))
    return frame.astype({"epoch": "int64", "l2": "float64", "test_loss": "float64", "test_acc": "float64"})


def search_objective(records: Sequence[dict]) -> pd.DataFrame:
    """One row per pair, method and sweep of the searches that record an ``objective`` trace."""
    rows = [
        {
            "pair": pair_name(rec["seed_a"], rec["seed_b"]),
            "method": rec["method"],
            "sweep": sweep,
            "objective": float(value),
        }
        for rec in records
        for sweep, value in enumerate(rec["search"].get("objective", []))
    ]
    return pd.DataFrame(rows, columns=["pair", "method", "sweep", "objective"]).astype({"sweep": "int64"})


def metrics_summary(pairs: pd.DataFrame, method_order: Sequence[str]) -> dict:
    """``{method: {metric: {mean, std}, n_pairs}}``; std is the sample std (0 for one pair)."""
    out: dict = {}
    for method in method_order:
        rows = pairs[pairs["method"] == method]
        entry: dict = {"n_pairs": int(len(rows))}
        extra = [k for k in rows.columns if k == "test_taylor_barrier_mid" or k.startswith(("R_", "cka_"))]
        for key in (*SUMMARY_KEYS, *extra):
            values = rows[key].astype(float)
            std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            entry[key] = {"mean": round(float(values.mean()), 6), "std": round(std, 6)}
        out[method] = entry
    return out


THREE_KEYS = (
    "test_loss_barrier_max",
    "test_loss_barrier_mid",
    "test_acc_barrier_max",
    "test_acc_barrier_mid",
    "train_loss_barrier_max",
    "train_acc_barrier_max",
    "l2",
)


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
    keys = list(THREE_KEYS) + [c for c in edges.columns if c.startswith("R_")]
    return {
        m: {
            edge: {k: _mean_std(rows[k].astype(float)) for k in keys}
            for edge, rows in edges[edges["method"] == m].groupby("edge")
        }
        for m in method_order
    }


def collect_pairs(
    measure_dir: Path, perms_dir: Path, pairs: Sequence[Sequence[int]], methods: Sequence[str]
) -> list[dict]:
    """Read the permute and measure outputs of every (pair, method) into records for :func:`tables`."""
    records = []
    for seed_a, seed_b in pairs:
        for method in methods:
            where = Path(pair_name(seed_a, seed_b)) / method
            rec = json.loads((measure_dir / where / "summary.json").read_text())
            records.append(
                {
                    "seed_a": seed_a,
                    "seed_b": seed_b,
                    "method": method,
                    "curve": pd.read_parquet(measure_dir / where / "curve.parquet").to_dict("records"),
                    "summary": {k: v for k, v in rec.items() if k not in ("seed_a", "seed_b", "method")},
                    "search": json.loads((perms_dir / where / "stats.json").read_text()),
                    **{
                        name: pd.read_parquet(measure_dir / where / f"{name}.parquet").to_dict("records")
                        for name in ("taylor", "theorem42", "alignment", "cka", "families")
                        if name != "families" or (measure_dir / where / f"{name}.parquet").exists()  # when asked
                    },
                }
            )
    return records


def collect_triples(connect_dir: Path, triples: Sequence[Sequence[int]], methods: Sequence[str]) -> list[dict]:
    """Read the connect outputs of every (triple, method) into records for :func:`three_tables`."""
    records = []
    for seeds in triples:
        for method in methods:
            where = connect_dir / triple_name(seeds) / method
            rec = json.loads((where / "edges.json").read_text())
            records.append(
                {
                    "seeds": seeds,
                    "method": method,
                    "edges": rec["edges"],
                    "curves": pd.read_parquet(where / "curves.parquet").to_dict("records"),
                    "landscape": pd.read_parquet(where / "landscape.parquet").to_dict("records"),
                }
            )
    return records
