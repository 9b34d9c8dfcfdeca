"""The width sweep of the language-model study's orthogonal page: runs of the preset at other widths (the study's
sweep settings, six seeds), aligned with ``permute.symmetry: orthogonal`` and, in copies, by the sweep's permutation
methods (each width's two runs the same trained models: the orthogonal run must end at the permutation methods'
final test loss); a width without its permutation run reads them from the study's own sweep (``sweep.parquet`` of
the study's page); the preset's width from the page's main runs.

    lmclab study lm orthogonal --run ../run-lm --orthogonal ../run-lm-orthogonal \\
        --width 32=../run-w32 --width 32=../run-ow32 --width 128=../run-w128 --width 128=../run-ow128

(the runs as docs/language-models.md makes them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from lmclab.cli.studies.lm_page import run_info, run_table
from lmclab.pipeline.stage import parse_yaml
from lmclab.studies.lm_study import CALIBRATED, COLUMNS, ORTHOGONAL, method_table, orthogonal_points, study_points

PERMUTATION = ("identity", "wm", "am", "wm_sinkhorn")  # the study's sweep methods
ORTHOGONAL_METHODS = ("identity", "wm", "am", "ste")
ORDER = (*PERMUTATION, *(m + ORTHOGONAL for m in ORTHOGONAL_METHODS))
SAME_LOSS = 1e-9  # relative: the same trained models end at the same final test loss
VALUES = ("B_mid", "B_mid_std", "B_mid_C", "B_mid_C_std", "pairs")
SWEPT = ("method", "B_half", "B_half_std", "final_test_loss")  # the columns of the study's sweep read here


def width_runs(items: list[str]) -> dict[int, dict[str, Path]]:
    """``--width 32=../run-ow32`` items as ``{32: {"orthogonal": Path}}``, each run under its ``permute.symmetry``
    (a run of the preset at that width aligned by permutations replaces the study's sweep there); a one-line error
    for anything else, or for two runs of one width and symmetry."""
    runs: dict[int, dict[str, Path]] = {}
    for item in items:
        value, sep, path = item.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"--width: expected WIDTH=FOLDER, got {item!r}")
        params = Path(path) / "params.yaml"
        if not params.is_file():
            raise ValueError(f"--width {value}: {path} is no run (no params.yaml)")
        symmetry = parse_yaml(params.read_text()).get("permute", {}).get("symmetry", "permutation")
        if symmetry in runs.setdefault(int(value), {}):
            raise ValueError(f"--width {value}: two runs aligned by {symmetry} ({runs[int(value)][symmetry]}, {path})")
        runs[int(value)][symmetry] = Path(path)
    return runs


def width_table(
    sweep: pd.DataFrame | None, table: pd.DataFrame, preset_width: int, runs: Mapping[int, Mapping[str, Path]]
) -> pd.DataFrame:
    """One row per width and method: test B½ (mean, std over pairs), its circuit-space counterpart where
    measured, and the pairs — the permutation methods from the width's run aligned by permutations where ``runs``
    has one, else from the study's ``sweep`` (None: the study has no sweep yet; the preset's width from ``table``,
    the page's per-method table), the orthogonal ones (``<method>@orthogonal``) from each orthogonal run."""
    if preset_width in runs:
        raise ValueError(f"--width {preset_width}: the preset's own width (its runs: --run, --orthogonal)")
    rows = []
    sweep = pd.DataFrame(columns=["sweep", "value", *SWEPT]) if sweep is None else sweep
    widths = sweep[sweep["sweep"] == "width"]
    for width in sorted({preset_width, *runs, *widths["value"].astype(int)}):
        if width == preset_width:
            found = table[table["method"].isin([*PERMUTATION, *(m + ORTHOGONAL for m in ORTHOGONAL_METHODS)])]
        else:
            found, loss = _permutations(widths, width, runs.get(width, {}).get("permutation"))
            if "orthogonal" in runs.get(width, {}):
                found = pd.concat([found, _orthogonal(runs[width]["orthogonal"], loss, width)], ignore_index=True)
        for _, r in found.iterrows():
            rows.append({"width": width, "method": r["method"], **{k: r.get(k, math.nan) for k in VALUES}})
    rank = {m: i for i, m in enumerate(ORDER)}  # the permutation methods, then the orthogonal ones
    return pd.DataFrame(rows).sort_values(["method", "width"], key=lambda c: c.map(rank) if c.name == "method" else c)


def _permutations(widths: pd.DataFrame, width: int, run: Path | None) -> tuple[pd.DataFrame, float | None]:
    """The permutation methods at ``width`` and their models' final test loss: the ``run``'s (checked to be at
    that width), else the study's sweep's (None: neither)."""
    if run is not None:
        info = run_info(run)
        if info["gpt"]["width"] != width:
            raise ValueError(f"--width {width}: {run} is a run at width {info['gpt']['width']}")
        picked = method_table(study_points(run_table(run, "pairs"), COLUMNS | CALIBRATED))
        return picked[picked["method"].isin(PERMUTATION)], info["final_test_loss"]
    at = widths[widths["value"] == width]
    picked = at[at["method"].isin(PERMUTATION)]
    found = {"method": picked["method"], "B_mid": picked["B_half"], "B_mid_std": picked["B_half_std"]}
    return pd.DataFrame({**found, "pairs": math.nan}), float(at["final_test_loss"].iloc[0]) if len(at) else None


def _orthogonal(run: Path, loss: float | None, width: int) -> pd.DataFrame:
    """The orthogonal run's per-method table, after checking it trained the models (final test ``loss``) of the
    permutation methods at ``width``."""
    info = run_info(run)
    if info["gpt"]["width"] != width or (loss is not None and abs(info["final_test_loss"] / loss - 1) > SAME_LOSS):
        raise ValueError(f"--width {width}: {run} trained other models than the permutation methods' at {width}")
    return method_table(orthogonal_points(run_table(run, "pairs")))


def width_markdown(widths: pd.DataFrame, name, order: Sequence[str] = ORDER) -> str:
    """Rows: widths; columns: every method's test B½ (mean ± std; circuit space in brackets where measured), in
    ``order``, and the numbers of pairs at that width (``sweep``: read from the study's sweep)."""
    methods = [m for m in order if m in set(widths["method"])]
    lines = ["| width | " + " | ".join(name(m) for m in methods) + " | pairs |", "|---" * (len(methods) + 2) + "|"]
    for width, at in widths.groupby("width", sort=True):
        cells = []
        for m in methods:
            r = at[at["method"] == m]
            cells.append(_cell(r.iloc[0]) if len(r) else "—")
        counted = [str(int(p)) for p in sorted(set(at["pairs"].dropna()))]
        pairs = " / ".join(counted + ["sweep"] * bool(at["pairs"].isna().any()))  # the sweep's table has no count
        lines.append(f"| {width} | " + " | ".join(cells) + f" | {pairs} |")
    return "\n".join(lines)


def _cell(r: pd.Series) -> str:
    text = f"{r['B_mid']:.3f}" + ("" if math.isnan(r["B_mid_std"]) else f" ± {r['B_mid_std']:.3f}")
    return text + ("" if math.isnan(r["B_mid_C"]) else f" ({r['B_mid_C']:.3f})")
