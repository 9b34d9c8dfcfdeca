"""The three-model connectivity of a run in the report (the paper's Section 6.3): Table 3's layout, its
section of ``report.md``, the barriers per edge (Table 3, Figure 5) and the landscape on the plane of the
three models (Figure 17), from the saved tables only."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lmclab.report.paper_tables import marked, mean_pm, table3_paper_lines
from lmclab.report.plots import _save, label, mean_std


def table3(edges: pd.DataFrame, row: str | None = None) -> str:
    """Table 3 layout: barriers between π_b(θb) and π_c(θc) (never matched to each other), with the
    a–b and a–c edges for comparison; test split, max over λ (and the b–c midpoint barrier, the
    paper's loss column), mean ± std over triples; the paper's ``row`` (:mod:`lmclab.report.paper_numbers`) below."""
    r_col = next((c for c in ("R_0.3", *sorted(c for c in edges.columns if c.startswith("R_"))) if c in edges), None)
    r_head = f" {r_col} a–b | {r_col} a–c | {r_col} b–c |" if r_col else ""
    lines = [
        "| method | loss b–c | loss b–c ½ | acc b–c | loss a–b | acc a–b | loss a–c | acc a–c | L2 b–c |" + r_head,
        "|---|---|---|---|---|---|---|---|---|" + "---|" * (3 if r_col else 0),
    ]
    for m in dict.fromkeys(edges["method"]):
        r = edges[edges["method"] == m].set_index("edge")
        cell = lambda e, c, d=3, r=r: mean_pm(r.loc[[e], c], d)  # noqa: E731
        lines.append(
            f"| {marked(m)} | {cell('b-c', 'test_loss_barrier_max')} | "
            f"{cell('b-c', 'test_loss_barrier_mid')} | "
            f"{cell('b-c', 'test_acc_barrier_max', 2)} | "
            f"{cell('a-b', 'test_loss_barrier_max')} | {cell('a-b', 'test_acc_barrier_max', 2)} | "
            f"{cell('a-c', 'test_loss_barrier_max')} | {cell('a-c', 'test_acc_barrier_max', 2)} | "
            f"{cell('b-c', 'l2', 2)} |"
            + ("".join(f" {cell(e, r_col)} |" for e in ("a-b", "a-c", "b-c")) if r_col else "")
        )
    return "\n".join(lines) + table3_paper_lines(row, 9 + (3 if r_col else 0))


def three_section(edges: pd.DataFrame, rel: dict[str, str], row: str | None) -> str:
    """The report's three-model section: Table 3's layout (the paper's ``row`` below) and both figures."""
    n = edges["triple"].nunique()
    return f"""
## Three models (Table 3 layout; test split, max over λ, {n} triple(s))

θb and θc are each aligned to θa; b–c is the pair never matched to each other.

{table3(edges, row)}

![three-model barriers]({rel["three"]})

![landscape]({rel["landscape"]})
"""


def plot_landscape(plane: pd.DataFrame, path: Path, *, dpi: int = 120, quantity: str = "acc") -> Path:
    """Test accuracy (or loss) on the plane through θa, π_b(θb), π_c(θc), one panel per method,
    for the first triple; orthonormal in-plane coordinates, the three models marked (Figure 17)."""
    triple = plane["triple"].iloc[0]
    sub = plane[plane["triple"] == triple]
    methods = list(dict.fromkeys(sub["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.3 * len(methods), 3.9), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
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
    """Test loss and accuracy barriers (max over λ) on each edge a–b, a–c, b–c per method (Table 3),
    and R_0.3 of each edge when present (Figure 5)."""
    panels = [
        ("test_loss_barrier_max", "test loss barrier"),
        ("test_acc_barrier_max", "test accuracy barrier (points)"),
    ]
    if "R_0.3" in edges:
        panels.append(("R_0.3", "R_0.3 (alignment)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    methods = list(dict.fromkeys(edges["method"]))
    edge_names = ["a-b", "a-c", "b-c"]
    width = 0.8 / len(methods)
    for ax, (col, name) in zip(axes, panels, strict=True):
        for i, method in enumerate(methods):
            g = edges[edges["method"] == method].groupby("edge")[col]
            mean, std = mean_std(g)
            mean, std = mean.reindex(edge_names), std.reindex(edge_names).fillna(0)
            xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(3)]
            ax.bar(xs, mean.values, width, yerr=std.values, label=label(method), capsize=3)
        ax.set_xticks(range(3), ["a–π_b(b)", "a–π_c(c)", "π_b(b)–π_c(c)"])
        ax.set(ylabel=name)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("Three-model connectivity: b and c are aligned to a only (mean ± std over triples)")
    return _save(fig, path, dpi)
