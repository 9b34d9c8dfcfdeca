"""The CKA of a run in the report: the figure, a layer × method heat map of CKA(θa, θ(½)) — how similar
the merged midpoint's hidden representations are to θa's — beside the endpoints' own CKA(θa, θb), read
from the saved ``cka`` table only (mean over pairs), and the report's section with its table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lmclab.report.paper_tables import marked, mean_pm
from lmclab.report.plots import _save, label


def cka_grid(cka: pd.DataFrame, methods: list[str]) -> pd.DataFrame:
    """Rows: layers in depth order; columns: ``θa vs θb`` (the endpoints, any method) then each method's
    ``θa vs θ(½)``; values: the mean over pairs."""
    mean = cka.groupby(["depth", "layer", "method", "pair"], sort=True)["cka"].mean().reset_index()
    ends = mean[mean["pair"] == "a-b"].groupby(["depth", "layer"])["cka"].mean().rename("θa vs θb")
    mids = mean[mean["pair"] == "a-mid"].pivot_table(index=["depth", "layer"], columns="method", values="cka")
    grid = pd.concat([ends, mids[[m for m in methods if m in mids]]], axis=1)
    return grid.rename(columns={m: f"{label(m)}: θa vs θ(½)" for m in methods}).droplevel("depth")


def plot_cka(cka: pd.DataFrame, path: Path, *, methods: list[str], dpi: int = 120) -> Path:
    grid = cka_grid(cka, methods)
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * grid.shape[1], 1.2 + 0.45 * grid.shape[0]))
    image = ax.imshow(grid.to_numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=8)
    for (i, j), value in pd.DataFrame(grid.to_numpy()).stack().items():
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white" if value < 0.6 else "black")
    fig.colorbar(image, ax=ax, label="linear CKA (test split)")
    ax.set_title("CKA of the hidden layers: endpoints, and θa vs the merged midpoint")
    return _save(fig, path, dpi)


def cka_section(figure: str, pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """Mean CKA over the hidden layers per pair of models (mean ± std over seed pairs), and the figure."""
    keys = [
        ("cka_a_b", "θa, θb"),
        ("cka_a_pi_b", "θa, π(θb)"),
        ("cka_a_mid", "θa, θ(½)"),
        ("cka_pi_b_mid", "π(θb), θ(½)"),
    ]
    rows = [
        f"| {marked(m)} | " + " | ".join(mean_pm(pairs[pairs["method"] == m][k], 3) for k, _ in keys) + " |"
        for m in methods
        if "cka_a_b" in pairs
    ]
    return f"""
## Functional similarity: CKA of the hidden layers

Linear CKA (Kornblith et al. 2019) between hidden representations on the test split, mean over the
hidden layers. It is blind to permutations, so (θa, θb) and (θa, π(θb)) agree; what alignment changes
is how much the merged midpoint θ(½) still computes what the endpoints compute.

| method | {" | ".join(name for _, name in keys)} |
|---|---|---|---|---|
{chr(10).join(rows)}

![cka]({figure})
"""
