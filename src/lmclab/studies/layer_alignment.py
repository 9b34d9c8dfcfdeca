"""R_γ (Theorem 4.1) of parts of a model: the measure stage's per-layer shares (``data/tables/alignment.parquet``:
per pair, method, layer and γ the numerator ``Σ_{i,j} (u^a_i·u^b_j)(v^a_i·v^b_j)`` and the count ``min(n^a_ℓ,
n^b_ℓ)`` kept under the model-wide threshold) pooled over a set of layers: ``R = Σ numerators / Σ counts``,
which over every layer is the model's R_γ.

Layers are pooled by *family* (:func:`lmclab.analysis.layer_names.layer_family`: the name with its block indices
replaced by ``*``, so ``blocks.*.attn.q.weight`` is the queries of every block) or by any other grouping, e.g. a
language model's :func:`gpt_role` (residual stream, attention, MLP).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pandas as pd

from lmclab.analysis.layer_names import layer_family

ROLES = (  # a decoder's layers by what they read and write (archs.gpt's names); the first match wins
    ("attention", re.compile(r"\.attn\.")),
    ("MLP", re.compile(r"\.(fc1|fc2|gate)\.")),
    ("stream", re.compile(r"")),  # embeddings and the head: the residual stream's own matrices
)


def gpt_role(layer: str) -> str:
    """``attention`` (queries, keys, values, output), ``MLP`` (fc1, fc2, SwiGLU's gate) or ``stream`` (token and
    position embeddings, the head) for a layer of :mod:`lmclab.archs.gpt`."""
    return next(role for role, pattern in ROLES if pattern.search(layer))


def pooled_alignment(alignment: pd.DataFrame, gamma: float, group: Callable[[str], str] = layer_family) -> pd.DataFrame:
    """Per method, pair and part (``group(layer)``): ``numerator``, ``kept`` summed over the part's layers and
    ``R`` = their ratio (NaN where no triplet of the part passes the threshold), at ``gamma``."""
    rows = alignment[alignment["gamma"] == gamma]
    if rows.empty:
        raise ValueError(f"gamma: no per-layer R at γ = {gamma:g} (measured: {sorted(set(alignment['gamma']))})")
    rows = rows.assign(part=rows["layer"].map(group))
    sums = rows.groupby(["method", "pair", "part"], sort=False)[["numerator", "kept"]].sum().reset_index()
    return sums.assign(R=sums["numerator"] / sums["kept"].where(sums["kept"] > 0))


def part_table(alignment: pd.DataFrame, gamma: float, group: Callable[[str], str] = layer_family) -> pd.DataFrame:
    """Per method and part: the mean ``R`` and its sample std over pairs (:func:`pooled_alignment`), in the
    order the parts and methods first appear."""
    pooled = pooled_alignment(alignment, gamma, group)
    stats = pooled.groupby(["method", "part"], sort=False)["R"].agg(["mean", "std", "count"]).reset_index()
    return stats.rename(columns={"count": "pairs"})
