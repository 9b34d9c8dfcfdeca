"""The language-model study's page on orthogonal maps (docs "Language models"): the preset's models aligned
once by permutations (the preset's run) and once with ``permute.symmetry: orthogonal`` (a copy of that run,
its trained models reused), every method's barriers side by side, R_0.3 by part of the model, and each method's
reduction of the naive barrier beside Theus et al.'s Table 2 (2025).

    cp -a ../run-lm ../run-lm-orthogonal && cd ../run-lm-orthogonal && dvc exp run \\
        -S permute.symmetry=orthogonal -S 'permute.methods=[identity,wm,am,ste,ste_sinkhorn]' \\
        -S permute.ste_sinkhorn.init=wm -S permute.ste_sinkhorn.lam_spread=0.1 -S permute.ste_sinkhorn.epochs=5 \\
        -S 'three.methods=[wm]' \\
        -S measure.calibrate_temperature=true -S measure.circuits=true
    lmclab study lm orthogonal --run ../run-lm --orthogonal ../run-lm-orthogonal

writes ``orthogonal.parquet`` (per method), ``orthogonal_roles.parquet``, ``orthogonal_runs.json`` and
``orthogonal.md`` beside the study's page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import typer

from lmclab.cli.studies.lm_learned import (
    LEARNED_NOTE,
    families_markdown,
    family_table,
    learned_markdown,
    learned_table,
)
from lmclab.cli.studies.lm_page import HEADERS, method_markdown, role_markdown, run_info, run_table
from lmclab.cli.studies.lm_widths import width_markdown, width_table
from lmclab.report.plots import label
from lmclab.report.plots_lm import plot_widths
from lmclab.studies.lm_study import (
    CALIBRATED,
    COLUMNS,
    ORTHOGONAL,
    method_table,
    orthogonal_points,
    relative_reductions,
    role_table,
    study_points,
)

SHOWN = ["B_mid", "B_mid_repair", "B_mid_T", "B_mid_C", "B_max", "ppl_mid", "acc_mid", "l2_reduction", "R_0.3"]
SHOWN += ["search_s"]
TITLES = HEADERS | {"B_mid_T": "B½ T-calibrated", "B_mid_C": "B½ circuits"}
MEANINGS = {k: meaning for k, (_, _, meaning) in (COLUMNS | CALIBRATED).items()}
FORMS = (
    "The orthogonal run aligns both endpoints' canonical forms (the tied head untied, the LayerNorm gains folded "
    "into the layers that read them): the stream by an orthogonal map that fixes the all-ones vector (centred, as "
    "LayerNorm allows), the heads by orthogonal maps inside them, the MLP units by permutations; its naive row "
    "interpolates the canonical forms, which compute the checkpoints' functions. Its STE is learned matching "
    "whose projections are weight matching over the mixed group (Theus et al. 2025, Algorithm 1); its STE "
    "Sinkhorn, where the run has it, trains the paper's soft permutations beside exact orthogonal maps, each "
    "parameterised by a latent matrix (docs: Symmetries)."
)

ROLES_NOTE = (
    "R_γ keeps the singular triplets of a layer with s ≥ γ × the model's largest singular value (Theorem 4.1), "
    "and a part with none kept in a pair has no R_γ there (—, or fewer pairs). In the canonical forms the folded "
    "gains enlarge the largest singular values (the final gain folded into the untied head), so fewer layers keep "
    "a triplet, and R_γ of those rows rests on them alone."
)


WIDTHS_FIGURE = "![test B½ against width, permutations (solid) and orthogonal maps (dashed)](orthogonal_widths.png)"
WIDTHS_NOTE = (
    "Test B½ per width (mean ± std over pairs, their number in the last column; in brackets, in circuit space where "
    "measured), no REPAIR: the permutation methods from a run of the preset at that width aligned by permutations "
    "where the page has one, else from the study's width sweep (4 seeds, 2 pairs); the orthogonal ones from the "
    "same models aligned with `permute.symmetry: orthogonal` (each run checked to end at the permutation methods' "
    "final test loss: the same trained models); at the preset's width its own runs."
)


def study_label(method: str) -> str:
    """A method's name on the page: the report's, followed by ``, orthogonal`` for the orthogonal run's."""
    base, _, kind = method.partition("@")
    if kind and base == "identity":
        return "naive, canonical forms"
    return f"{label(base)}, {kind}" if kind else label(base)


def family_label(method: str) -> str:
    """:func:`study_label`, keeping a learned run's settings (``ste@orthogonal, 15 epochs, λ ± 0.1``)."""
    base, sep, settings = method.partition(", ")
    return study_label(base) + sep + settings


def same_models(info: dict, preset: dict, folder: Path) -> dict:
    """``info`` of the orthogonal run in ``folder``, unless it trained other models than the preset's run."""
    keys = ("commit", "search_seconds")
    if {k: v for k, v in info.items() if k not in keys} != {k: v for k, v in preset.items() if k not in keys}:
        raise ValueError(f"--orthogonal: {folder} trained other models than --run (expected the preset's run)")
    return info


