"""The language-model study's figure: the plain test B½ against the model's width and against its training
length per method (mean ± std over pairs), and R_0.3(θa, π(θb)) against B½ for every pair and method of the
preset's run (the paper's explanation predicts the better-aligned method has the lower barrier)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullFormatter, ScalarFormatter

from lmclab.report.plots import _save, label

SWEEPS = (("width", "width of the residual stream"), ("epochs", "training epochs"))


def plot_lm_study(sweeps: pd.DataFrame, points: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """``sweeps``: :func:`lmclab.studies.lm_study.sweep_summary` rows with a ``sweep`` column (width, epochs);
    ``points``: the preset run's :func:`lmclab.studies.lm_study.study_points`."""
    kinds = [(k, x) for k, x in SWEEPS if "sweep" in sweeps and (sweeps["sweep"] == k).any()]  # none: no sweep run
    colour = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(points["method"]))}  # one colour per method throughout
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(4.6 * (len(kinds) + 1), 3.8), squeeze=False)
    for ax, (kind, xlabel) in zip(axes[0], kinds, strict=False):
        for method, sub in sweeps[sweeps["sweep"] == kind].groupby("method", sort=False):
            sub = sub.sort_values("value")
            ax.errorbar(
                sub["value"],
                sub["B_half"],
                yerr=sub["B_half_std"],
                marker="o",
                capsize=3,
                label=label(method),
                color=colour.get(method),
            )
        ax.set(xscale="log", xlabel=xlabel, ylabel="test B½ (nats per token)", title=f"barrier against {kind}")
        ax.set_xticks(sorted(sweeps.loc[sweeps["sweep"] == kind, "value"].unique()))
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for method, sub in points.groupby("method", sort=False):
        ax.scatter(sub["R_0.3"], sub["B_mid"], s=18, label=label(method), color=colour[method])
    ax.set(xlabel="R_0.3(θa, π(θb))", ylabel="test B½ (nats per token)", title="alignment against barrier")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Language models: barriers after alignment")
    return _save(fig, path, dpi)


def plot_widths(widths: pd.DataFrame, path: Path, name=label, *, dpi: int = 120, unit: str = "nats per token") -> Path:
    """The orthogonal pages' figure: test B½ (in ``unit``) against the width per method (``widths``:
    :func:`lmclab.cli.studies.lm_widths.width_table` rows), solid for permutations, dashed for orthogonal maps."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (method, sub) in enumerate(widths.groupby("method", sort=False)):
        sub = sub.sort_values("width")
        style = "--" if "@" in method else "-"
        ax.errorbar(sub["width"], sub["B_mid"], yerr=sub["B_mid_std"], marker="o", capsize=3, linestyle=style,
                    label=name(method), color=f"C{i}")  # fmt: skip
    ax.set(xscale="log", xlabel="width of the residual stream", ylabel=f"test B½ ({unit})")
    ax.set_xticks(sorted(widths["width"].unique()))
    ax.get_xaxis().set_major_formatter(ScalarFormatter())
    ax.get_xaxis().set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("barrier against width: permutations (solid), orthogonal maps (dashed)", fontsize=10)
    return _save(fig, path, dpi)
