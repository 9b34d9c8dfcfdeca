"""The paper's qualitative findings (its Sections 3–6 and Appendix H), each checked on this run's tables.

Every :class:`Finding` carries the paper's claim, a criterion written before looking at any run
(tests over pairs where one applies: paired t-tests of ``scipy.stats.ttest_rel`` at ``level``), the
numbers of this run that bear on it, and ``holds``: True, False, or None when this run cannot test it
(a method or a sweep it needs is missing, or a test needs more than one pair). A finding that does
not hold is reported as such.

The paper's WM and STE are the Sinkhorn methods (Appendix D.2), so the roles are filled by
``wm_sinkhorn`` and ``ste_sinkhorn`` when the run has them, else by the re-basin originals
``wm`` and ``ste`` (the finding then names which method it used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from lmclab.studies.three_note import study_note

ROLES = {"naive": ("identity",), "WM": ("wm_sinkhorn", "wm"), "STE": ("ste_sinkhorn", "ste"), "AM": ("am",)}
SMALL_BARRIER = 0.1  # "removes the barrier": B½ at most this fraction of the naive B½
L2_RANGE = (0.0, 25.0)  # "only ~6–20 %": the paper's range (6.6–20.3 %) rounded outwards
SPECTRUM_SPREAD = 0.1  # "nearly coincide": relative distance of a seed's spectrum from the mean


@dataclass(frozen=True)
class Finding:
    key: str
    claim: str  # the paper's statement
    criterion: str  # how this run decides it
    holds: bool | None  # None: this run cannot test it
    numbers: dict[str, float] = field(default_factory=dict)
    note: str = ""  # what a study beyond this run found about the claim

    def as_dict(self) -> dict:
        return asdict(self)


def roles(methods: Sequence[str]) -> dict[str, str]:
    """Which method of the run plays the naive baseline, WM, STE and AM (the paper's first)."""
    return {
        role: next(m for m in names if m in methods)
        for role, names in ROLES.items()
        if any(m in methods for m in names)
    }


def by_pair(pairs: pd.DataFrame, method: str, column: str) -> np.ndarray:
    """``column`` of ``method``, one value per pair, in pair order."""
    rows = pairs[pairs["method"] == method].sort_values("pair")
    return rows[column].to_numpy(dtype=float)


def p_greater(x: np.ndarray, y: np.ndarray) -> float:
    """One-sided paired t-test of ``x > y`` over pairs (NaN with fewer than two pairs or no spread)."""
    if len(x) < 2 or np.allclose(x - y, (x - y)[0]):
        return float("nan") if len(x) < 2 else (0.0 if (x - y)[0] > 0 else 1.0)
    return float(stats.ttest_rel(x, y, alternative="greater").pvalue)


def _r(value: float) -> float:
    return round(float(value), 6)


def verdict(condition: bool, *p_values: float) -> bool | None:
    """``condition``, or None when a test it needs could not run (fewer than two pairs)."""
    return None if any(np.isnan(p) for p in p_values) else bool(condition)


def wm_small_l2(pairs: pd.DataFrame, r: dict[str, str], level: float) -> Finding:
    wm, naive = r["WM"], r["naive"]
    red, b_wm, b_naive = (
        by_pair(pairs, m, c)
        for m, c in ((wm, "l2_reduction_pct"), (wm, "test_loss_barrier_mid"), (naive, "test_loss_barrier_mid"))
    )
    holds = bool(L2_RANGE[0] < red.mean() <= L2_RANGE[1] and b_wm.mean() <= SMALL_BARRIER * b_naive.mean())
    return Finding(
        "wm_small_l2",
        "WM reduces the L2 distance by only ~6–20 % while it removes the barrier",
        f"mean L2 reduction of {wm} in ({L2_RANGE[0]:g}, {L2_RANGE[1]:g}] % and its mean test B½ "
        f"≤ {SMALL_BARRIER:g} × the naive B½",
        holds,
        {"l2_reduction_pct": _r(red.mean()), "B_half": _r(b_wm.mean()), "naive_B_half": _r(b_naive.mean())},
    )


def taylor_misses(pairs: pd.DataFrame, r: dict[str, str], level: float) -> Finding:
    wm = r["WM"]
    real, taylor = by_pair(pairs, wm, "test_loss_barrier_mid"), by_pair(pairs, wm, "test_taylor_barrier_mid")
    p = float(stats.ttest_rel(taylor, real).pvalue) if len(real) > 1 else float("nan")
    return Finding(
        "taylor_misses",
        "the Taylor estimate of Theorem 3.1 misses the real barrier (Table 1, Diff.)",
        f"two-sided paired t-test of Taylor vs real test B½ of {wm} over pairs, p < {level:g}",
        verdict(p < level, p),
        {"B_half": _r(real.mean()), "taylor": _r(taylor.mean()), "diff": _r((taylor - real).mean()), "p": _r(p)},
    )


def wm_aligns(pairs: pd.DataFrame, r: dict[str, str], level: float) -> Finding:
    wm, naive = r["WM"], r["naive"]
    r0, r3 = by_pair(pairs, wm, "R_0"), by_pair(pairs, wm, "R_0.3")
    n0, n3 = by_pair(pairs, naive, "R_0"), by_pair(pairs, naive, "R_0.3")
    p = {
        "p_wm_vs_naive_R_0": p_greater(r0, n0),
        "p_wm_vs_naive_R_0.3": p_greater(r3, n3),
        "p_R_0.3_vs_R_0": p_greater(r3, r0),
    }
    near_zero = abs(n0.mean()) <= 0.1 * r0.mean() and abs(n3.mean()) <= 0.1 * r3.mean()
    return Finding(
        "wm_aligns_singular_vectors",
        "R ≈ 0 without permutation; with WM R > 0, larger at γ = 0.3",
        f"|naive R_γ| ≤ 0.1 × {wm}'s R_γ (γ = 0, 0.3); one-sided paired t-tests over pairs, "
        f"p < {level:g}: {wm}'s R_γ > naive R_γ and its R_0.3 > R_0",
        verdict(near_zero and all(v < level for v in p.values()), *p.values()),
        {
            "naive_R_0": _r(n0.mean()),
            "naive_R_0.3": _r(n3.mean()),
            "R_0": _r(r0.mean()),
            "R_0.3": _r(r3.mean()),
            **{k: _r(v) for k, v in p.items()},
        },
    )


def spectra_coincide(spectrum: pd.DataFrame) -> Finding:
    """Per layer, each seed's ``‖s_seed − s_mean‖ / ‖s_mean‖``; hidden layers are the non-output ones."""
    spread = {}
    for layer, rows in spectrum.groupby("layer", sort=False):
        table = rows.pivot(index="seed", columns="index", values="singular_value").to_numpy()
        mean = table.mean(0)
        spread[layer] = float((np.linalg.norm(table - mean, axis=1) / np.linalg.norm(mean)).max())
    hidden = [lay for lay in spread if not spectrum[spectrum["layer"] == lay]["output"].any()]
    worst = max(spread[lay] for lay in hidden)
    return Finding(
        "spectra_coincide",
        "singular value spectra of hidden layers nearly coincide across seeds",
        f"every hidden layer: each seed's spectrum within {SPECTRUM_SPREAD:g} (relative L2) of "
        "the mean spectrum over seeds",
        bool(worst <= SPECTRUM_SPREAD),
        {f"spread {lay}": _r(v) for lay, v in spread.items()},
    )


def energy_concentrates(energy: pd.DataFrame, level: float) -> Finding:
    """Spearman ρ between singular value and input energy E[(vᵀz)²], per seed and layer whose input
    is a hidden representation (every layer but the first)."""
    layers = list(dict.fromkeys(energy["layer"]))[1:]
    rhos, ps, shares = [], [], []
    for _, rows in energy[energy["layer"].isin(layers)].groupby(["seed", "layer"]):  # per (seed, layer)
        rows = rows.sort_values("index")
        test = stats.spearmanr(rows["singular_value"], rows["energy"])
        rhos.append(test.statistic)
        ps.append(test.pvalue)
        top = max(1, len(rows) // 10)
        shares.append(rows["energy"].iloc[:top].sum() / rows["energy"].sum())
    return Finding(
        "energy_concentrates",
        "input energy E[(vᵀz)²] concentrates on the directions of large singular values in hidden layers",
        f"Spearman ρ(s_i, E[(v_iᵀz)²]) > 0 with p < {level:g} for every seed and every layer whose "
        "input is a hidden layer",
        bool(min(rhos) > 0 and max(ps) < level),
        {"min_rho": _r(min(rhos)), "max_p": _r(max(ps)), "mean_top10pct_energy_share": _r(np.mean(shares))},
    )


def am_like_wm(pairs: pd.DataFrame, r: dict[str, str], level: float) -> Finding:
    am, wm, naive = r["AM"], r["WM"], r["naive"]
    b_am, b_naive = by_pair(pairs, am, "test_loss_barrier_mid"), by_pair(pairs, naive, "test_loss_barrier_mid")
    r_am, r_naive = by_pair(pairs, am, "R_0.3"), by_pair(pairs, naive, "R_0.3")
    red = by_pair(pairs, am, "l2_reduction_pct")
    p = p_greater(r_am, r_naive)
    holds = verdict(
        b_am.mean() <= SMALL_BARRIER * b_naive.mean() and p < level and L2_RANGE[0] < red.mean() <= L2_RANGE[1], p
    )
    return Finding(
        "am_like_wm",
        "AM behaves like WM: small barrier, small L2 reduction, aligned singular vectors",
        f"{am}: mean test B½ ≤ {SMALL_BARRIER:g} × naive, L2 reduction in ({L2_RANGE[0]:g}, "
        f"{L2_RANGE[1]:g}] %, R_0.3 > naive (one-sided paired t-test, p < {level:g})",
        holds,
        {
            "B_half": _r(b_am.mean()),
            "l2_reduction_pct": _r(red.mean()),
            "R_0.3": _r(r_am.mean()),
            "p_R_0.3_vs_naive": _r(p),
            "WM_B_half": _r(by_pair(pairs, wm, "test_loss_barrier_mid").mean()),
            "WM_R_0.3": _r(by_pair(pairs, wm, "R_0.3").mean()),
        },
    )


def ste_barrier_without_alignment(pairs: pd.DataFrame, r: dict[str, str], level: float) -> Finding:
    ste, wm, naive = r["STE"], r["WM"], r["naive"]
    b_ste, b_naive = by_pair(pairs, ste, "test_loss_barrier_mid"), by_pair(pairs, naive, "test_loss_barrier_mid")
    p_r = p_greater(by_pair(pairs, wm, "R_0.3"), by_pair(pairs, ste, "R_0.3"))
    p_l2 = p_greater(by_pair(pairs, wm, "l2_reduction_pct"), by_pair(pairs, ste, "l2_reduction_pct"))
    holds = verdict(b_ste.mean() <= SMALL_BARRIER * b_naive.mean() and p_r < level and p_l2 < level, p_r, p_l2)
    return Finding(
        "ste_barrier_without_alignment",
        "STE reaches a small barrier while its R and L2 reduction stay well below WM's",
        f"{ste}: mean test B½ ≤ {SMALL_BARRIER:g} × naive; {wm}'s R_0.3 and "
        f"L2 reduction > {ste}'s (one-sided paired t-tests, p < {level:g})",
        holds,
        {
            "B_half": _r(b_ste.mean()),
            "R_0.3": _r(by_pair(pairs, ste, "R_0.3").mean()),
            "l2_reduction_pct": _r(by_pair(pairs, ste, "l2_reduction_pct").mean()),
            "WM_R_0.3": _r(by_pair(pairs, wm, "R_0.3").mean()),
            "WM_l2_reduction_pct": _r(by_pair(pairs, wm, "l2_reduction_pct").mean()),
            "p_R_0.3": _r(p_r),
            "p_l2_reduction": _r(p_l2),
        },
    )


def three_models(edges: pd.DataFrame, r: dict[str, str], study: dict | None = None, level: float = 0.05) -> Finding:
    wm, ste = r["WM"], r["STE"]
    bc = edges[edges["edge"] == "b-c"].set_index(["method", "triple"]).sort_index()
    numbers, below = {}, []
    for q in ("test_loss_barrier_max", "test_acc_barrier_max"):
        x, y = bc.loc[wm, q].to_numpy(dtype=float), bc.loc[ste, q].to_numpy(dtype=float)
        below.append(bool((x < y).all()))
        numbers.update({f"WM {q}": _r(x.mean()), f"STE {q}": _r(y.mean())})
    return Finding(
        "three_models",
        "with three models WM keeps the b–c barrier small and STE does not (Table 3)",
        f"in every triple, {wm}'s b–c test loss and accuracy barriers (max over λ) are below {ste}'s",
        bool(all(below)),
        numbers,
        study_note(study, level) if study else "",
    )


def needs(key: str, claim: str, what: str) -> Finding:
    return Finding(key, claim, f"not tested by this run: needs {what}", None)


# key -> the roles its check needs, and for a run without them: the claim in short and what it needs
NEEDS = {
    "wm_small_l2": (("WM", "naive"), "WM reduces L2 by only ~6–20 %", "WM+naive in permute.methods"),
    "taylor_misses": (("WM",), "the Taylor estimate misses", "WM in permute.methods"),
    "wm_aligns_singular_vectors": (("WM", "naive"), "R > 0 with WM", "WM+naive in permute.methods"),
    "spectra_coincide": ((), "", ""),
    "energy_concentrates": ((), "", ""),
    "am_like_wm": (("AM", "WM", "naive"), "AM behaves like WM", "am, a WM and identity in permute.methods"),
    "ste_barrier_without_alignment": (("STE", "WM", "naive"), "STE: small barrier, low R", "an STE, a WM and identity"),
    "three_models": (("WM", "STE"), "WM keeps b–c small, STE does not", "a WM and an STE in three.methods"),
}
SWEEPS = (  # never tested by a run: the sweeps are studies of their own
    "easier_when_wider_or_regularised",
    "wider models, stronger weight decay and a larger learning rate make alignment and LMC easier (Appendix H.4, H.5)",
    "the width, weight-decay and learning-rate sweeps (docs: Analyses and studies); their reports, "
    "reports/sweeps/*/sweep.md, say which trends hold",
)


def paper_findings(
    pairs: pd.DataFrame,
    spectrum: pd.DataFrame,
    energy: pd.DataFrame,
    edges: pd.DataFrame,
    methods: Sequence[str],
    three_methods: Sequence[str],
    level: float = 0.05,
    study: dict | None = None,
) -> list[Finding]:
    """Every finding of the paper in its order; untestable ones (:data:`NEEDS`) with ``holds = None``.
    ``study`` (:func:`lmclab.studies.three_study.study_summary`) adds the three-model study's note."""
    r, r3 = roles(methods), roles(three_methods)
    checks: dict[str, Callable[[], Finding]] = {
        "wm_small_l2": lambda: wm_small_l2(pairs, r, level),
        "taylor_misses": lambda: taylor_misses(pairs, r, level),
        "wm_aligns_singular_vectors": lambda: wm_aligns(pairs, r, level),
        "spectra_coincide": lambda: spectra_coincide(spectrum),
        "energy_concentrates": lambda: energy_concentrates(energy, level),
        "am_like_wm": lambda: am_like_wm(pairs, r, level),
        "ste_barrier_without_alignment": lambda: ste_barrier_without_alignment(pairs, r, level),
        "three_models": lambda: three_models(edges, r3, study, level),
    }
    out = []
    for key, check in checks.items():
        keys, claim, what = NEEDS[key]
        have = r3 if key == "three_models" else r
        out.append(check() if all(k in have for k in keys) else needs(key, claim, what))
    return [*out, needs(*SWEEPS)]
