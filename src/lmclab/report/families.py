"""The report's barriers by family of layers (``measure.family_barriers``: :mod:`lmclab.analysis.families`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from lmclab.report.paper_tables import mean_pm
from lmclab.report.plots import label

NOTE = (
    "Test loss barrier at λ = ½ of the path that moves one family of layers alone, θa elsewhere (Adilova et al. "
    "2024), and the barrier left when every family but that one moves, θa's there (against the pair's own ends); "
    "mean ± std over pairs. `(all)` is the whole path's (no repair); the whole minus *all but* is the family's "
    "share in the company of the others."
)


def family_markdown(
    families: pd.DataFrame,
    methods: Sequence[str],
    name: Callable[[str], str] = label,
    columns: Sequence[str] = ("alone", "all_but"),
) -> str:
    """One row per family (in order of first appearance), one column per method of ``methods`` that has rows:
    its ``columns`` joined by `` / ``, each mean ± std over pairs (``—``: the family moves nowhere under that
    method)."""
    shown = [m for m in methods if m in set(families["method"])]
    lines = ["| family | " + " | ".join(name(m) for m in shown) + " |", "|---|" + "---|" * len(shown)]
    for family in dict.fromkeys(families["family"]):
        cells = []
        for m in shown:
            rows = families[(families["method"] == m) & (families["family"] == family)]
            cells.append("—" if rows.empty else " / ".join(mean_pm(rows[c]) for c in columns))
        lines.append(f"| `{family}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def barrier_section(families: pd.DataFrame | None, methods: Sequence[str]) -> str:
    """The report's section (empty when the run did not measure the barriers by family)."""
    if families is None or families.empty:
        return ""
    return f"""
## Where the barrier is: by family of layers

{NOTE} Each cell: alone / all but.

{family_markdown(families, methods)}
"""


def two_tables(families: pd.DataFrame, name: Callable[[str], str] = label) -> str:
    """The *alone* and the *all but* barriers of every method of ``families`` (in order of first appearance), each
    in a table of its own: one row per family, one column per method, mean ± std over pairs."""
    methods = list(dict.fromkeys(families["method"]))
    alone, all_but = (family_markdown(families, methods, name, columns=(c,)) for c in ("alone", "all_but"))
    return (
        f"{verdict(families, name)}\n\n**Alone** (that family moves, θa elsewhere):\n\n{alone}\n\n"
        f"**All but** (every other family moves, that one θa's):\n\n{all_but}"
    )


def verdict(families: pd.DataFrame, name: Callable[[str], str] = label) -> str:
    """What the table says, read off its means over pairs: the largest barrier of one family moving alone as a
    share of its method's whole barrier; below a tenth for every method, no family carries the barrier on its own
    (Adilova et al.'s layer-wise connectivity), and the whole barrier is the families' interplay."""
    means = families.groupby(["method", "family"], sort=False)[["alone"]].mean().reset_index()
    whole = means[means["family"] == "(all)"].set_index("method")["alone"]
    parts = means[(means["family"] != "(all)") & means["method"].isin(whole.index[whole > 0])]
    if parts.empty:  # no method with a barrier to share out
        return "No method has a positive whole barrier."
    parts = parts.assign(share=parts["alone"] / parts["method"].map(whole).astype(float))
    top = parts.loc[parts["share"].idxmax()]
    line = (
        f"The largest barrier of one family moving alone is {100 * top['share']:.1f} % of its method's whole barrier "
        f"(`{top['family']}` under {name(top['method'])}: {top['alone']:.3f} of {whole[top['method']]:.3f})"
    )
    if top["share"] < 0.1:
        return line + ": no family carries the barrier on its own, it is the families' interplay."
    return line + "."
