"""Two sections of the language-model study's orthogonal page: how much training the learned orthogonal alignment
gets (copies of the orthogonal run with other ``permute.ste`` settings, the same trained models), and where the
barrier each alignment leaves is (``measure.family_barriers``: :mod:`lmclab.analysis.families`).

    for setting in "15 0" "30 0" "5 0.1" "15 0.1"; do set -- $setting
        cp -a ../run-lm-orthogonal ../run-ste-$1-$2 && (cd ../run-ste-$1-$2 && dvc exp run \\
            -S permute.ste.epochs=$1 -S permute.ste.lam_spread=$2 -S measure.family_barriers=true)
    done
    lmclab study lm orthogonal --run ../run-lm --orthogonal ../run-lm-orthogonal \\
        --learned ../run-ste-15-0 --learned ../run-ste-30-0 --learned ../run-ste-5-0.1 --learned ../run-ste-15-0.1
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from lmclab.cli.studies.lm_page import run_info, run_table
from lmclab.pipeline.stage import parse_yaml
from lmclab.report.families import two_tables
from lmclab.studies.lm_study import ORTHOGONAL, method_table, orthogonal_points

LEARNED = f"ste{ORTHOGONAL}"
VALUES = ("B_mid", "B_mid_std", "B_mid_C", "B_mid_C_std", "B_mid_T", "B_mid_T_std", "search_s", "pairs")
LEARNED_NOTE = (
    "Learned orthogonal matching (STE over the mixed group, started from weight matching; Theus et al. 2025, "
    "Algorithm 1) trained for more epochs and at a merge weight drawn each step from U(½ − s, ½ + s) "
    "(`permute.ste.epochs`, `permute.ste.lam_spread`), on the same trained models (each run checked by its "
    "endpoints' final test loss); test B½ mean ± std over pairs, search seconds per pair."
)
FAMILIES_NOTE = (
    "The test loss barrier at λ = ½ of the path that moves one family of layers alone, θa elsewhere (Adilova et "
    "al. 2024), and the barrier left when every family but that one moves, θa's there, against the pair's own "
    "ends (`measure.family_barriers`); mean ± std over pairs; `(all)`: the whole path's, no repair; —: the "
    "family moves nowhere. The *all but* barrier drops by the family's share when it stops moving."
)


def ste_setting(run: Path) -> tuple[int, float]:
    """``(epochs, lam_spread)`` of ``permute.ste`` in ``run``'s params.yaml (a run before the option: 0)."""
    ste = parse_yaml((run / "params.yaml").read_text())["permute"]["ste"]
    return int(ste["epochs"]), float(ste.get("lam_spread", 0.0))


def learned_table(orthogonal: Path, runs: Sequence[Path], preset: dict) -> pd.DataFrame:
    """One row per setting of learned matching: the ``orthogonal`` run's and each of ``runs`` (copies of it that
    trained the ``preset`` run's models, else a one-line error naming ``--learned``), by epochs and λ range."""
    rows = []
    for run in (orthogonal, *runs):
        info = run_info(run)
        if run != orthogonal and abs(info["final_test_loss"] / preset["final_test_loss"] - 1) > 1e-9:
            raise ValueError(f"--learned: {run} trained other models than --run (expected a copy of --orthogonal)")
        table = method_table(orthogonal_points(run_table(run, "pairs"))).set_index("method")
        if LEARNED not in table.index:
            raise ValueError(f"--learned: {run} has no learned orthogonal alignment (permute.methods without ste)")
        epochs, spread = ste_setting(run)
        found = table.loc[LEARNED]
        rows.append({"epochs": epochs, "lam_spread": spread, **{k: found.get(k, math.nan) for k in VALUES}})
        rows[-1] |= {"commit": info["commit"]}
    return pd.DataFrame(rows).sort_values(["epochs", "lam_spread"], kind="stable", ignore_index=True)


def learned_markdown(table: pd.DataFrame) -> str:
    lines = [
        "| epochs | λ range | B½ | B½ circuits | B½ T-calibrated | search s | pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        cells = [pm(r, k) for k in ("B_mid", "B_mid_C", "B_mid_T")] + [f"{r['search_s']:.0f}", f"{r['pairs']:.0f}"]
        lam = "½" if r["lam_spread"] == 0 else f"U({0.5 - r['lam_spread']:g}, {0.5 + r['lam_spread']:g})"
        lines.append(f"| {r['epochs']:.0f} | {lam} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pm(row: pd.Series, key: str) -> str:
    value, std = row[key], row[f"{key}_std"]
    return "—" if pd.isna(value) else f"{value:.3f} ± {0.0 if pd.isna(std) else std:.3f}"


def family_table(run: Path, orthogonal: Path, learned: Sequence[Path]) -> pd.DataFrame | None:
    """The runs' barriers by family (the orthogonal runs' methods named ``<method>@orthogonal``; a learned run's
    alignment ``ste@orthogonal, E epochs, λ ± s``), None when no run measured them."""
    frames = []
    for folder, suffix in ((run, ""), (orthogonal, ORTHOGONAL), *((f, ORTHOGONAL) for f in learned)):
        if not (folder / "data" / "tables" / "families.parquet").is_file():
            continue
        found = run_table(folder, "families")
        if folder in learned:
            epochs, spread = ste_setting(folder)
            found = found[found["method"] == "ste"].assign(method=f"ste{ORTHOGONAL}, {epochs} epochs, λ ± {spread:g}")
        frames.append(found.assign(method=found["method"] + ("" if folder in learned else suffix)))
    return pd.concat(frames, ignore_index=True) if frames else None


def families_markdown(families: pd.DataFrame, name: Callable[[str], str]) -> str:
    return f"{FAMILIES_NOTE}\n\n{two_tables(families, name)}"