def build(
    run: Path, orthogonal: Path, out: Path, widths: dict[int, Path] | None = None, learned: Sequence[Path] = ()
) -> None:
    """The orthogonal page in ``out`` from the preset's finished ``run`` and its ``orthogonal`` copy (and the width
    sweep's ``widths`` runs aligned so, :mod:`lmclab.cli.studies.lm_widths`; the ``learned`` copies of
    ``orthogonal`` with other settings of learned matching, :mod:`lmclab.cli.studies.lm_learned`)."""
    from lmclab.core.atomic import write_json, write_table, write_text

    runs = {"preset": run_info(run)}
    runs["orthogonal"] = same_models(run_info(orthogonal), runs["preset"], orthogonal)
    points = pd.concat(
        [
            study_points(run_table(run, "pairs"), COLUMNS | CALIBRATED),
            orthogonal_points(run_table(orthogonal, "pairs")),
        ],
        ignore_index=True,
    )
    renamed = run_table(orthogonal, "alignment").assign(method=lambda t: t["method"] + ORTHOGONAL)
    table, roles = method_table(points), role_table(pd.concat([run_table(run, "alignment"), renamed]))
    sweep = pd.read_parquet(out / "sweep.parquet") if (out / "sweep.parquet").is_file() else None
    swept = width_table(sweep, table, runs["preset"]["gpt"]["width"], widths or {})
    write_table(out / "orthogonal.parquet", table)
    write_table(out / "orthogonal_roles.parquet", roles)
    write_table(out / "orthogonal_widths.parquet", swept)
    plot_widths(swept, out / "orthogonal_widths.png", study_label)
    settings = learned_table(orthogonal, learned, runs["preset"]) if learned else None
    families = family_table(run, orthogonal, learned)
    for name, frame in (("orthogonal_learned", settings), ("orthogonal_families", families)):
        if frame is not None:
            write_table(out / f"{name}.parquet", frame)
    write_json(out / "orthogonal_runs.json", runs)
    write_text(out / "orthogonal.md", markdown(table, roles, runs, swept, settings, families))
    typer.echo(f"{out / 'orthogonal.md'}: {len(table)} methods")


def markdown(
    table: pd.DataFrame,
    roles: pd.DataFrame,
    runs: dict,
    widths: pd.DataFrame,
    learned: pd.DataFrame | None = None,
    families: pd.DataFrame | None = None,
) -> str:
    """The page: the runs, the barriers per method, R_0.3 by part, the width sweep, learned matching's training
    and the barriers by family (when given), the reductions beside Theus et al.'s."""
    lines = [
        "# Language-model study: orthogonal maps of the stream and the heads",
        "",
        "Rebuilt by `lmclab study lm orthogonal` (docs/language-models.md) from the preset's run and its copy "
        "rerun with `permute.symmetry: orthogonal` (the same trained models).",
        "",
        _runs_line(runs["preset"], runs["orthogonal"]),
        "",
        FORMS,
        "",
        "## Barriers per method",
        "",
        "Mean ± std over pairs (θ(λ) = λ·θa + (1−λ)·π(θb); test split):",
        "",
        method_markdown(table, SHOWN, TITLES, study_label),
        "",
        *(f"- **{TITLES[k]}**: {MEANINGS[k]}" for k in SHOWN),
        "",
        f"## R_0.3 by part of the model\n\n{role_markdown(roles, study_label)}\n\n{ROLES_NOTE}",
        "",
        f"## Width\n\n{WIDTHS_NOTE}\n\n{width_markdown(widths, study_label)}\n\n{WIDTHS_FIGURE}",
        "",
        *optional_sections(learned, families),
        "## Beside Theus et al. (2025)",
        "",
        _theus_markdown(table),
        "",
    ]
    return "\n".join(lines)


def _runs_line(preset: dict, other: dict) -> str:
    gpt, train = preset["gpt"], preset["train"]
    return (
        f"- **preset** (commit {preset['commit']}) and **orthogonal** (commit {other['commit']}): GPT width "
        f"{gpt['width']}, depth {gpt['depth']}, {gpt['heads']} heads, {gpt['norm']}, tied embeddings "
        f"{gpt['tie_embeddings']}; {train['epochs']} epochs, {preset['seeds']} seeds; endpoints' final test loss "
        f"{preset['final_test_loss']:.4f} nats per token."
    )


def optional_sections(learned: pd.DataFrame | None, families: pd.DataFrame | None) -> list[str]:
    """The sections of the learned runs and of the barriers by family, for those given."""
    sections = []
    if learned is not None:
        sections += [f"## Training the learned alignment\n\n{LEARNED_NOTE}\n\n{learned_markdown(learned)}", ""]
    if families is not None:
        sections += [f"## Where the barrier is\n\n{families_markdown(families, family_label)}", ""]
    return sections


def _theus_markdown(table: pd.DataFrame) -> str:
    found = relative_reductions(table)
    lines = [
        "Each method's reduction of the naive (w/o) test B½, `100 (1 − B/B_naive)` %, beside Theus et al.'s "
        "reductions of their Table 2 (nats per BPE token on a 6-layer GPT-2 on TinyShakespeare; a ViT on CIFAR-10): "
        "their units and models differ, so the ratios compare, not the barriers.",
        "",
        "| method | test B½ | reduction % | their counterpart | GPT-2 reduction % | ViT reduction % |",
        "|---|---|---|---|---|---|",
    ]
    for _, r in found.iterrows():
        theirs = [
            "—" if math.isnan(r[f"{m}_reduction_pct"]) else f"{r[f'{m}_reduction_pct']:.1f}" for m in ("GPT-2", "ViT")
        ]
        row = [study_label(r["method"]), f"{r['B_mid']:.3f}", f"{r['reduction_pct']:.1f}", r["theirs"] or "—"]
        lines.append("| " + " | ".join(row + theirs) + " |")
    return "\n".join(lines)
