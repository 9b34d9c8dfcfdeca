"""Figures, one function each; they only read saved tables and never recompute metrics."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lmclab.core.atomic import atomic_path


def mean_std(grouped: pd.api.typing.SeriesGroupBy) -> tuple[pd.Series, pd.Series]:
    """Mean and sample std (ddof = 1, as in the report's tables; 0 for a single pair) per group."""
    return grouped.mean(), grouped.std(ddof=1).fillna(0)


# display names in tables and figures; a method not listed is shown by its registry name. The paper's WM and
# STE are the Sinkhorn methods (Appendix D.2); wm and ste are the re-basin originals. (Kept here, not in the
# methods' modules, so that the plot stage does not depend on the search code.)
METHOD_LABELS = {
    "identity": "naive (w/o)",
    "wm": "WM (re-basin)",
    "am": "AM",
    "ste": "STE (re-basin)",
    "wm_sinkhorn": "WM Sinkhorn",
    "ste_sinkhorn": "STE Sinkhorn",
}


def label(method: str) -> str:
    """A method's name in tables and figures (:data:`METHOD_LABELS`, else its registry name)."""
    return METHOD_LABELS.get(method, method)


def plot_interpolation(curves: pd.DataFrame, path: Path, *, dpi: int = 120, band: str = "std") -> Path:
    """Loss and accuracy along ``θ(λ)`` (λ=0: π(θb), λ=1: θa) for train and test; one line per
    method, the mean over pairs with a ±std (or min–max) band. When the table has repaired curves
    (``repair`` column: BatchNorm repair or REPAIR), they are solid and the unrepaired ones dashed."""
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
                mean, std = (v * scale for v in mean_std(g))
                lo, hi = (mean - std, mean + std) if band == "std" else (g.min() * scale, g.max() * scale)
                suffix = "" if not repaired else ", repaired" if fixed else ", not repaired"
                (line,) = ax.plot(
                    mean.index,
                    mean.values,
                    marker=".",
                    label=label(method) + suffix,
                    ls="--" if repaired and not fixed else "-",
                    color=colors.get(method),
                )
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
        for ax, q in zip(axes, ("loss", "acc"), strict=True):
            (line,) = ax.plot(sub["epoch"], sub[f"test_{q}"], label=f"seed {seed} test")
            ax.plot(sub["epoch"], sub[f"train_{q}"], ls="--", color=line.get_color(), alpha=0.6)
    for ax, q in zip(axes, ("loss", "accuracy"), strict=True):
        ax.set(xlabel="epoch", ylabel=q)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Training (solid: test, dashed: train running mean)")
    return _save(fig, path, dpi)


def plot_search_curves(search_curves: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Paper Figure 6: per search epoch, ‖θa − π(θb)‖ with the current hard permutation and the
    merged midpoint's test loss and accuracy; one line per method, mean ± std over pairs."""
    panels = (
        ("l2", 1, "‖θa − π(θb)‖"),
        ("test_loss", 1, "merged test loss"),
        ("test_acc", 100, "merged test accuracy (%)"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (q, scale, name) in zip(axes, panels, strict=True):
        for method, sub in search_curves.groupby("method", sort=False):
            g = sub.groupby("epoch")[q]
            mean, std = (v * scale for v in mean_std(g))
            (line,) = ax.plot(mean.index, mean.values, marker=".", label=label(method))
            ax.fill_between(mean.index, (mean - std).values, (mean + std).values, color=line.get_color(), alpha=0.2)
        ax.set(xlabel="search epoch (0: initial permutation)", ylabel=name)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Permutation search learning curves, mean ± std over {search_curves['pair'].nunique()} pair(s)")
    return _save(fig, path, dpi)


def _save(fig: plt.Figure, path: Path, dpi: int) -> Path:
    path = Path(path)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    return path


def _layer_axes(layers: list[str], height: float = 3.2) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(4, len(layers))
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, height * rows), squeeze=False)
    for ax in axes.flat[len(layers) :]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _per_layer_lines(
    frame: pd.DataFrame, column: str, path: Path, *, dpi: int, xlabel: str, ylabel: str, title: str
) -> Path:
    """One panel per layer, one line per seed of ``frame[column]`` against the singular index."""
    layers = list(dict.fromkeys(frame["layer"]))
    fig, axes = _layer_axes(layers)
    for ax, layer in zip(axes, layers, strict=False):  # the grid may hold more axes than layers
        for seed, sub in frame[frame["layer"] == layer].groupby("seed"):
            ax.plot(sub["index"], sub[column], lw=1, label=f"seed {seed}")
        ax.set(title=layer, xlabel=xlabel, ylabel=ylabel, yscale="log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path, dpi)


def plot_spectra(spectrum: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Figures 1, 7: singular values of every layer against their index, one line per seed."""
    return _per_layer_lines(
        spectrum,
        "singular_value",
        path,
        dpi=dpi,
        xlabel="index i",
        ylabel="singular value",
        title="Singular values of every layer (Figures 1, 7)",
    )


def plot_output_scale(output_scale: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Figure 8: the output layer's singular values per seed, raw and scaled by the fitted α."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for seed, sub in output_scale.groupby("seed"):
        axes[0].plot(sub["index"], sub["singular_value"], marker=".", label=f"seed {seed}")
        axes[1].plot(sub["index"], sub["adjusted"], marker=".", label=f"seed {seed}: α = {sub['alpha'].iloc[0]:.3f}")
    ref = output_scale["reference_seed"].iloc[0]
    for ax, title in zip(axes, ("raw", f"α · s, α fitted to seed {ref}"), strict=True):
        ax.set(title=title, xlabel="index i", ylabel="singular value")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Output layer spectrum (Figure 8)")
    return _save(fig, path, dpi)


def plot_energy(energy: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Figures 4, 9: ``E[(v_iᵀ z_{ℓ−1})²]`` over the test set against the singular index, per seed."""
    return _per_layer_lines(
        energy,
        "energy",
        path,
        dpi=dpi,
        xlabel="index i (descending s_i)",
        ylabel="E[(v_iᵀz)²]",
        title="Input energy along right singular vectors (Figures 4, 9)",
    )


def plot_alignment(pairs: pd.DataFrame, path: Path, *, dpi: int = 120) -> Path:
    """Figures 2, 3: R_γ of (θa, π(θb)), (θa, mid) and (π(θb), mid) per method; mean ± std over pairs."""
    gammas = [c.removeprefix("R_") for c in pairs.columns if c.startswith("R_") and c.count("_") == 1]
    which = (("", "θa vs π(θb)"), ("_a_mid", "θa vs midpoint"), ("_b_mid", "π(θb) vs midpoint"))
    methods = list(dict.fromkeys(pairs["method"]))
    fig, axes = plt.subplots(1, len(gammas), figsize=(5 * len(gammas), 3.8), squeeze=False)
    for ax, gamma in zip(axes[0], gammas, strict=True):
        for k, (suffix, name) in enumerate(which):
            g = pairs.groupby("method", sort=False)[f"R_{gamma}{suffix}"]
            mean, std = (v.reindex(methods) for v in mean_std(g))
            xs = [i + (k - 1) * 0.27 for i in range(len(methods))]
            ax.bar(xs, mean.values, width=0.27, yerr=std.values, label=name)
        ax.set_xticks(range(len(methods)), [label(m) for m in methods])
        ax.set(title=f"γ = {gamma}", ylabel=f"R_{gamma}", ylim=(min(0, ax.get_ylim()[0]), 1.05))
        ax.axhline(0, color="k", lw=0.5)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Singular-vector alignment R_γ (Figures 2, 3)")
    return _save(fig, path, dpi)


def plot_taylor(taylor: pd.DataFrame, path: Path, *, dpi: int = 120, split: str = "test") -> Path:
    """Theorem 3.1 along λ: the Taylor estimate (dashed) next to the measured
    ``L(θ(λ)) − (λL(θa) + (1−λ)L(θb))`` (solid), mean over pairs, per method."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, sub in taylor[taylor["split"] == split].groupby("method", sort=False):
        mean = sub.groupby("lam")[["barrier", "taylor"]].mean()
        (line,) = ax.plot(mean.index, mean["barrier"], marker=".", label=f"{label(method)} measured")
        ax.plot(mean.index, mean["taylor"], ls="--", color=line.get_color(), label=f"{label(method)} Taylor")
    ax.set(xlabel="λ  (0: π(θb), 1: θa)", ylabel=f"{split} loss − linear path")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Real vs Taylor-approximated barrier (Theorem 3.1)")
    return _save(fig, path, dpi)


def plot_width(
    spectrum: pd.DataFrame, energy: pd.DataFrame, alignment: pd.DataFrame, path: Path, *, dpi: int = 120
) -> Path:
    """Appendix H.4 in one figure: per layer, the normalised singular values (Figure 10) and the
    input energy (Figures 11, 12) per width against the relative index i/n (mean over seeds), and
    R_γ against width with and without matching (Figure 13)."""
    layers = list(dict.fromkeys(spectrum["layer"]))
    fig, axes = plt.subplots(3, len(layers), figsize=(4 * len(layers), 9.6), squeeze=False)
    for col, layer in enumerate(layers):
        for row, (frame, q, name) in enumerate(
            ((spectrum, "normalised_value", "s_i / s_1"), (energy, "energy", "E[(v_iᵀz)²]"))
        ):
            ax = axes[row][col]
            for width, sub in frame[frame["layer"] == layer].groupby("width"):
                mean = sub.groupby("relative_index")[q].mean()
                ax.plot(mean.index, mean.values, lw=1, label=f"width {width}")
            ax.set(title=layer, xlabel="relative index i/n", ylabel=name, yscale="log")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    for ax in axes[2][1:]:
        ax.set_visible(False)
    ax = axes[2][0]
    r_cols = [c.removesuffix("_mean") for c in alignment.columns if c.startswith("R_") and c.endswith("_mean")]
    for method, sub in alignment.groupby("method", sort=False):
        for col in r_cols:
            ax.errorbar(
                sub["width"],
                sub[f"{col}_mean"],
                yerr=sub[f"{col}_std"],
                marker="o",
                capsize=3,
                label=f"{col} {label(method)}",
            )
    ax.set(xscale="log", xlabel="width", ylabel="R_γ(θa, π(θb))", title="alignment vs width (Figure 13)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("Width study (Appendix H.4)")
    return _save(fig, path, dpi)
