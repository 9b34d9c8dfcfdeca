"""The width sweep of the language-model study's orthogonal page: lighter runs of the preset at other widths
(the study's sweep settings), rerun with ``permute.symmetry: orthogonal``, beside the permutation methods of the
study's own width sweep (``sweep.parquet`` of the study's page, the same trained models: each run's endpoints
must end at the sweep's final test loss) and the preset's width from the page's main runs.

    ORTHOGONAL="-S permute.symmetry=orthogonal -S permute.methods=[identity,wm,am,ste] \\
        -S measure.calibrate_temperature=true -S measure.circuits=true"
    sweep run-ow32 -S model.gpt.width=32 $ORTHOGONAL; sweep run-ow128 -S model.gpt.width=128 $ORTHOGONAL
    lmclab study lm orthogonal --run ../run-lm --orthogonal ../run-lm-orthogonal \\
        --width 32=../run-ow32 --width 128=../run-ow128

(``sweep`` and ``SWEEP`` as docs/language-models.md defines them.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from lmclab.cli.studies.lm_page import run_info, run_table
from lmclab.studies.lm_study import ORTHOGONAL, method_table, orthogonal_points

PERMUTATION = ("identity", "wm", "am", "wm_sinkhorn")  # the study's sweep methods
ORTHOGONAL_METHODS = ("identity", "wm", "am", "ste")
ORDER = (*PERMUTATION, *(m + ORTHOGONAL for m in ORTHOGONAL_METHODS))
SAME_LOSS = 1e-9  # relative: the same trained models end at the same final test loss
VALUES = ("B_mid", "B_mid_std", "B_mid_C", "B_mid_C_std", "pairs")
SWEPT = ("method", "B_half", "B_half_std", "final_test_loss")  # the columns of the study's sweep read here


def width_runs(items: list[str]) -> dict[int, Path]:
    """``--width 32=../run-ow32`` items as ``{32: Path}``; a one-line error for anything else."""
    runs = {}
    for item in items:
        value, sep, path = item.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"--width: expected WIDTH=FOLDER, got {item!r}")
        runs[int(value)] = Path(path)
    return runs


def width_table(
    sweep: pd.DataFrame | None, table: pd.DataFrame, preset_width: int, runs: Mapping[int, Path]
) -> pd.DataFrame:
    """One row per width and method: test B½ (mean, std over pairs), its circuit-space counterpart where
    measured, and the pairs — the permutation methods from the study's ``sweep`` (None: the study has no sweep
    yet; the preset's width from ``table``, the page's per-method table), the orthogonal ones
    (``<method>@orthogonal``) from each run."""
    rows = []
    sweep = pd.DataFrame(columns=["sweep", "value", *SWEPT]) if sweep is None else sweep
    widths = sweep[sweep["sweep"] == "width"]
    for width in sorted({preset_width, *runs, *widths["value"].astype(int)}):
        if width == preset_width:
            found = table[table["method"].isin([*PERMUTATION, *(m + ORTHOGONAL for m in ORTHOGONAL_METHODS)])]
        else:
            found = _permutation(widths[widths["value"] == width])
            if width in runs:
                found = pd.concat([found, _orthogonal(runs[width], widths, width)], ignore_index=True)
        for _, r in found.iterrows():
            rows.append({"width": width, "method": r["method"], **{k: r.get(k, math.nan) for k in VALUES}})
    rank = {m: i for i, m in enumerate(ORDER)}  # the permutation methods, then the orthogonal ones
    return pd.DataFrame(rows).sort_values(["method", "width"], key=lambda c: c.map(rank) if c.name == "method" else c)


def _permutation(at: pd.DataFrame) -> pd.DataFrame:
    picked = at[at["method"].isin(PERMUTATION)]
    return pd.DataFrame(
        {"method": picked["method"], "B_mid": picked["B_half"], "B_mid_std": picked["B_half_std"], "pairs": math.nan}
    )


def _orthogonal(run: Path, widths: pd.DataFrame, width: int) -> pd.DataFrame:
    """The orthogonal run's per-method table, after checking it trained the sweep's models at ``width``."""
    info, theirs = run_info(run), widths.loc[widths["value"] == width, "final_test_loss"]
    if info["gpt"]["width"] != width or (
        len(theirs) and abs(info["final_test_loss"] / float(theirs.iloc[0]) - 1) > SAME_LOSS
    ):
        raise ValueError(f"--width {width}: {run} trained other models than the study's width-{width} run")
    return method_table(orthogonal_points(run_table(run, "pairs")))


def width_markdown(widths: pd.DataFrame, name, order: Sequence[str] = ORDER) -> str:
    """Rows: widths; columns: every method's test B½ (mean ± std; circuit space in brackets where measured), in
    ``order``."""
    methods = [m for m in order if m in set(widths["method"])]
    lines = ["| width | " + " | ".join(name(m) for m in methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for width, at in widths.groupby("width", sort=True):
        cells = []
        for m in methods:
            r = at[at["method"] == m]
            cells.append(_cell(r.iloc[0]) if len(r) else "—")
        lines.append(f"| {width} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(r: pd.Series) -> str:
    text = f"{r['B_mid']:.3f}" + ("" if math.isnan(r["B_mid_std"]) else f" ± {r['B_mid_std']:.3f}")
    return text + ("" if math.isnan(r["B_mid_C"]) else f" ({r['B_mid_C']:.3f})")
