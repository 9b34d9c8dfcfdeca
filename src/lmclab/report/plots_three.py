"""The three-model study's figure: the b–c barrier and R_0.3 of b–c per setting and method."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def plot_three_study(table: pd.DataFrame, edges: pd.DataFrame, path: Path, *, dpi: int = 120) -> None:
    """Left: mean ± std over triples of the b–c test midpoint loss barrier per setting and method,
    with every triple as a dot, hatched where the searches failed (stalled or unconverged,
    :func:`~lmclab.studies.three_study.failed`); right: b–c R_0.3 against that barrier (one point per
    triple; those of a failed row hollow: the statistics leave them out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmclab.core.atomic import atomic_path
    from lmclab.studies.three_study import failed

    settings = list(dict.fromkeys(table["point"]))
    methods = list(dict.fromkeys(table["method"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(methods)
    bc = edges[edges["edge"] == "b-c"]
    for k, method in enumerate(methods):
        rows = table[table["method"] == method].set_index("point").reindex(settings)
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(settings))]
        left.bar(xs, rows["test_loss_barrier_mid_mean"], width, yerr=rows["test_loss_barrier_mid_std"], label=method)
        gone = {point for point, row in rows.iterrows() if failed(row)}
        for x, point, height in zip(xs, settings, rows["test_loss_barrier_mid_mean"], strict=True):
            dots = bc[(bc["point"] == point) & (bc["method"] == method)]["test_loss_barrier_mid"]
            left.scatter([x] * len(dots), dots, color="black", s=6, zorder=3)
            if point in gone:
                left.bar(x, height, width, fill=False, hatch="//", edgecolor="black")
        _scatter_r(right, bc[bc["method"] == method], gone, method)
    left.axhline(0, color="grey", lw=0.5)
    left.set_xticks(range(len(settings)), settings, rotation=30, ha="right")
    left.set_ylabel("b–c test loss barrier at λ = ½")
    left.legend()
    right.set_xlabel("R_0.3 of b–c")
    right.set_ylabel("b–c test loss barrier at λ = ½")
    right.axhline(0, color="grey", lw=0.5)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    plt.close(fig)


def _scatter_r(ax, mine: pd.DataFrame, gone: set, method: str) -> None:
    """``method``'s triples on ``ax``: b–c R_0.3 against the b–c barrier, hollow where the setting's
    searches failed (``gone``)."""
    stuck = mine["point"].isin(gone)
    dot = ax.scatter(mine["R_0.3"][~stuck], mine["test_loss_barrier_mid"][~stuck], s=12, label=method)
    ax.scatter(
        mine["R_0.3"][stuck],
        mine["test_loss_barrier_mid"][stuck],
        s=12,
        facecolors="none",
        edgecolors=dot.get_facecolor(),
    )
