"""The transformer study's orthogonal page beyond its table: the barrier by width (runs of the preset at other
widths, aligned by permutations and by orthogonal maps), where the barrier is (``measure.family_barriers``), and
each method's reduction of the naive barrier beside Theus et al.'s ViT (2025, Table 2).

    for w in 24 96; do git clone . ../run-vit-w$w && (cd ../run-vit-w$w && lmclab preset vit && dvc exp run \\
        -S model.vit.width=$w -S measure.circuits=true -S measure.family_barriers=true)
        cp -a ../run-vit-w$w ../run-vit-w$w-orthogonal && (cd ../run-vit-w$w-orthogonal && dvc exp run \\
        -S permute.symmetry=orthogonal -S 'permute.methods=[identity,wm,am,ste]' -S 'three.methods=[wm]' \\
        -S measure.calibrate_temperature=true); done
    lmclab study transformer collect --run supervised=../run-vit --run orthogonal=../run-vit-orthogonal \\
        --width ../run-vit-w24 --width ../run-vit-w24-orthogonal --width ../run-vit-w96 \\
        --width ../run-vit-w96-orthogonal --out reports/transformers/orthogonal
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from lmclab.cli.studies.lm_orthogonal import study_label
from lmclab.report.families import two_tables
from lmclab.studies.lm_study import ORTHOGONAL, relative_reductions

PERMUTATION = ("identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn")
ORDER = (*PERMUTATION, *(m + ORTHOGONAL for m in ("identity", "wm", "am", "ste")))
WIDTHS_NOTE = (
    "Test B½ per width of the stream (mean ± std over pairs; in brackets, in circuit space where measured): the "
    "preset's runs at its width and runs of the preset at other widths (their own trained models), each aligned by "
    "permutations and, in a copy, with `permute.symmetry: orthogonal`."
)
FAMILIES_NOTE = (
    "Test loss barrier at λ = ½ of the path that moves one family of layers alone, θa elsewhere (Adilova et al. "
    "2024), and the barrier left when every family but that one moves, θa's there, against the pair's own ends "
    "(`measure.family_barriers`); mean ± std over pairs; `(all)`: the whole path's, no repair; —: the family "
    "moves nowhere."
)
WIDTHS_FIGURE = "![test B½ against width, permutations (solid) and orthogonal maps (dashed)](widths.png)"
THEUS_NOTE = (
    "Each method's reduction of the supervised run's naive test B½, `100 (1 − B/B_naive)` %, beside Theus et al.'s "
    "reductions on a ViT on CIFAR-10 (their Table 2): models and data differ, so the ratios compare, not the "
    "barriers."
)


def named(method: str, info: Mapping) -> str:
    """``method`` of a run, suffixed ``@orthogonal`` when the run aligned by orthogonal maps."""
    return method + (ORTHOGONAL if info.get("symmetry", "permutation") == "orthogonal" else "")


def width_table(tables: Mapping[str, pd.DataFrame], runs: Mapping[str, dict]) -> pd.DataFrame:
    """One row per run's width and method: test B½ (and in circuit space) with their stds and the pairs, from each
    run's :func:`lmclab.studies.transformer_study.study_table` rows (``tables`` by run name)."""
    rows = []
    for name, table in tables.items():
        info = runs[name]
        for _, r in table.iterrows():
            values = {k: r.get(k, math.nan) for k in ("B_mid", "B_mid_std", "B_mid_C", "B_mid_C_std", "pairs")}
            rows.append({"width": info["vit"]["width"], "method": named(r["method"], info), **values})
    rank = {m: i for i, m in enumerate(ORDER)}
    frame = pd.DataFrame(rows)
    return frame.sort_values(["method", "width"], key=lambda c: c.map(rank) if c.name == "method" else c)


def families_markdown(families: pd.DataFrame) -> str:
    """The barriers by family of every run, *alone* and *all but* in a table each."""
    return f"{FAMILIES_NOTE}\n\n{two_tables(families, study_label)}"


def theus_markdown(table: pd.DataFrame, runs: Mapping[str, dict], width: int) -> str:
    """:func:`lmclab.studies.lm_study.relative_reductions` of the runs at ``width`` (the preset's), ViT column."""
    at = [(r, runs[r["run"]]) for _, r in table.iterrows() if runs[r["run"]]["vit"]["width"] == width]
    found = relative_reductions(pd.DataFrame([{"method": named(r["method"], i), "B_mid": r["B_mid"]} for r, i in at]))
    lines = [THEUS_NOTE, "", "| method | test B½ | reduction % | their counterpart | ViT reduction % |"]
    lines.append("|---|---|---|---|---|")
    for _, r in found.iterrows():
        theirs = "—" if math.isnan(r["ViT_reduction_pct"]) else f"{r['ViT_reduction_pct']:.1f}"
        cells = [study_label(r["method"]), f"{r['B_mid']:.3f}", f"{r['reduction_pct']:.1f}", r["theirs"] or "—"]
        lines.append("| " + " | ".join([*cells, theirs]) + " |")
    return "\n".join(lines)


def orthogonal_sections(
    table: pd.DataFrame,
    runs: Mapping[str, dict],
    widths: pd.DataFrame | None,
    families: pd.DataFrame | None,
) -> list[str]:
    """The page's sections after its table: widths (when other widths were run), families (when measured) and the
    reductions beside Theus et al. (when a run aligned by orthogonal maps)."""
    from lmclab.cli.studies.lm_widths import width_markdown

    width = next(iter(runs.values()))["vit"]["width"]
    out = []
    if widths is not None and widths["width"].nunique() > 1:
        out += ["## Width", "", WIDTHS_NOTE, "", width_markdown(widths, study_label, ORDER), "", WIDTHS_FIGURE, ""]
    if families is not None:
        out += ["## Where the barrier is", "", families_markdown(families), ""]
    if any(named("", i) for i in runs.values()):
        out += ["## Beside Theus et al. (2025)", "", theus_markdown(table, runs, width), ""]
    return out


def collect_widths(
    table: pd.DataFrame, runs: Mapping[str, dict], others: Mapping[Path, dict], pairs_of: Callable[[Path], pd.DataFrame]
) -> tuple[pd.DataFrame | None, dict[str, dict]]:
    """The width table of the page's runs (``table``) and of the ``others`` runs at other widths (their info by
    folder; ``pairs_of`` reads a folder's pairs), with the others' info by page name (``supervised, width 24``);
    None and no info when no other width was given."""
    from lmclab.studies.transformer_study import study_table

    if not others:
        return None, {}
    named_runs = {f"{_kind(i)}, width {i['vit']['width']}": (folder, i) for folder, i in others.items()}
    tables = {name: table[table["run"] == name] for name in runs}
    tables |= {name: study_table({name: pairs_of(folder)}) for name, (folder, _) in named_runs.items()}
    extra = {name: i for name, (_, i) in named_runs.items()}
    return width_table(tables, {**runs, **extra}), extra


def _kind(info: Mapping) -> str:
    return "orthogonal" if named("", info) else "supervised"


def run_families(dirs: Mapping[str, Path], runs: Mapping[str, dict]) -> pd.DataFrame | None:
    """The barriers by family of the runs that measured them (``families`` of each run's tables), each method
    named as on the page (:func:`named`); None when none did."""
    frames = []
    for name, folder in dirs.items():
        path = folder / "data" / "tables" / "families.parquet"
        if path.is_file():
            found = pd.read_parquet(path)
            frames.append(found.assign(method=found["method"].map(lambda m, i=runs[name]: named(m, i))))
    return pd.concat(frames, ignore_index=True) if frames else None
