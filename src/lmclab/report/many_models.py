"""The n-model comparison of the merge_many stage (:mod:`lmclab.analysis.many_models`) in the report:
its table, figure, objective traces and detail summary, from the saved tables only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

NAMES = {"merge_many": "MergeMany", "c2m3": "C2M3", "sync": "sync", "star": "star", "pairwise WM": "pairwise WM"}


def many_section(evaluation: pd.DataFrame, many_methods: pd.DataFrame, figure: str) -> str:
    """The report's n-model section: every method's merge and the references (:func:`many_table`), and
    its ``figure``."""
    n_models = sum((evaluation["method"] == "models") & (evaluation["split"] == "test"))
    return f"""
## N models in one frame ({n_models} models)

Every n-model method maps each model into one frame; its pairwise maps π_ij = π_j ∘ π_i⁻¹ are then
cycle-consistent (cycle error 0), unlike independent pairwise WM. F is the shared objective
Σ_{{i<j}} ⟨π_i θ_i, π_j θ_j⟩ over the best method's; pair B½ is the mean test barrier at λ = ½ between
θ_i and π_ij(θ_j) over the pairs; "repaired" evaluates the merge repaired as `merge_many.repair` says.

{many_table(evaluation, many_methods)}

![n-model methods]({figure})
"""


def objective_traces(trace: Mapping, methods: pd.DataFrame) -> pd.DataFrame:
    """Long format ``method, iteration, objective``: the shared objective F per iteration. C2M3 records
    its relaxed F; MergeMany its ``D = Σ_i ‖π_i(θ_i) − θ̄‖²``, turned into F by
    ``F = ((N − 1) Σ_i ‖θ_i‖² − N·D) / 2`` (:mod:`lmclab.search.universe`) with ``Σ_i ‖θ_i‖²`` from the
    final F and D; a method without a trace is its final F at its last iteration."""
    n, rows = len(trace["seeds"]), []
    for method, stats in trace["methods"].items():
        final = methods.set_index("method").loc[method]
        if final["objective"] != final["objective"]:  # a transform method (CCA, ZipIt!) has no F
            continue
        if "objective" in stats:
            values = stats["objective"]
        elif "distance" in stats:
            norms = (2 * final["objective"] + n * final["distance"]) / (n - 1)
            values = [((n - 1) * norms - n * d) / 2 for d in stats["distance"]]
        else:
            values = [final["objective"]]
        start = int(final["iterations"]) + 1 - len(values)
        rows += [{"method": method, "iteration": start + k, "objective": v} for k, v in enumerate(values)]
    return pd.DataFrame(rows, columns=["method", "iteration", "objective"])


def _test(evaluation: pd.DataFrame, method: str, repaired: bool) -> pd.Series | None:
    rows = evaluation[
        (evaluation["method"] == method) & (evaluation["repaired"] == repaired) & (evaluation["split"] == "test")
    ]
    return rows.iloc[0] if len(rows) else None


def merged_test(evaluation: pd.DataFrame, method: str, repaired: bool = False) -> tuple[float, float]:
    """Test accuracy (%) and loss of ``method``'s merge (``naive``: the unaligned average; ``ensemble``),
    NaN if absent."""
    row = _test(evaluation, method, repaired)
    return (float("nan"), float("nan")) if row is None else (100 * float(row["acc"]), float(row["loss"]))


def many_summary(evaluation: pd.DataFrame, methods: pd.DataFrame) -> dict:
    """Per method and reference: test accuracy/loss of the merge, plain and repaired, and the
    method's objective, cycle error, mean pairwise barrier, seconds and assignments."""
    members = evaluation[(evaluation["method"] == "models") & (evaluation["split"] == "test")]
    out: dict = {
        "members mean": {
            "test_acc": round(float(members["acc"].mean()), 6),
            "test_loss": round(float(members["loss"].mean()), 6),
        },
        "ensemble": dict(zip(("test_acc", "test_loss"), _rounded(evaluation, "ensemble", False), strict=True)),
    }
    for method in ["naive", *methods["method"]]:
        entry = {
            f"{k}{s}": v
            for r, s in ((False, ""), (True, "_repaired"))
            for k, v in zip(("test_acc", "test_loss"), _rounded(evaluation, method, r), strict=True)
        }
        if method in set(methods["method"]):
            row = methods.set_index("method").loc[method]
            entry |= {k: round(float(row[k]), 6) for k in row.index if k != "method"}
        out[method] = entry
    return out


