"""The transformer study (docs "Transformers and MAE"): supervised ViTs against ViTs pretrained
as masked autoencoders, every method, with and without REPAIR — run by hand, not a DVC stage: its
inputs are two finished runs of the pipeline.

    git clone . ../run-vit && cd ../run-vit && lmclab preset vit && dvc repro   # and the same with mae
    lmclab study transformer collect --run supervised=../run-vit --run mae=../run-mae

``collect`` reads each run's ``data/tables/pairs.parquet`` (written by its summarize stage), its
permutations (``data/perms/<pair>/<method>/perm.pt``: the fraction of ``P_res`` left at the identity),
its training histories and its params.yaml, and writes ``reports/transformers/``: ``table.parquet``
(:func:`lmclab.studies.transformer_study.study_table`), ``runs.json`` (each run's commit, model,
training and time per epoch) and ``transformers.md``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lmclab.pipeline.stage import one_line_errors, parse_yaml

if TYPE_CHECKING:  # the command's modules load what they compute with when it runs (`lmclab --help` stays quick)
    import pandas as pd

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
REBUILD = (
    "Rebuilt by running the pipeline with `lmclab preset vit` and with `lmclab preset mae` "
    "(each in its own clone, `dvc repro`), then `lmclab study transformer collect --run "
    "supervised=<vit clone> --run mae=<mae clone>`."
)


TITLE = "# Transformer study: supervised and MAE-pretrained ViTs"
TITLE_ORTHOGONAL = "# Transformer study: a supervised ViT aligned by permutations and by orthogonal maps"
REBUILD_ORTHOGONAL = (
    "Rebuilt by running the pipeline with `lmclab preset vit` (`dvc repro`), rerunning a copy of that run with "
    "`permute.symmetry: orthogonal` (docs/transformers.md), then `lmclab study transformer collect --run "
    "supervised=<vit clone> --run orthogonal=<its copy> --out reports/transformers/orthogonal`."
)


def _pairs(run: Path) -> pd.DataFrame:
    import pandas as pd
    import torch

    from lmclab.studies.transformer_study import identity_fraction

    pairs = pd.read_parquet(run / "data" / "tables" / "pairs.parquet")
    fractions = []
    for _, r in pairs.iterrows():
        perm = torch.load(run / "data" / "perms" / r["pair"] / r["method"] / "perm.pt", weights_only=True)
        fractions.append(identity_fraction(perm, "P_res"))
    return pairs.assign(p_res_identity=fractions)


def _run_info(run: Path) -> dict:
    import pandas as pd

    params = parse_yaml((run / "params.yaml").read_text())
    history = pd.concat(pd.read_parquet(p) for p in sorted((run / "data" / "history").glob("*.parquet")))
    last = history[history["epoch"] == history["epoch"].max()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run, capture_output=True, text=True)
    return {
        "commit": commit.stdout.strip(),
        "objective": params["train"]["objective"],
        "vit": params["model"]["vit"],
        "mae": params["train"]["mae"] if params["train"]["objective"] == "mae" else None,
        "epochs": params["train"]["epochs"],
        "seeds": len(params["train"]["seeds"]),
        "final_test_loss": float(last["test_loss"].mean()),
        "final_test_acc": float(last["test_acc"].mean()) if last["test_acc"].notna().any() else None,
        "seconds_per_epoch": float(history["seconds"].mean()) if "seconds" in history else None,
        "symmetry": params["permute"].get("symmetry", "permutation"),  # a run before the key: permutations
    }


def markdown(
    table: pd.DataFrame,
    runs: dict[str, dict],
    widths: pd.DataFrame | None = None,
    families: pd.DataFrame | None = None,
) -> str:
    """The page: the runs, the table of the runs named in it, and (:mod:`lmclab.cli.studies.transformer_orthogonal`)
    the barrier by width, by family of layers and beside Theus et al. where measured."""
    from lmclab.cli.studies.transformer_orthogonal import orthogonal_sections
    from lmclab.report.plots import label
    from lmclab.studies.transformer_study import COLUMNS, markdown_table, shown_columns

    rotated = any(info.get("symmetry", "permutation") != "permutation" for info in runs.values())
    lines = [TITLE_ORTHOGONAL if rotated else TITLE, "", REBUILD_ORTHOGONAL if rotated else REBUILD, ""]
    lines += [_run_line(name, info) for name, info in runs.items()]
    lines += [
        "",
        "Mean ± std over pairs (θ(λ) = λ·θa + (1−λ)·π(θb); test split):",
        "",
        markdown_table(table, label),
        "",
    ]
    lines += [f"- **{k}**: {meaning}" for k, (_, meaning) in COLUMNS.items() if k in shown_columns(table)]
    lines += [
        "",
        "B is the test cross-entropy barrier of the supervised run and the test reconstruction-loss barrier "
        "(MSE on masked patches, fixed masks) of the MAE run: compare methods within a run, not the runs' B. "
        "The MAE run's accuracy barriers are those of a linear probe and a kNN classifier fitted on the "
        "encoder's class-token features at each λ.",
        "",
    ]
    return "\n".join(lines + orthogonal_sections(table, runs, widths, families))


def _run_line(name: str, info: dict) -> str:
    """A run's line on the page: its commit, model, training, final loss and how it aligned."""
    vit = info["vit"]
    model = f"patch {vit['patch_size']}, width {vit['width']}, depth {vit['depth']}, {vit['heads']} heads"
    mae = info["mae"]
    what = f"MAE (decoder {mae['decoder_width']} × {mae['decoder_depth']}, mask {mae['mask_ratio']})" if mae else ""
    acc = f", test accuracy {100 * info['final_test_acc']:.1f} %" if info["final_test_acc"] is not None else ""
    return (
        f"- **{name}** (commit {info['commit']}): ViT {model}, {what or 'supervised'}, {info['epochs']} epochs, "
        f"{info['seeds']} seeds; final test loss {info['final_test_loss']:.4f}{acc}{_aligned(info)}."
    )


