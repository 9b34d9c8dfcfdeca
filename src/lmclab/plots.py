"""Figures, one function each; they only read saved tables and never recompute metrics."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

METHOD_LABELS = {"identity": "naive (w/o)", "wm": "WM", "am": "AM", "ste": "STE",
                 "wm_sinkhorn": "WM Sinkhorn", "ste_sinkhorn": "STE Sinkhorn"}


def label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def plot_interpolation(curves: pd.DataFrame, path: Path, *, dpi: int = 120, band: str = "std") -> Path:
    """Loss and accuracy along ``θ(λ)`` (λ=0: π(θb), λ=1: θa) for train and test; one line per
    method, the mean over pairs with a ±std (or min–max) band. When the table has BatchNorm
    repaired curves (``repair`` column), they are solid and the stale-statistics ones dashed."""
    splits = [s for s in ("train", "test") if s in set(curves["split"])]
    repaired = "repair" in curves and bool(curves["repair"].any())
    if "repair" not in curves:
        curves = curves.assign(repair=False)
    fig, axes = plt.subplots(2, len(splits), figsize=(5.2 * len(splits), 7), squeeze=False)
    for col, split in enumerate(splits):
        for row, (q, scale, name) in enumerate((("loss", 1, "loss"), ("acc", 100, "accuracy (%)"))):
            ax = axes[row][col]
            colors: dict[str, str] = {}
            for (method, fixed), sub in curves[curves["split"] == split].groupby(["method", "repair"], sort=False):
                g = sub.groupby("lam")[q]
                mean = g.mean() * scale
                lo, hi = ((mean - g.std(ddof=0).fillna(0) * scale, mean + g.std(ddof=0).fillna(0) * scale)
                          if band == "std" else (g.min() * scale, g.max() * scale))
                suffix = ("" if not repaired else ", BN repaired" if fixed else ", stale BN stats")
                (line,) = ax.plot(mean.index, mean.values, marker=".", label=label(method) + suffix,
                                  ls="--" if repaired and not fixed else "-", color=colors.get(method))
                colors[method] = line.get_color()
                ax.fill_between(mean.index, lo.values, hi.values, color=line.get_color(), alpha=0.2)
            ax.set(xlabel="λ  (0: π(θb), 1: θa)", ylabel=f"{split} {name}")
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    n_pairs = curves["pair"].nunique()
    fig.suptitle(f"Linear interpolation, mean ± {'std' if band == 'std' else 'range'} over {n_pairs} pair(s)")
    return _save(fig, path, dpi)


def plot_training(history: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Per-epoch train/test loss and accuracy of every trained seed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for seed, sub in history.groupby("seed"):
        for ax, q in zip(axes, ("loss", "acc")):
            (line,) = ax.plot(sub["epoch"], sub[f"test_{q}"], label=f"seed {seed} test")
            ax.plot(sub["epoch"], sub[f"train_{q}"], ls="--", color=line.get_color(), alpha=0.6)
    for ax, q in zip(axes, ("loss", "accuracy")):
        ax.set(xlabel="epoch", ylabel=q)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Training (solid: test, dashed: train running mean)")
    return _save(fig, path, dpi)


def _save(fig: plt.Figure, path: Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
