"""The three-model study's paragraph in the findings (the paper's Section 6.3 and Table 3, on this
run's study): the settings where the paper's ordering holds, reverses or is mixed, each with both methods'
means, and what the study's R says about the paper's explanation of that ordering."""

from __future__ import annotations

STUDY_WORDS = {
    "holds": "holds in every triple",
    "reversed": "reversed in every triple",
    "mixed": "mixed",
    "stalled": "no verdict, a search stalled (found no alignment)",
    "unconverged": "no verdict, Sinkhorn WM unconverged (⟨θa, π(θb)⟩ under half of coordinate descent's)",
}


def study_note(study: dict) -> str:
    """One paragraph from :func:`lmclab.studies.three_study.study_summary`: the settings where the
    paper's ordering holds, reverses or is mixed, each with both means, and R's relation to the barrier."""
    parts = []
    for word, phrase in STUDY_WORDS.items():
        cells = [_study_cell(s) for s in study["settings"] if s["ordering"] == word]
        if cells:
            parts.append(f"{phrase}: " + ", ".join(cells))
    paired = study["r_explains_ordering"]
    return (
        f"Three-model study (reports/three_study; b–c {study['column']}, mean over triples): "
        + "; ".join(parts)
        + f". Why: within a setting, WM − STE in b–c R_0.3 and in that barrier have opposite signs in "
        f"{paired['opposite']} of {paired['n']} settings (sign test p {paired['p_sign']:.2g}): the method "
        "that aligns b and c's dominant singular directions better has the lower b–c barrier, as the paper says."
    )


def _study_cell(s: dict) -> str:
    p = f", p {s['p']:.2g}" if s["p"] is not None and s["p"] == s["p"] else ""
    return f"{s['setting']} (WM {s['WM']:.3f} vs STE {s['STE']:.3f}{p})"
