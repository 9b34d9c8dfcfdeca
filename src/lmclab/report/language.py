"""The report's perplexity barriers (a language model: ``train.objective: lm``) and R_γ pooled by layer family
(any model whose measure stage wrote the per-layer shares of R_γ)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from lmclab.report.paper_tables import mean_pm
from lmclab.report.plots import label
from lmclab.studies.layer_alignment import part_table

PPL = "test_ppl_barrier_mid"  # in the pairs table of a language model's run only


def is_language_model(pairs: pd.DataFrame) -> bool:
    """Whether the run measured perplexity along θ(λ) (per-position targets: next-token prediction)."""
    return PPL in pairs


def perplexity_section(pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """The test perplexity barriers ``exp L(θ(λ)) − (λ exp L(θa) + (1 − λ) exp L(θb))`` at ½ and max over λ,
    and with REPAIR the unrepaired ones beside them."""
    repaired = "norepair_test_ppl_barrier_mid" in pairs
    cols = [("test_ppl_barrier_mid", "ppl B½"), ("test_ppl_barrier_max", "ppl B max")]
    if repaired:
        cols = [(c, f"{name} REPAIR") for c, name in cols] + [(f"norepair_{c}", name) for c, name in cols]
    lines = ["| method | " + " | ".join(n for _, n in cols) + " |", "|---|" + "---|" * len(cols)]
    for m in methods:
        r = pairs[pairs["method"] == m]
        lines.append(f"| {label(m)} | " + " | ".join(mean_pm(r[c], 3) for c, _ in cols) + " |")
    return f"""
## Perplexity barriers (language model)

Test perplexity exp(mean next-token cross-entropy) along θ(λ), its barrier measured like the loss's
(Definition 2.1 on perplexity instead of loss); accuracy above is next-token accuracy.

{chr(10).join(lines)}
"""


def family_section(alignment: pd.DataFrame, methods: Sequence[str]) -> str:
    """R_γ(θa, π(θb)) pooled over each layer family (block indices as ``*``) at γ = 0.3 (else the largest γ
    measured), mean ± std over pairs; empty when the run has no per-layer rows."""
    if alignment is None or alignment.empty:
        return ""
    gamma = 0.3 if (alignment["gamma"] == 0.3).any() else float(alignment["gamma"].max())
    table = part_table(alignment, gamma)
    parts = list(dict.fromkeys(table["part"]))
    shown = [m for m in methods if m in set(table["method"])]
    lines = ["| layers | " + " | ".join(label(m) for m in shown) + " |", "|---|" + "---|" * len(shown)]
    for part in parts:
        cells = []
        for m in shown:
            row = table[(table["method"] == m) & (table["part"] == part)].iloc[0]
            std = 0.0 if pd.isna(row["std"]) else row["std"]
            cells.append("—" if pd.isna(row["mean"]) else f"{row['mean']:.3f} ± {std:.3f}")
        lines.append(f"| `{part}` | " + " | ".join(cells) + " |")
    return f"""
### R_{gamma:g} by layer family

R_γ(θa, π(θb)) pooled over the layers of each family (block indices written `*`): the sum of the layers'
Σ(u^a·u^b)(v^a·v^b) over the sum of their kept triplets, with the model-wide threshold γ s_max, so pooling
every layer gives the table above; "—": no singular value of the family reaches the threshold.

{chr(10).join(lines)}
"""
