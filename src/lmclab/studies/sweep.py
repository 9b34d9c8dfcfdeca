"""Sweeps of one training parameter (Appendix H.5: weight decay, learning rate; H.4: width): does
alignment and LMC get easier as the value grows?

Each run is one ``dvc exp`` of the default pipeline with ``-S <param>=<value>``; :func:`sweep_table`
takes ``{value: pairs table}`` (``data/tables/pairs.parquet`` of each run) and returns, per value and
method, the mean ± sample std over pairs of the test B½, the L2 reduction and R_0.3(θa, π(θb)).
:func:`trends` states each of the paper's trends with a test over every (value, pair) point:
Spearman's ρ between the swept value and the quantity, with the sign the paper predicts, p < level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from scipy import stats

QUANTITIES = {"B_half": "test_loss_barrier_mid", "L2_red": "l2_reduction_pct", "R_0.3": "R_0.3"}
# the paper's prediction as the value grows: the barrier falls, alignment (R) rises
EXPECTED = {"B_half": -1, "R_0.3": +1}


def sweep_points(runs: Mapping[float, pd.DataFrame], methods: Sequence[str]) -> pd.DataFrame:
    """One row per value, method and pair with the :data:`QUANTITIES` (columns renamed)."""
    frames = []
    for value, pairs in sorted(runs.items()):
        rows = pairs[pairs["method"].isin(methods)]
        cols = {c: q for q, c in QUANTITIES.items() if c in rows}
        frames.append(rows[["method", "pair", *cols]].rename(columns=cols).assign(value=value))
    return pd.concat(frames, ignore_index=True)


def sweep_table(points: pd.DataFrame) -> pd.DataFrame:
    """Per value and method: ``<quantity>_mean`` and ``<quantity>_std`` (sample std) over pairs."""
    quantities = [q for q in QUANTITIES if q in points]
    grouped = points.groupby(["value", "method"], sort=True)[quantities]
    mean, std = grouped.mean().add_suffix("_mean"), grouped.std(ddof=1).fillna(0).add_suffix("_std")
    return mean.join(std).reset_index()


def trends(points: pd.DataFrame, method: str, param: str, level: float = 0.05) -> list[dict]:
    """For :data:`EXPECTED`: Spearman ρ of ``method``'s quantity against the swept value over all
    (value, pair) points, and whether the paper's trend holds (the predicted sign, p < level)."""
    rows = points[points["method"] == method]
    out = []
    for quantity, sign in EXPECTED.items():
        if quantity not in rows or rows["value"].nunique() < 2:
            continue
        test = stats.spearmanr(rows["value"], rows[quantity])
        out.append(
            {
                "param": param,
                "method": method,
                "quantity": quantity,
                "expected": "falls" if sign < 0 else "rises",
                "rho": float(test.statistic),
                "p": float(test.pvalue),
                "n_points": len(rows),
                "holds": bool(sign * test.statistic > 0 and test.pvalue < level),
            }
        )
    return out


def sweep_markdown(table: pd.DataFrame, verdicts: Sequence[dict], param: str) -> str:
    """The table per value and method and the trend verdicts, as Markdown."""
    quantities = [q for q in QUANTITIES if f"{q}_mean" in table]
    lines = [f"| {param} | method | " + " | ".join(quantities) + " |", "|---|---|" + "---|" * len(quantities)]
    for _, r in table.iterrows():
        cells = " | ".join(f"{r[q + '_mean']:.4f} ± {r[q + '_std']:.4f}" for q in quantities)
        lines.append(f"| {r['value']:g} | {r['method']} | {cells} |")
    lines += ["", "| trend (the paper, Appendix H) | Spearman ρ | p | points | verdict |", "|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(
            f"| {v['method']}'s {v['quantity']} {v['expected']} as {param} grows | {v['rho']:.3f} | "
            f"{v['p']:.3g} | {v['n_points']} | {'**holds**' if v['holds'] else '**does not hold**'} |"
        )
    return "\n".join(lines)
