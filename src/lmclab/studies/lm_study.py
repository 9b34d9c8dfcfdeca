"""The language-model study (docs "Language models"): is a byte-level GPT linearly connected to another seed's
once its residual stream, heads and MLP units are aligned, and does the paper's explanation (the method that
aligns the dominant singular directions better has the lower barrier, Sections 4–5) hold for it?

Inputs are finished runs of the pipeline: their ``pairs`` tables (``data/tables/pairs.parquet``), per-layer
R_γ shares (``alignment.parquet``) and training histories. A run measured with REPAIR (``measure.repair``) has
its plain barriers under ``norepair_*`` and REPAIR's under the plain names; a run without REPAIR has only the
plain ones (:func:`plain`, :func:`repaired`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from scipy import stats

from lmclab.studies.layer_alignment import gpt_role, part_table
from lmclab.studies.sweep import trends

# column of the study -> (summary column, REPAIR's?, meaning)
COLUMNS: dict[str, tuple[str, bool, str]] = {
    "B_mid": ("test_loss_barrier_mid", False, "test loss barrier at λ = ½ (nats per token)"),
    "B_mid_repair": ("test_loss_barrier_mid", True, "the same with REPAIR"),
    "B_max": ("test_loss_barrier_max", False, "test loss barrier, max over λ"),
    "B_max_repair": ("test_loss_barrier_max", True, "the same with REPAIR"),
    "ppl_mid": ("test_ppl_barrier_mid", False, "test perplexity barrier at λ = ½"),
    "ppl_mid_repair": ("test_ppl_barrier_mid", True, "the same with REPAIR"),
    "acc_mid": ("test_acc_barrier_mid", False, "next-token accuracy barrier at λ = ½ (points)"),
    "l2_reduction": ("l2_reduction_pct", False, "‖θa − θb‖ reduction by the alignment (%)"),
    "R_0.3": ("R_0.3", False, "R_0.3(θa, π(θb)), Theorem 4.1"),
    "search_s": ("search_seconds", False, "seconds of the search"),
}
ROLE_GAMMA = 0.3
CALIBRATED: dict[str, tuple[str, bool, str]] = {  # a run with measure.calibrate_temperature (circuits) also has
    "B_mid_T": (
        "test_loss_barrier_mid_calibrated",
        False,
        "test loss barrier at λ = ½ with each model's softmax temperature calibrated (Ito et al. 2025)",
    ),
    "B_mid_C": (
        "test_loss_barrier_mid_circuits",
        False,
        "test loss barrier at λ = ½ in circuit space: each head's QKᵀ and OV circuits interpolated instead of its "
        "factors, as Theus et al. (2025) measure",
    ),
}


def _measured_with_repair(pairs: pd.DataFrame) -> bool:
    return "ln_repair" in pairs and bool(pairs["ln_repair"].eq(True).any())


def plain(pairs: pd.DataFrame, column: str) -> pd.Series:
    """The barrier ``column`` without REPAIR (``norepair_<column>`` in a run measured with it)."""
    name = f"norepair_{column}" if f"norepair_{column}" in pairs else column
    return pairs[name] if name in pairs else pd.Series(float("nan"), index=pairs.index)


def repaired(pairs: pd.DataFrame, column: str) -> pd.Series:
    """REPAIR's barrier ``column`` (NaN in a run measured without it)."""
    if _measured_with_repair(pairs) and column in pairs:
        return pairs[column]
    return pd.Series(float("nan"), index=pairs.index)


def study_points(pairs: pd.DataFrame, columns: Mapping[str, tuple[str, bool, str]] = COLUMNS) -> pd.DataFrame:
    """One row per pair and method with every entry of ``columns`` (default :data:`COLUMNS`)."""
    columns = {name: (repaired if rep else plain)(pairs, source) for name, (source, rep, _) in columns.items()}
    return pd.DataFrame({"method": pairs["method"], "pair": pairs["pair"], **columns})