def _aligned(info: dict) -> str:
    """How a run aligned: nothing for permutations; for orthogonal maps, the forms and groups they act on."""
    if info.get("symmetry", "permutation") == "permutation":
        return ""
    return (
        "; aligned with `permute.symmetry: orthogonal` (both endpoints' canonical forms, LayerNorm gains folded: "
        "the stream by centred orthogonal maps, the heads by orthogonal maps inside them, the MLP units permuted; "
        "`identity` is the naive interpolation of the canonical forms)"
    )


@app.command()
@one_line_errors
def collect(
    run: list[str] = typer.Option(..., help="NAME=DIR of a finished run (repeat; in the table's order)"),
    width: list[Path] = typer.Option([], help="a finished run of the preset at another width (repeat)"),
    out: Path = typer.Option(Path("reports/transformers")),
) -> None:
    """Build reports/transformers/ from finished runs (and the barrier by width from the --width runs)."""
    from lmclab.cli.studies.transformer_orthogonal import collect_widths, run_families
    from lmclab.studies.transformer_study import study_table

    dirs = {}
    for item in run:
        name, sep, folder = item.partition("=")
        if not sep or not _finished(Path(folder)):
            raise ValueError(
                f"--run: expected NAME=DIR of a finished run (DIR/data/tables/pairs.parquet), got {item!r}"
            )
        dirs[name] = Path(folder)
    for folder in width:
        if not _finished(folder):
            raise ValueError(f"--width: expected a finished run (DIR/data/tables/pairs.parquet), got {str(folder)!r}")
    table = study_table({name: _pairs(d) for name, d in dirs.items()})
    runs = {name: _run_info(d) for name, d in dirs.items()}
    widths, extra = collect_widths(table, runs, {folder: _run_info(folder) for folder in width}, _pairs)
    families = run_families(dirs, runs)
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "table.parquet", index=False)
    (out / "runs.json").write_text(json.dumps(runs | extra, indent=2) + "\n")
    for name, frame in (("widths", widths), ("families", families)):
        if frame is not None:
            frame.to_parquet(out / f"{name}.parquet", index=False)
    if widths is not None:
        from lmclab.cli.studies.transformer_orthogonal import study_label
        from lmclab.report.plots_lm import plot_widths

        plot_widths(widths, out / "widths.png", study_label, unit="nats per image")
    (out / "transformers.md").write_text(markdown(table, runs | extra, widths, families))
    typer.echo(f"{out}: {len(table)} rows from {len(runs)} runs")


def _finished(folder: Path) -> bool:
    return (folder / "data" / "tables" / "pairs.parquet").is_file()
