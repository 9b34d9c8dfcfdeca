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


def study_note(study: dict, level: float = 0.05) -> str:
    """One paragraph from :func:`lmclab.studies.three_study.study_summary`: the settings where the
    paper's ordering holds, reverses or is mixed, each with both means, and R's relation to the barrier,
    worded by :func:`explanation` (the sign test at ``level``)."""
    parts = []
    for word, phrase in STUDY_WORDS.items():
        cells = [_study_cell(s) for s in study["settings"] if s["ordering"] == word]
        if cells:
            parts.append(f"{phrase}: " + ", ".join(cells))
    paired = study["r_explains_ordering"]
    p = "—" if paired["p_sign"] is None else f"{paired['p_sign']:.2g}"
    return (
        f"Three-model study (reports/three_study; b–c {study['column']}, mean over triples): "
        + "; ".join(parts)
        + f". Why: within a setting, WM − STE in b–c R_0.3 and in that barrier have opposite signs in "
        f"{paired['opposite']} of {paired['n']} settings (sign test p {p}): " + EXPLANATION[explanation(paired, level)]
    )


ALIGNS = "the method that aligns b and c's dominant singular directions better has the"
# the paper's explanation of its ordering (Section 6.3), as the sign test judges it (:func:`explanation`)
EXPLANATION = {
    True: f"{ALIGNS} lower b–c barrier, as the paper says.",
    False: f"{ALIGNS} higher b–c barrier, the reverse of the paper's explanation.",
    None: f"the data do not show the paper's explanation ({ALIGNS} lower b–c barrier).",
}


def explanation(paired: dict, level: float = 0.05) -> bool | None:
    """The paper's explanation judged on :func:`lmclab.studies.three_study.r_explains_ordering`: True
    when opposite signs are the majority and the sign test rejects chance at ``level``, False when the
    same signs are (the reverse), None otherwise (no setting, or no significant majority)."""
    n, opposite, p = paired["n"], paired["opposite"], paired["p_sign"]
    if not n or p is None or p != p or p >= level or 2 * opposite == n:
        return None
    return 2 * opposite > n


def _study_cell(s: dict) -> str:
    p = f", p {s['p']:.2g}" if s["p"] is not None and s["p"] == s["p"] else ""
    return f"{s['setting']} (WM {s['WM']:.3f} vs STE {s['STE']:.3f}{p})"
