"""The Markdown report a researcher reads: tables in the paper's layout plus the figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lmclab.core.atomic import write_text
from lmclab.report.cka import cka_section
from lmclab.report.families import barrier_section
from lmclab.report.language import family_section, is_language_model, perplexity_section
from lmclab.report.many_models import many_section
from lmclab.report.paper_numbers import paper_row
from lmclab.report.paper_tables import (
    findings_section,
    marked,
    mean_pm,
    paper_note,
    table1_paper_line,
    table2,
)
from lmclab.report.plots import label
from lmclab.report.three_models import three_section


def table1(pairs: pd.DataFrame, methods: Sequence[str], split: str = "test", t1: pd.DataFrame | None = None) -> str:
    """Table 1 layout: B_½, Taylor, Diff., ‖θa−θb‖, ‖θa−π(θb)‖, reduction %. Taylor and Diff. (with
    the paired t-test's p-value) come from the saved ``table1``; without it they show "—"."""
    head = (
        "| method | B_½ (loss) | Taylor approx. | Diff. | p (t-test) | ‖θa−θb‖ | ‖θa−π(θb)‖ "
        "| reduction % |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for m in methods:
        r = pairs[pairs["method"] == m]
        row = t1[t1["method"] == m].iloc[0] if t1 is not None and m in set(t1["method"]) else None
        cell = lambda k, row=row: "—" if row is None else f"{row[k + '_mean']:.3f} ± {row[k + '_std']:.3f}"  # noqa: E731
        p = (
            "—"
            if row is None or row["p_value"] != row["p_value"]
            else (f"{row['p_value']:.3g}{' *' if row['significant'] else ''}")
        )
        lines.append(
            f"| {marked(m)} | {mean_pm(r[f'{split}_loss_barrier_mid'])} | {cell('taylor')} | {cell('diff')} | "
            f"{p} | {mean_pm(r['l2_before'])} | {mean_pm(r['l2_after'])} | "
            f"{mean_pm(r['l2_reduction_pct'], 2)} |"
        )
    return "\n".join(lines)


def alignment_table(pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """R_γ per method: (θa, θb) naive, (θa, π(θb)), (θa, mid), (π(θb), mid)."""
    gammas = [c.removeprefix("R_") for c in pairs.columns if c.startswith("R_") and c.count("_") == 1]
    cols = [
        (f"R_{g}{suffix}", f"R_{g} {name}")
        for g in gammas
        for suffix, name in (
            ("_naive", "(θa, θb)"),
            ("", "(θa, π(θb))"),
            ("_a_mid", "(θa, mid)"),
            ("_b_mid", "(π(θb), mid)"),
        )
    ]
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for m in methods:
        r = pairs[pairs["method"] == m]
        lines.append(f"| {label(m)} | " + " | ".join(mean_pm(r[c[0]]) for c in cols) + " |")
    return "\n".join(lines)


def theorem42_table(bounds: pd.DataFrame, methods: Sequence[str]) -> str:
    """Per layer: Theorem 4.2's bound and the measured E‖σ(W^a z) − σ(W^b z)‖, mean over pairs."""
    mean = bounds.groupby(["method", "layer"], sort=False)[["bound", "measured"]].mean()
    lines = ["| method | layer | bound | measured |", "|---|---|---|---|"]
    for (m, layer), r in mean.iterrows():
        if m in methods:
            lines.append(f"| {label(m)} | {layer} | {r['bound']:.3f} | {r['measured']:.3f} |")
    return "\n".join(lines)


def barrier_table(pairs: pd.DataFrame, methods: Sequence[str], prefix: str = "") -> str:
    """Every barrier: loss and accuracy (points), max over λ and at λ = ½, train and test.
    ``prefix="norepair_"`` gives the BatchNorm networks' barriers with stale statistics."""
    cols = [
        (f"{prefix}{s}_{q}_barrier_{k}", f"{s} {q} {'max' if k == 'max' else '½'}")
        for s in ("train", "test")
        for q in ("loss", "acc")
        for k in ("max", "mid")
    ]
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " | search s |", "|---|" + "---|" * (len(cols) + 1)]
    for m in methods:
        r = pairs[pairs["method"] == m]
        cells = [mean_pm(r[c[0]], 2 if "acc" in c[0] else 3) for c in cols]
        lines.append(f"| {label(m)} | " + " | ".join(cells) + f" | {mean_pm(r['search_seconds'], 2)} |")
    return "\n".join(lines)


def endpoint_table(history: pd.DataFrame, language: bool = False) -> str:
    """Each seed's last epoch; a language model's with its test perplexity and next-token accuracy."""
    last = history.sort_values(["seed", "epoch"]).groupby("seed").tail(1)
    acc, ppl = ("test token acc %", " test ppl |") if language else ("test acc %", "")
    lines = [f"| seed | epochs | train loss | test loss | {acc} |{ppl}", "|---|---|---|---|---|" + "---|" * language]
    for _, r in last.iterrows():
        lines.append(
            f"| {int(r['seed'])} | {int(r['epoch'])} | {r['train_loss']:.4f} | "
            f"{r['test_loss']:.4f} | {100 * r['test_acc']:.2f} |"
            + (f" {math.exp(r['test_loss']):.3f} |" if language else "")
        )
    return "\n".join(lines)


def analysis_section(
    rel: dict[str, str],
    pairs: pd.DataFrame,
    methods: Sequence[str],
    bounds: pd.DataFrame | None,
    layers: pd.DataFrame | None = None,
) -> str:
    """The analyses' tables and figures (present when the analyze/spectra stages ran); ``layers``: the
    per-layer shares of R_γ (:func:`lmclab.report.language.family_section`)."""
    if "alignment" not in rel:
        return ""
    text = f"""
## Singular-vector alignment R_γ (Theorem 4.1, Figures 2, 3)

{alignment_table(pairs, methods)}
{family_section(layers, methods)}
![alignment]({rel["alignment"]})

## Real vs Taylor-approximated barrier (Theorem 3.1)

![taylor]({rel["taylor"]})

## Spectra (Figures 1, 7, 8) and input energy (Figures 4, 9)

![spectra]({rel["spectra"]})

![output scale]({rel["output_scale"]})

![energy]({rel["energy"]})
"""
    if bounds is not None:
        text += f"""
## Theorem 4.2 (test split, σ = ReLU, C = 1; z = the layer's input in θa)

{theorem42_table(bounds, methods)}
"""
    return text


def _flag(pairs: pd.DataFrame, name: str) -> bool:
    return name in pairs and pairs[name].fillna(False).astype(bool).any()


def _stale_section(pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """For BatchNorm networks, or with REPAIR: the barriers above are repaired ones; these are not."""
    if _flag(pairs, "bn_repair"):
        return (
            "The barriers above are measured with BatchNorm statistics repaired on training data at "
            "every λ (Jordan et al. 2023). Without repair (stale running statistics interpolated with the "
            "weights):\n\n" + barrier_table(pairs, methods, prefix="norepair_") + "\n\n"
        )
    if _flag(pairs, "ln_repair"):
        return (
            "The barriers above are measured with REPAIR at every λ (Jordan et al. 2023; measure.repair: repair, each "
            "merged unit's mean and std rescaled to the interpolation of the endpoints'). Without REPAIR:\n\n"
            + barrier_table(pairs, methods, prefix="norepair_")
            + "\n\n"
        )
    return ""


def _language_section(pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """A language model's perplexity barriers (:func:`perplexity_section`), followed by a blank line."""
    return perplexity_section(pairs, methods).lstrip("\n") + "\n" if is_language_model(pairs) else ""


def paper_tables(pairs: pd.DataFrame, methods: Sequence[str], t1: pd.DataFrame | None, row: str | None) -> str:
    """Tables 1 and 2 in the paper's layout, the paper's rows marked and its own numbers below."""
    return f"""## Table 1 layout: WM (test split, λ = ½)

{table1(pairs, methods, t1=t1)}{table1_paper_line(row)}

Diff. = Taylor − B_½; p: paired two-sided t-test over pairs (* = significant at 5%).

## Table 2 layout: STE (test split, λ = ½)

{table2(pairs, methods, row)}
"""


def write_report(
    path: Path,
    *,
    title: str,
    pairs: pd.DataFrame,
    history: pd.DataFrame,
    methods: Sequence[str],
    figures: dict[str, Path],
    edges: pd.DataFrame | None = None,
    evaluation: pd.DataFrame | None = None,
    many_methods: pd.DataFrame | None = None,
    t1: pd.DataFrame | None = None,
    bounds: pd.DataFrame | None = None,
    layers: pd.DataFrame | None = None,
    families: pd.DataFrame | None = None,
    data: str = "",
    arch: str = "",
    findings: dict | None = None,
) -> Path:
    """Write ``report.md``; figure paths are made relative to the report's folder. ``data`` and
    ``arch`` select the paper's rows (:mod:`lmclab.report.paper_numbers`); ``findings`` is ``findings.json``;
    ``families``: the barriers by family of layers (:mod:`lmclab.report.families`)."""
    path = Path(path)
    rel = {k: Path(v).relative_to(path.parent).as_posix() for k, v in figures.items()}
    row = paper_row(data, arch)
    text = run_section(title, rel, pairs, history, methods, findings, t1, row, paper_note(data, arch))
    text += analysis_section(rel, pairs, methods, bounds, layers) + barrier_section(families, methods)
    if edges is not None:
        text += three_section(edges, rel, row) + many_section(evaluation, many_methods, rel["merge_many"])
    if "cka" in rel:
        text += cka_section(rel["cka"], pairs, methods)
    if "search_curves" in rel:
        text += search_curves_section(rel["search_curves"])
    write_text(path, text)
    return path


def run_section(
    title: str,
    rel: dict[str, str],
    pairs: pd.DataFrame,
    history: pd.DataFrame,
    methods: Sequence[str],
    findings: dict | None,
    t1: pd.DataFrame | None,
    row: str | None,
    note: str,
) -> str:
    """The report's head: the pairs, the endpoints, the findings, the paper's tables, the barriers and the
    interpolation curves (Definition 2.1; the paper's ``row`` and its ``note``)."""
    n_pairs = pairs["pair"].nunique()
    return f"""# {title}

Mean ± sample std over {n_pairs} pair(s): {", ".join(sorted(pairs["pair"].unique()))}.
λ = 1 is θa, λ = 0 is π(θb); barriers follow the paper's Definition 2.1 (max over the λ grid) and its tables (at λ = ½).
{note}
## Endpoints

{endpoint_table(history, is_language_model(pairs))}

![training]({rel["training"]})
{findings_section(findings) if findings else ""}
{paper_tables(pairs, methods, t1, row)}
## Barriers (loss in nats, accuracy in percentage points)

{barrier_table(pairs, methods)}

{_stale_section(pairs, methods)}{_language_section(pairs, methods)}## Interpolation curves

![interpolation]({rel["interpolation"]})
"""


def search_curves_section(figure: str) -> str:
    """The iterative searches' learning curves (the paper's Figure 6)."""
    return f"""
## Search learning curves (paper Figure 6)

Per epoch of the iterative searches: L2 distance with the current hard permutation and the
merged midpoint model's test loss and accuracy (epoch 0 is the initial permutation).

![search curves]({figure})
"""
