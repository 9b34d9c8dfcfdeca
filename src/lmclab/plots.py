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
    method, the mean over pairs with a ±std (or min–max) band."""
    splits = [s for s in ("train", "test") if s in set(curves["split"])]
    fig, axes = plt.subplots(2, len(splits), figsize=(5.2 * len(splits), 7), squeeze=False)
    for col, split in enumerate(splits):
        for row, (q, scale, name) in enumerate((("loss", 1, "loss"), ("acc", 100, "accuracy (%)"))):
            ax = axes[row][col]
            for method, sub in curves[curves["split"] == split].groupby("method", sort=False):
                g = sub.groupby("lam")[q]
                mean = g.mean() * scale
                lo, hi = ((mean - g.std(ddof=0).fillna(0) * scale, mean + g.std(ddof=0).fillna(0) * scale)
                          if band == "std" else (g.min() * scale, g.max() * scale))
                (line,) = ax.plot(mean.index, mean.values, marker=".", label=label(method))
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


def plot_search_curves(search_curves: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Paper Figure 6: per search epoch, ‖θa − π(θb)‖ with the current hard permutation and the
    merged midpoint's test loss and accuracy; one line per method, mean ± std over pairs."""
    panels = (("l2", 1, "‖θa − π(θb)‖"), ("test_loss", 1, "merged test loss"),
              ("test_acc", 100, "merged test accuracy (%)"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (q, scale, name) in zip(axes, panels):
        for method, sub in search_curves.groupby("method", sort=False):
            g = sub.groupby("epoch")[q]
            mean, std = g.mean() * scale, g.std(ddof=0).fillna(0) * scale
            (line,) = ax.plot(mean.index, mean.values, marker=".", label=label(method))
            ax.fill_between(mean.index, (mean - std).values, (mean + std).values,
                            color=line.get_color(), alpha=0.2)
        ax.set(xlabel="search epoch (0: initial permutation)", ylabel=name)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Permutation search learning curves, mean ± std over "
                 f"{search_curves['pair'].nunique()} pair(s)")
    return _save(fig, path, dpi)


def _save(fig: plt.Figure, path: Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
