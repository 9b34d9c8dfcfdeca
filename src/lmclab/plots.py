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


def _save(fig: plt.Figure, path: Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_landscape(plane: pd.DataFrame, path: Path, *, dpi: int = 120, quantity: str = "acc") -> Path:
    """Test accuracy (or loss) on the plane through θa, π_b(θb), π_c(θc), one panel per method,
    for the first triple; orthonormal in-plane coordinates, the three models marked (Figure 17)."""
    triple = plane["triple"].iloc[0]
    sub = plane[plane["triple"] == triple]
    methods = list(dict.fromkeys(sub["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.3 * len(methods), 3.9), squeeze=False)
    for ax, method in zip(axes[0], methods):
        m = sub[sub["method"] == method]
        scale = 100 if quantity == "acc" else 1
        cs = ax.tricontourf(m["x"], m["y"], m[quantity] * scale, levels=20, cmap="viridis")
        fig.colorbar(cs, ax=ax, label=f"test {'accuracy (%)' if quantity == 'acc' else 'loss'}")
        corners = m[((m["u"] == 0) | (m["u"] == 1)) & ((m["v"] == 0) | (m["v"] == 1)) & (m["u"] + m["v"] <= 1)]
        for _, r in corners.iterrows():
            name = {(0.0, 0.0): "θa", (1.0, 0.0): "π_b(θb)", (0.0, 1.0): "π_c(θc)"}[(r["u"], r["v"])]
            ax.plot(r["x"], r["y"], "w^", ms=8, mec="k")
            ax.annotate(name, (r["x"], r["y"]), textcoords="offset points", xytext=(4, 4), color="w")
        ax.set(title=label(method), aspect="equal", xlabel="in-plane x (L2)", ylabel="in-plane y (L2)")
    fig.suptitle(f"Landscape on the plane of three models ({triple})")
    return _save(fig, path, dpi)


def plot_three_barriers(edges: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Test loss and accuracy barriers (max over λ) on each edge a–b, a–c, b–c per method (Table 3)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    methods = list(dict.fromkeys(edges["method"]))
    edge_names = ["a-b", "a-c", "b-c"]
    width = 0.8 / len(methods)
    for ax, (col, name) in zip(axes, (("test_loss_barrier_max", "test loss barrier"),
                                      ("test_acc_barrier_max", "test accuracy barrier (points)"))):
        for i, method in enumerate(methods):
            g = edges[edges["method"] == method].groupby("edge")[col]
            mean, std = g.mean().reindex(edge_names), g.std(ddof=1).reindex(edge_names).fillna(0)
            xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(3)]
            ax.bar(xs, mean.values, width, yerr=std.values, label=label(method), capsize=3)
        ax.set_xticks(range(3), ["a–π_b(b)", "a–π_c(c)", "π_b(b)–π_c(c)"])
        ax.set(ylabel=name)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("Three-model connectivity: b and c are aligned to a only (mean ± std over triples)")
    return _save(fig, path, dpi)


def plot_merge_many(trace: pd.DataFrame, evaluation: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """MergeMany: summed squared distance to the mean per iteration, and test accuracy of the
    members, the naive average, the MergeMany average and the output ensemble."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(trace["iteration"], trace["distance"], marker="o")
    axes[0].set(xlabel="iteration", ylabel="Σ‖π_i(θ_i) − θ̄‖²", title="MergeMany convergence")
    test = evaluation[evaluation["split"] == "test"]
    axes[1].barh(test["model"], test["acc"] * 100)
    axes[1].set(xlabel="test accuracy (%)", title="merged vs ensemble vs members")
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, path, dpi)
