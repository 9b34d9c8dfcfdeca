"""The language-model study's page (``lmclab study lm collect``): each run's commit, model, data and
training read from its folder, and the Markdown tables of the barriers per method, R_0.3 by part of the
model, the explanation (is the better-aligned method the one of lower barrier?) and the width and
training-length sweeps (Appendix H.4's trend)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pandas as pd

from lmclab.pipeline.stage import parse_yaml
from lmclab.report.plots import label
from lmclab.studies.lm_study import COLUMNS

REBUILD = (
    "Rebuilt by running the pipeline with `lmclab preset pydoc_gpt` (and the sweep runs of "
    "docs/language-models.md, each in its own clone, `dvc repro`), then `lmclab study lm collect`."
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


def run_table(run: Path, name: str) -> pd.DataFrame:
    path = run / "data" / "tables" / f"{name}.parquet"
    if not path.is_file():
        raise ValueError(f"{run}: no {path.relative_to(run)} (expected a finished run of the pipeline)")
    return pd.read_parquet(path)


def run_info(run: Path) -> dict:
    """The run's commit, model, data and training, its endpoints' final test loss and perplexity, and its
    mean search seconds per method."""
    params = parse_yaml((run / "params.yaml").read_text())
    history = run_table(run, "history")
    last = history[history["epoch"] == history["epoch"].max()]
    pairs = run_table(run, "pairs")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run, capture_output=True, text=True)
    return {
        "commit": commit.stdout.strip(),
        "data": {k: params["data"][k] for k in ("name", "context", "tokenizer")},
        "gpt": params["model"]["gpt"],
        "train": {k: params["train"][k] for k in ("epochs", "lr", "batch_size", "schedule", "warmup_epochs")},
        "seeds": len(params["train"]["seeds"]),
        "repair": params["measure"]["repair"] not in (False, "none"),  # a run before one vocabulary: true or false
        "final_test_loss": float(last["test_loss"].mean()),
        "final_test_ppl": float(last["test_loss"].map(math.exp).mean()),
        "final_test_acc": float(last["test_acc"].mean()),
        "search_seconds": pairs.groupby("method", sort=False)["search_seconds"].mean().to_dict(),
    }


def sweep_value(run: dict, kind: str) -> float:
    node = {"width": run["gpt"], "epochs": run["train"]}[kind]
    return float(node[SWEPT[kind][-1]])


def _cell(mean: float, std: float, digits: int) -> str:
    if pd.isna(mean):
        return "—"
    return f"{mean:.{digits}f} ± {0.0 if pd.isna(std) else std:.{digits}f}"


def method_markdown(table: pd.DataFrame, columns=tuple(COLUMNS), titles=HEADERS, name=label) -> str:
    """The per-method table of ``columns`` (their ``titles``), each method called ``name(method)``."""
    digits = {"acc_mid": 1, "l2_reduction": 1, "search_s": 1}
    names = ["method", *(titles[c] for c in columns), "pairs"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for _, r in table.iterrows():
        cells = [_cell(r[c], r[f"{c}_std"], digits.get(c, 3)) for c in columns]
        lines.append(f"| {name(r['method'])} | " + " | ".join(cells) + f" | {int(r['pairs'])} |")
    return "\n".join(lines)


def role_markdown(roles: pd.DataFrame, name=label) -> str:
    """R_0.3 per method and part, each method called ``name(method)``; a part a method lacks is a dash."""
    parts = list(dict.fromkeys(roles["part"]))
    lines = ["| method | " + " | ".join(parts) + " |", "|" + "---|" * (len(parts) + 1)]
    for method, sub in roles.groupby("method", sort=False):
        by = sub.set_index("part")
        cells = [_cell(by.loc[p, "mean"], by.loc[p, "std"], 3) if p in by.index else "—" for p in parts]
        lines.append(f"| {name(method)} | " + " | ".join(cells) + " |")
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
