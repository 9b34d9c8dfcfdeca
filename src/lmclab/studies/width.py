"""Width study (Appendix H.4): combine the tables of several runs that differ in model width.

Each run is one ``dvc exp`` (``-S model.mlp.width=…`` or ``model.<arch>.width_multiplier``);
:func:`width_tables` takes ``{width: tables}`` with each run's ``spectrum``, ``energy`` and
``pairs`` tables and returns one table per figure: the normalised singular value distribution
(Figure 10), the input energy (Figures 11, 12) and R_0 / R_0.3 with and without matching (Figure 13).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd


def normalised_spectrum(spectrum: pd.DataFrame) -> pd.DataFrame:
    """Per seed and layer: ``s_i / s_1`` against the relative index ``i / n`` (Figure 10)."""
    frame = spectrum.copy()
    by = frame.groupby(["seed", "layer"])
    frame["relative_index"] = frame["index"] / by["index"].transform("max").clip(lower=1)
    frame["normalised_value"] = frame["singular_value"] / by["singular_value"].transform("max")
    return frame


def width_tables(
    runs: Mapping[int, Mapping[str, pd.DataFrame]], methods: Sequence[str] = ("identity", "wm", "wm_sinkhorn")
) -> dict[str, pd.DataFrame]:
    """``{"spectrum", "energy", "alignment"}``: every run's rows with a ``width`` column; alignment
    holds the mean and std over pairs of every ``R_γ`` column per width and method."""
    spectra, energies, alignment = [], [], []
    for width, tables in sorted(runs.items()):
        spectra.append(normalised_spectrum(tables["spectrum"]).assign(width=width))
        energy = tables["energy"].copy()
        energy["relative_index"] = energy["index"] / energy.groupby(["seed", "layer"])["index"].transform("max").clip(
            lower=1
        )
        energies.append(energy.assign(width=width))
        pairs = tables["pairs"]
        r_cols = [c for c in pairs.columns if c.startswith("R_") and c.count("_") == 1]
        for method in methods:
            rows = pairs[pairs["method"] == method]
            if rows.empty:
                continue
            entry: dict = {
                "width": width,
                "method": method,
                "n_pairs": len(rows),
                "test_loss_barrier_mid": float(rows["test_loss_barrier_mid"].mean()),
            }
            for col in r_cols:
                entry[f"{col}_mean"] = float(rows[col].mean())
                entry[f"{col}_std"] = float(rows[col].std(ddof=1)) if len(rows) > 1 else 0.0
            alignment.append(entry)
    return {
        "spectrum": pd.concat(spectra, ignore_index=True),
        "energy": pd.concat(energies, ignore_index=True),
        "alignment": pd.DataFrame(alignment),
    }


def alignment_markdown(alignment: pd.DataFrame) -> str:
    """The Figure 13 numbers as a Markdown table: one row per width and method."""
    r_cols = [c.removesuffix("_mean") for c in alignment.columns if c.startswith("R_") and c.endswith("_mean")]
    lines = ["| width | method | test B_½ | " + " | ".join(r_cols) + " |", "|---|---|---|" + "---|" * len(r_cols)]
    for _, r in alignment.iterrows():
        cells = " | ".join(f"{r[c + '_mean']:.3f} ± {r[c + '_std']:.3f}" for c in r_cols)
        lines.append(f"| {int(r['width'])} | {r['method']} | {r['test_loss_barrier_mid']:.3f} | {cells} |")
    return "\n".join(lines)