def method_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per method of :func:`study_points` (in their order): ``<column>`` and ``<column>_std`` (sample std over
    pairs) of each of its columns, and ``pairs``."""
    grouped = points.groupby("method", sort=False)[[c for c in points if c not in ("method", "pair")]]
    table = grouped.mean().join(grouped.std(ddof=1).add_suffix("_std"))
    return table.assign(pairs=points.groupby("method", sort=False).size()).reset_index()


def role_table(alignment: pd.DataFrame) -> pd.DataFrame:
    """R_0.3(θa, π(θb)) pooled per role (stream, attention, MLP; :func:`gpt_role`), mean and std over pairs."""
    return part_table(alignment, ROLE_GAMMA, group=gpt_role)


def sweep_points(runs: Mapping[float, pd.DataFrame], final_loss: Mapping[float, float]) -> pd.DataFrame:
    """One row per swept ``value``, method and pair of each run's :func:`study_points`: ``B_half`` (plain test
    B½), ``ppl_half``, ``R_0.3``, ``L2_red`` and the endpoints' mean ``final_test_loss`` at that value."""
    frames = []
    for value, points in sorted(runs.items()):
        frames.append(
            pd.DataFrame(
                {
                    "value": value,
                    "method": points["method"],
                    "pair": points["pair"],
                    "B_half": points["B_mid"],
                    "ppl_half": points["ppl_mid"],
                    "R_0.3": points["R_0.3"],
                    "L2_red": points["l2_reduction"],
                    "final_test_loss": final_loss[value],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def sweep_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per value and method: the mean and sample std over pairs of every quantity of :func:`sweep_points`."""
    quantities = ["B_half", "ppl_half", "R_0.3", "L2_red", "final_test_loss"]
    grouped = points.groupby(["value", "method"], sort=True)[quantities]
    return grouped.mean().join(grouped.std(ddof=1).add_suffix("_std")).reset_index()


def sweep_trends(points: pd.DataFrame, method: str, param: str) -> list[dict]:
    """The paper's trends (B½ falls, R_0.3 rises as ``param`` grows) tested on ``method``'s points
    (:func:`lmclab.studies.sweep.trends`: Spearman ρ with the predicted sign, p < 0.05)."""
    return trends(points, method, param)


def explanation(points: pd.DataFrame, methods: Sequence[str]) -> dict:
    """Does the method that aligns the dominant singular directions better have the lower barrier? Over the
    aligning ``methods``' rows of :func:`study_points`: Spearman ρ between R_0.3 and the plain test B½ (the
    paper predicts ρ < 0; it holds at p < 0.05); per pair, whether the method of highest R_0.3 is the one of
    lowest B½; and which methods have the highest mean R_0.3 and the lowest mean B½."""
    points = points[points["method"].isin(methods)].dropna(subset=["R_0.3", "B_mid"])
    test = stats.spearmanr(points["R_0.3"], points["B_mid"])
    per_pair = [
        sub.loc[sub["R_0.3"].idxmax(), "method"] == sub.loc[sub["B_mid"].idxmin(), "method"]
        for _, sub in points.groupby("pair")
    ]
    means = points.groupby("method")[["R_0.3", "B_mid"]].mean()
    return {
        "methods": list(methods),
        "points": len(points),
        "rho": float(test.statistic),
        "p": float(test.pvalue),
        "pairs_agreeing": int(sum(per_pair)),
        "pairs": len(per_pair),
        "best_aligned": str(means["R_0.3"].idxmax()),
        "lowest_barrier": str(means["B_mid"].idxmin()),
        "holds": bool(test.statistic < 0 and test.pvalue < 0.05),
    }


ORTHOGONAL = "@orthogonal"  # the suffix of a method measured in a run with permute.symmetry: orthogonal
# Theus et al. 2025 (Generalized Linear Mode Connectivity for Transformers), Table 2: test-loss barriers at λ = ½
# (nats per BPE token on a 6-layer GPT-2 on TinyShakespeare; per image on a ViT on CIFAR-10), naive and after
# three alignments, and the methods of this study each corresponds to
THEUS = {
    "naive": (("identity",), {"GPT-2": 2.02, "ViT": 1.69}),
    "weight matching, data-free: an orthogonal map of the stream, permutations of MLP units and heads": (
        (f"wm{ORTHOGONAL}",),
        {"GPT-2": 0.34, "ViT": 0.36},
    ),
    "learned on the task loss, permutations only": (("ste_sinkhorn",), {"GPT-2": 0.63, "ViT": 0.45}),
    "learned on the task loss, with the orthogonal map": (
        (f"ste{ORTHOGONAL}", f"ste_sinkhorn{ORTHOGONAL}"),
        {"GPT-2": 0.02, "ViT": 0.00},
    ),
}


def orthogonal_points(pairs: pd.DataFrame) -> pd.DataFrame:
    """:func:`study_points` (with :data:`CALIBRATED`) of a run aligned by orthogonal maps, each method named
    ``<method>@orthogonal``."""
    points = study_points(pairs, COLUMNS | CALIBRATED)
    return points.assign(method=points["method"] + ORTHOGONAL)


def relative_reductions(table: pd.DataFrame, naive: str = "identity") -> pd.DataFrame:
    """Each method's plain test B½ of :func:`method_table` as a reduction of ``naive``'s, ``100 (1 − B/B_naive)``
    %, beside Theus et al.'s reduction of their counterpart (:data:`THEUS`; their units differ, their ratios
    compare)."""
    base = float(table.set_index("method").loc[naive, "B_mid"])
    theirs = {method: (name, values) for name, (ours, values) in THEUS.items() for method in ours}
    rows = []
    for _, r in table.iterrows():
        name, values = theirs.get(r["method"], ("", {}))
        rows.append(
            {"method": r["method"], "B_mid": r["B_mid"], "reduction_pct": 100 * (1 - r["B_mid"] / base), "theirs": name}
            | {f"{model}_reduction_pct": _reduction(values, model) for model in ("GPT-2", "ViT")}
        )
    return pd.DataFrame(rows)


def _reduction(values: Mapping[str, float], model: str) -> float:
    """Theus et al.'s reduction of ``model``'s naive barrier by the alignment of barrier ``values[model]``."""
    return 100 * (1 - values[model] / THEUS["naive"][1][model]) if model in values else float("nan")
