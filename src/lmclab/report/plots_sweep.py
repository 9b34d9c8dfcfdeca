"""The sweep study's figure (Appendix H.5): test B½, L2 reduction and R_0.3 against the swept value,
one line per method (mean ± sample std over pairs), read from the saved sweep table only."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lmclab.report.plots import _save, label

PANELS = (("B_half", "test B½ (loss)"), ("L2_red", "L2 reduction %"), ("R_0.3", "R_0.3(θa, π(θb))"))


def plot_sweep(table: pd.DataFrame, path: Path, *, param: str, dpi: int = 120) -> Path:
    """Three panels against ``param`` (log scale when every value is positive)."""
    panels = [(q, name) for q, name in PANELS if f"{q}_mean" in table]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6), squeeze=False)
    values = table["value"]
    # log scale; a 0 (e.g. no weight decay) on a symlog axis, linear up to the smallest positive value
    positive = values[values > 0]
    scale = (
        {"value": "log"}
        if len(positive) == len(values)
        else {"value": "symlog", "linthresh": float(positive.min()) if len(positive) else 1.0}
    )
    for ax, (q, name) in zip(axes[0], panels, strict=True):
        for method, sub in table.groupby("method", sort=False):
            ax.errorbar(
                sub["value"], sub[f"{q}_mean"], yerr=sub[f"{q}_std"], marker="o", capsize=3, label=label(method)
            )
        ax.set(xlabel=param, ylabel=name)
        ax.set_xscale(**scale)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Sweep of {param} (Appendix H.5)")
    return _save(fig, path, dpi)
