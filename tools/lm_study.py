"""The language-model study (docs "Language models"): a byte-level GPT's barriers after every alignment, with
and without REPAIR, how the barrier after alignment changes with width and training length, and whether the
paper's explanation holds — run by hand, not a DVC stage: its inputs are finished runs of the pipeline.

    git clone . ../run-lm && cd ../run-lm && python tools/preset.py pydoc_gpt && dvc repro
    # each sweep run: the same clone procedure with the preset and the -S overrides of docs/language-models.md
    python tools/lm_study.py collect --run ../run-lm --width 32=../run-w32 --width 128=../run-w128 \\
        --epochs 2=../run-e2 --epochs 10=../run-e10

The preset's run is also the sweeps' point at its own width and epochs; a sweep compares the methods every one
of its runs has. ``collect`` reads each run's
``data/tables/{pairs,alignment,history}.parquet``, its params.yaml and commit, and writes ``reports/lm/``:
``points.parquet`` (the preset run's pairs, :func:`lmclab.studies.lm_study.study_points`), ``table.parquet``
(per method), ``roles.parquet`` (R_0.3 per residual stream, attention, MLP), ``sweep_points.parquet`` and
``sweep.parquet``, ``explanation.json``, ``trends.json``, ``runs.json``, ``lm.md`` and ``lm.png``.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pandas as pd
import typer

from lmclab.core.atomic import write_json, write_table, write_text
from lmclab.pipeline.stage import one_line_errors, parse_yaml
from lmclab.report.plots import label
from lmclab.report.plots_lm import plot_lm_study
from lmclab.studies.lm_study import (
    COLUMNS,
    explanation,
    method_table,
    role_table,
    study_points,
    sweep_points,
    sweep_summary,
    sweep_trends,
)

ROOT = Path(__file__).resolve().parent.parent
app = typer.Typer(add_completion=False)
REBUILD = (
    "Rebuilt by running the pipeline with `python tools/preset.py pydoc_gpt` (and the sweep runs of "
    "docs/language-models.md, each in its own clone, `dvc repro`), then `python tools/lm_study.py collect`."
)
ALIGNING = ("wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn")
HEADERS = {  # the table's column titles
    "B_mid": "B½",
    "B_mid_repair": "B½ REPAIR",
    "B_max": "B max",
    "B_max_repair": "B max REPAIR",
    "ppl_mid": "ppl B½",
    "ppl_mid_repair": "ppl B½ REPAIR",
    "acc_mid": "acc B½",
    "l2_reduction": "L2 −%",
    "R_0.3": "R_0.3",
    "search_s": "search s",
}  # the explanation compares these methods
SWEPT = {"width": ("model", "gpt", "width"), "epochs": ("train", "epochs")}


def _table(run: Path, name: str) -> pd.DataFrame:
    path = run / "data" / "tables" / f"{name}.parquet"
    if not path.is_file():
        raise ValueError(f"{run}: no {path.relative_to(run)} (expected a finished run of the pipeline)")
    return pd.read_parquet(path)


def run_info(run: Path) -> dict:
    """The run's commit, model, data and training, its endpoints' final test loss and perplexity, and its
    mean search seconds per method."""
    params = parse_yaml((run / "params.yaml").read_text())
    history = _table(run, "history")
    last = history[history["epoch"] == history["epoch"].max()]
    pairs = _table(run, "pairs")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run, capture_output=True, text=True)
    return {
        "commit": commit.stdout.strip(),
        "data": {k: params["data"][k] for k in ("name", "context", "tokenizer")},
        "gpt": params["model"]["gpt"],
        "train": {k: params["train"][k] for k in ("epochs", "lr", "batch_size", "schedule", "warmup_epochs")},
        "seeds": len(params["train"]["seeds"]),
        "repair": bool(params["measure"]["repair"]),
        "final_test_loss": float(last["test_loss"].mean()),
        "final_test_ppl": float(last["test_loss"].map(math.exp).mean()),
        "final_test_acc": float(last["test_acc"].mean()),
        "search_seconds": pairs.groupby("method", sort=False)["search_seconds"].mean().to_dict(),
    }


def _value(run: dict, kind: str) -> float:
    node = {"width": run["gpt"], "epochs": run["train"]}[kind]
    return float(node[SWEPT[kind][-1]])


def _cell(mean: float, std: float, digits: int) -> str:
    if pd.isna(mean):
        return "—"
    return f"{mean:.{digits}f} ± {0.0 if pd.isna(std) else std:.{digits}f}"


def method_markdown(table: pd.DataFrame) -> str:
    digits = {"acc_mid": 1, "l2_reduction": 1, "search_s": 1}
    names = ["method", *(HEADERS[c] for c in COLUMNS), "pairs"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for _, r in table.iterrows():
        cells = [_cell(r[c], r[f"{c}_std"], digits.get(c, 3)) for c in COLUMNS]
        lines.append(f"| {label(r['method'])} | " + " | ".join(cells) + f" | {int(r['pairs'])} |")
    return "\n".join(lines)


def role_markdown(roles: pd.DataFrame) -> str:
    parts = list(dict.fromkeys(roles["part"]))
    lines = ["| method | " + " | ".join(parts) + " |", "|" + "---|" * (len(parts) + 1)]
    for method, sub in roles.groupby("method", sort=False):
        by = sub.set_index("part")
        lines.append(
            f"| {label(method)} | " + " | ".join(_cell(by.loc[p, "mean"], by.loc[p, "std"], 3) for p in parts) + " |"
        )
    return "\n".join(lines)


def sweep_markdown(sweeps: pd.DataFrame, verdicts: list[dict]) -> str:
    lines = ["| sweep | value | method | test B½ | ppl B½ | R_0.3 | L2 −% | endpoints' test loss |", "|" + "---|" * 8]
    for _, r in sweeps.iterrows():
        cells = [
            _cell(r[q], r[f"{q}_std"], d) for q, d in (("B_half", 3), ("ppl_half", 3), ("R_0.3", 3), ("L2_red", 1))
        ]
        lines.append(
            f"| {r['sweep']} | {r['value']:g} | {label(r['method'])} | "
            + " | ".join(cells)
            + f" | {r['final_test_loss']:.4f} |"
        )
    lines += ["", "| trend tested (Appendix H.4 predicts it of width) | Spearman ρ | p | points | verdict |"]
    lines.append("|---|---|---|---|---|")
    for v in verdicts:
        lines.append(
            f"| {label(v['method'])}'s {v['quantity']} {v['expected']} as {v['param']} grows | {v['rho']:.3f} | "
            f"{v['p']:.3g} | {v['n_points']} | {'**holds**' if v['holds'] else '**does not hold**'} |"
        )
    return "\n".join(lines)


def explanation_markdown(found: dict) -> str:
    verdict = "holds" if found["holds"] else "does not hold"
    return (
        f"Over {found['points']} (pair, method) points of {', '.join(label(m) for m in found['methods'])}: Spearman "
        f"ρ(R_0.3, test B½) = {found['rho']:.3f} (p = {found['p']:.3g}); the paper's prediction (ρ < 0, p < 0.05) "
        f"**{verdict}**. The method of highest R_0.3 is the one of lowest B½ in {found['pairs_agreeing']} of "
        f"{found['pairs']} pairs; highest mean R_0.3: {label(found['best_aligned'])}, lowest mean B½: "
        f"{label(found['lowest_barrier'])}."
    )


def markdown(table, roles, sweeps, verdicts, found, runs) -> str:
    main = runs["preset"]
    gpt, data, train = main["gpt"], main["data"], main["train"]
    lines = [
        "# Language-model study: a byte-level GPT on the Python reference",
        "",
        REBUILD,
        "",
        f"- **preset** (commit {main['commit']}): GPT width {gpt['width']}, depth {gpt['depth']}, {gpt['heads']} "
        f"heads, {gpt['norm']}, {gpt['position']} positions, {gpt['mlp']} MLP, tied embeddings "
        f"{gpt['tie_embeddings']}; data {data['name']}, context {data['context']}, "
        f"tokenizer {data['tokenizer'] or 'bytes'}; "
        f"{train['epochs']} epochs, lr {train['lr']}, batch {train['batch_size']}, {main['seeds']} seeds. "
        f"Endpoints' final test loss {main['final_test_loss']:.4f} nats per token (perplexity "
        f"{main['final_test_ppl']:.3f}), next-token accuracy {100 * main['final_test_acc']:.1f} %.",
    ]
    for name, info in runs.items():
        if name != "preset":
            lines.append(
                f"- {name} (commit {info['commit']}): width {info['gpt']['width']}, {info['train']['epochs']} epochs, "
                f"{info['seeds']} seeds; final test loss {info['final_test_loss']:.4f}."
            )
    lines += ["", "![language-model study](lm.png)", "", "## Barriers per method (the preset's run)", ""]
    lines += ["Mean ± std over pairs (θ(λ) = λ·θa + (1−λ)·π(θb); test split):", "", method_markdown(table), ""]
    lines += [f"- **{HEADERS[k]}**: {meaning}" for k, (_, _, meaning) in COLUMNS.items()]
    lines += ["", "## R_0.3 by part of the model", "", role_markdown(roles), ""]
    lines += ["## Does the better-aligned method have the lower barrier?", "", explanation_markdown(found), ""]
    lines += ["## Width and training length", "", sweep_markdown(sweeps, verdicts), ""]
    return "\n".join(lines)


@app.callback()
def main() -> None:
    """The language-model study (module docstring)."""


def _sweep_runs(items: list[str], kind: str) -> dict[str, Path]:
    out = {}
    for item in items:
        value, sep, folder = item.partition("=")
        if not sep:
            raise ValueError(f"--{kind}: expected VALUE=DIR of a finished run, got {item!r}")
        out[f"{kind} {value}"] = Path(folder)
    return out


@app.command()
@one_line_errors
def collect(
    run: Path = typer.Option(..., help="the preset's finished run (every method, REPAIR)"),
    width: list[str] = typer.Option([], help="VALUE=DIR of a run at another width (repeat)"),
    epochs: list[str] = typer.Option([], help="VALUE=DIR of a run trained for other epochs (repeat)"),
    out: Path = typer.Option(ROOT / "reports" / "lm"),
    dpi: int = typer.Option(120),
) -> None:
    """Build reports/lm/ from finished runs."""
    dirs = {"preset": run} | _sweep_runs(width, "width") | _sweep_runs(epochs, "epochs")
    runs = {name: run_info(d) for name, d in dirs.items()}
    for name in runs.keys() - {"preset"}:  # the sweeps are compared by their barriers, not timed
        del runs[name]["search_seconds"]
    points = study_points(_table(run, "pairs"))
    table, roles = method_table(points), role_table(_table(run, "alignment"))
    sweeps, frames, verdicts = [], [], []
    for kind in SWEPT:
        names = ["preset", *(n for n in dirs if n.startswith(f"{kind} "))]
        if len(names) < 2:
            continue
        value = {n: _value(runs[n], kind) for n in names}
        measured = {value[n]: study_points(_table(dirs[n], "pairs")) for n in names}
        common = set.intersection(*(set(p["method"]) for p in measured.values()))  # the methods every run has
        found = sweep_points(
            {v: p[p["method"].isin(common)] for v, p in measured.items()},
            {value[n]: runs[n]["final_test_loss"] for n in names},
        ).assign(sweep=kind)
        frames.append(found)
        sweeps.append(sweep_summary(found).assign(sweep=kind))
        verdicts += [
            v for m in ("wm", "wm_sinkhorn") if m in set(found["method"]) for v in sweep_trends(found, m, kind)
        ]
    sweep_points_all = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    sweep_table = pd.concat(sweeps, ignore_index=True) if sweeps else pd.DataFrame()
    found = explanation(points, [m for m in ALIGNING if m in set(points["method"])])
    for name, frame in (("points", points), ("table", table), ("roles", roles)):
        write_table(out / f"{name}.parquet", frame)
    write_table(out / "sweep_points.parquet", sweep_points_all)
    write_table(out / "sweep.parquet", sweep_table)
    write_json(out / "explanation.json", found)
    write_json(out / "trends.json", verdicts)
    write_json(out / "runs.json", runs)
    plot_lm_study(sweep_table, points, out / "lm.png", dpi=dpi)
    write_text(out / "lm.md", markdown(table, roles, sweep_table, verdicts, found, runs))
    typer.echo(f"{out}: {len(table)} methods, {len(runs)} runs")


if __name__ == "__main__":
    app()
