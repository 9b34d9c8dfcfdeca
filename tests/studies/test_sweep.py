"""Sweep study (Appendix H.5): tables per swept value and the paper's trends tested over (value, pair)."""

from __future__ import annotations

import pandas as pd
import pytest

from lmclab.studies.sweep import sweep_markdown, sweep_points, sweep_table, trends


def pairs(b: list[float], r: list[float]) -> pd.DataFrame:
    rows = [
        {"pair": f"p{i}", "method": "wm_sinkhorn", "test_loss_barrier_mid": bi, "l2_reduction_pct": 8.0, "R_0.3": ri}
        for i, (bi, ri) in enumerate(zip(b, r, strict=True))
    ]
    rows += [
        {"pair": f"p{i}", "method": "identity", "test_loss_barrier_mid": 1.0, "l2_reduction_pct": 0.0, "R_0.3": 0.0}
        for i in range(len(b))
    ]
    return pd.DataFrame(rows)


RUNS = {
    0.0: pairs([0.3, 0.32, 0.31], [0.05, 0.06, 0.055]),
    1e-3: pairs([0.2, 0.21, 0.22], [0.08, 0.07, 0.09]),
    1e-2: pairs([0.1, 0.12, 0.11], [0.1, 0.11, 0.12]),
}


def test_sweep_table_is_mean_and_sample_std_per_value_and_method():
    table = sweep_table(sweep_points(RUNS, ["identity", "wm_sinkhorn"]))
    wm = table[table["method"] == "wm_sinkhorn"]
    assert wm["value"].tolist() == [0.0, 1e-3, 1e-2]
    assert wm["B_half_mean"].tolist() == pytest.approx([0.31, 0.21, 0.11])
    assert wm["B_half_std"].tolist() == pytest.approx([0.01, 0.01, 0.01])  # ddof = 1
    assert "| 0.01 | wm_sinkhorn | 0.1100 ± 0.0100 |" in sweep_markdown(table, [], "train.weight_decay")


def test_trends_hold_only_with_the_predicted_sign():
    points = sweep_points(RUNS, ["wm_sinkhorn"])
    verdicts = {v["quantity"]: v for v in trends(points, "wm_sinkhorn", "train.weight_decay")}
    assert verdicts["B_half"]["holds"] and verdicts["B_half"]["rho"] < 0  # the barrier falls as wd grows
    assert verdicts["R_0.3"]["holds"] and verdicts["R_0.3"]["rho"] > 0  # alignment rises
    reversed_runs = {v: RUNS[k] for v, k in zip(sorted(RUNS, reverse=True), sorted(RUNS), strict=True)}
    against = {
        v["quantity"]: v["holds"] for v in trends(sweep_points(reversed_runs, ["wm_sinkhorn"]), "wm_sinkhorn", "x")
    }
    assert against == {"B_half": False, "R_0.3": False}
    text = sweep_markdown(sweep_table(points), list(verdicts.values()), "train.weight_decay")
    assert "| wm_sinkhorn's B_half falls as train.weight_decay grows |" in text and "**holds**" in text