def _rounded(evaluation: pd.DataFrame, method: str, repaired: bool) -> tuple[float, float]:
    row = _test(evaluation, method, repaired)
    return (float("nan"), float("nan")) if row is None else (round(float(row["acc"]), 6), round(float(row["loss"]), 6))


def _cell(value: float, digits: int) -> str:
    return "–" if value != value else f"{value:.{digits}f}"


def _merged_cell(evaluation: pd.DataFrame, method: str, repaired: bool = False) -> str:
    """``acc (loss)`` of a merge; a reconstruction model (no accuracy) shows its loss alone."""
    acc, loss = merged_test(evaluation, method, repaired)
    if loss != loss:
        return "–"
    return f"{loss:.4f}" if acc != acc else f"{acc:.2f} ({loss:.3f})"


def many_table(evaluation: pd.DataFrame, methods: pd.DataFrame) -> str:
    """One row per method (and the references): merged test accuracy plain / repaired, the shared
    objective relative to MergeMany's (or the best), the cycle error, the mean test barriers at λ = ½ of
    the pairwise maps, seconds and assignments."""
    best = methods["objective"].max()
    head = [
        "| method | merged: test acc % (loss) | repaired | F / best F | cycle error | pair B½ loss | pair B½ acc | s "
        "| assignments |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    for _, row in methods.iterrows():
        method = row["method"]
        lines.append(
            f"| {NAMES.get(method, method)} | {_merged_cell(evaluation, method)} | "
            f"{_merged_cell(evaluation, method, True)} | "
            f"{_cell(row['objective'] / best, 5)} | {_cell(row['cycle_error'], 3)} | "
            f"{_cell(row['pair_test_loss_barrier_mid'], 4)} | {_cell(row['pair_test_acc_barrier_mid'], 2)} | "
            f"{row['seconds']:.2f} | {int(row['assignments'])} |"
        )
    members = evaluation[(evaluation["method"] == "models") & (evaluation["split"] == "test")]
    acc, loss = 100 * members["acc"].mean(), members["loss"].mean()
    lines += [
        f"| unaligned average | {_merged_cell(evaluation, 'naive')} | {_merged_cell(evaluation, 'naive', True)} "
        "| | | | | | |",
        f"| output ensemble | {_merged_cell(evaluation, 'ensemble')} | | | | | | | |",
        f"| members (mean) | {'–' if acc != acc else f'{acc:.2f} ({loss:.3f})'} | | | | | | | |",
    ]
    return "\n".join(head + lines)


def plot_many(traces: pd.DataFrame, evaluation: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Left: the shared objective F per iteration of each method; right: merged test accuracy of each
    method, plain and repaired, beside the unaligned average and the ensemble."""
    from lmclab.report.plots import _save

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for method, sub in traces.groupby("method", sort=False):
        axes[0].plot(sub["iteration"], sub["objective"], marker="o", ms=3, label=NAMES.get(method, method))
    axes[0].set(xlabel="iteration", ylabel="F = Σ_{i<j} ⟨π_i θ_i, π_j θ_j⟩", title="shared objective")
    axes[0].legend(fontsize=8)
    names = [m for m in dict.fromkeys(evaluation["method"]) if m not in ("models", "ensemble")]
    column = 0 if evaluation["acc"].notna().any() else 1  # a reconstruction model has no accuracy: its loss
    for k, repaired in enumerate((False, True)):
        values = [merged_test(evaluation, m, repaired)[column] for m in names]
        axes[1].barh(
            [i + 0.4 * k for i in range(len(names))], values, height=0.4, label="repaired" if repaired else "plain"
        )
    axes[1].set_yticks([i + 0.2 for i in range(len(names))], [NAMES.get(m, m) for m in names])
    axes[1].axvline(merged_test(evaluation, "ensemble")[column], color="k", ls="--", lw=1, label="ensemble")
    axes[1].set(xlabel=("test accuracy (%)", "test loss")[column], title="merged models")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, path, dpi)
