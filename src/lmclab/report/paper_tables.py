"""The report's comparison with the paper: Tables 1–3 in its layout with the paper's rows marked and
its numbers beside this run's (:mod:`lmclab.report.paper_numbers`), and the findings section
(:mod:`lmclab.studies.findings`, read from the saved ``findings.json``)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from lmclab.report.paper_numbers import PAPER_METHOD, TABLE1, TABLE2, TABLE3, caveat, paper_row
from lmclab.report.plots import label

MARK = {"wm_sinkhorn": " **← the paper's WM**", "ste_sinkhorn": " **← the paper's STE**"}


def marked(method: str) -> str:
    """A method's label, with the paper's own methods marked (Appendix D.2)."""
    return label(method) + MARK.get(method, "")


def mean_pm(values: pd.Series, digits: int = 3) -> str:
    """``mean ± sample std`` (0 for one value), as every table of the report prints it."""
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.{digits}f} ± {std:.{digits}f}"


def paper_line(table: int, row: str | None, cells: Sequence[str]) -> str:
    """The paper's own row of Table ``table`` (or nothing when the run matches no row)."""
    if row is None:
        return ""
    return f"\n| *paper, {row}* ({PAPER_METHOD.get(table, 'WM / STE')}) | " + " | ".join(cells) + " |"


def table2(pairs: pd.DataFrame, methods: Sequence[str], row: str | None) -> str:
    """Table 2 layout (the paper's STE): B½, L2 without and with the permutation, R_0.3(θa, π(θb))."""
    lines = ["| method | B_½ (loss) | ‖θa−θb‖ | ‖θa−π(θb)‖ | R_0.3(θa, π(θb)) |", "|---|---|---|---|---|"]
    for m in methods:
        r = pairs[pairs["method"] == m]
        r03 = mean_pm(r["R_0.3"]) if "R_0.3" in r else "—"
        lines.append(
            f"| {marked(m)} | {mean_pm(r['test_loss_barrier_mid'])} | {mean_pm(r['l2_before'], 2)} | "
            f"{mean_pm(r['l2_after'], 2)} | {r03} |"
        )
    return "\n".join(lines) + paper_line(2, row, [str(s) for s in TABLE2[row]] if row else [])


def table1_paper_line(row: str | None) -> str:
    """Table 1's paper row in the columns of :func:`lmclab.report.document.table1` (no p-value in the paper)."""
    if row is None:
        return ""
    b, t, d, before, after, red = TABLE1[row]
    return paper_line(1, row, [str(b), str(t), str(d), "—", str(before), str(after), str(red)])


def table3_paper_lines(row: str | None, n_cols: int) -> str:
    """Table 3's paper rows under the columns of :func:`lmclab.report.three_models.table3` (method, loss b–c max,
    loss b–c ½, acc b–c, …): the paper's loss barrier is the midpoint one (negative for its MLPs)."""
    if row is None:
        return ""
    loss_wm, loss_ste, acc_wm, acc_ste = TABLE3[row]
    return "".join(
        f"\n| *paper, {row}* ({m}) | — | {loss} | {acc} |" + " — |" * (n_cols - 4)
        for m, loss, acc in (("WM", loss_wm, acc_wm), ("STE", loss_ste, acc_ste))
    )


def paper_note(data: str, arch: str) -> str:
    row = paper_row(data, arch)
    if row is None:
        return "The paper has no row for this data set and architecture; its numbers are not shown.\n"
    return (
        f"Rows in *italics* are the paper's ({row}, mean ± std over 5 pairs or 3 triples); "
        f"{caveat(data)}. Marked rows are the methods the paper calls WM and STE (Appendix D.2: the "
        "Sinkhorn DistL2Loss and MidLoss); WM and STE without the mark are the re-basin originals.\n"
    )


def findings_section(findings: dict) -> str:
    """Each finding: the paper's claim, this run's numbers, the criterion and the verdict."""
    verdict = {True: "**holds**", False: "**does not hold**", None: "not tested"}
    lines = [
        f"\n## Findings of the paper, checked on this run ({findings['held']} of {findings['tested']} tested hold)\n",
        "Each criterion was fixed before the run; a finding that does not hold here is reported as such "
        "(`metrics/findings.json` has the same in JSON).\n",
        "| finding (the paper) | this run | criterion | verdict |",
        "|---|---|---|---|",
    ]
    for f in findings["findings"]:
        numbers = ", ".join(f"{k} {v:.4g}" for k, v in f["numbers"].items()) or "—"
        lines.append(f"| {f['claim']} | {numbers} | {f['criterion']} | {verdict[f['holds']]} |")
    notes = [f"- **{f['claim']}**: {f['note']}" for f in findings["findings"] if f.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
