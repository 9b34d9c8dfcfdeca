"""The three-model study's table builder (src/lmclab/analysis/three_study.py): closed forms."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lmclab.analysis.three_study import BC, paired_test, r_tracks_barrier, study_markdown, study_table

WM = [0.1, 0.2, 0.3]  # b–c barriers of the paper's WM in triples t0, t1, t2
STE = [0.2, 0.4, 0.3]  # the paper's STE: differences −0.1, −0.2, 0.0


def _edges(wm=WM, ste=STE, point="default") -> pd.DataFrame:
    rows = []
    for method, values in (("wm_sinkhorn", wm), ("ste_sinkhorn", ste)):
        for t, v in enumerate(values):
            for edge, r in (("a-b", 0.2 + t), ("a-c", 0.4), ("b-c", v / 10)):
                rows.append(
                    {
                        "point": point,
                        "axis": "default",
                        "value": "default",
                        "triple": f"t{t}",
                        "method": method,
                        "edge": edge,
                        **{c: (v if edge == "b-c" else 0.0) for c in BC},
                        "R_0.3": r,
                    }
                )
    return pd.DataFrame(rows)


def test_paired_test_is_the_paired_t_test_over_triples() -> None:
    """n = 3 (df 2): t = mean/(sd/√n) = −0.1/(0.1/√3), two-sided p = 1 − |t|/√(t² + 2)."""
    out = paired_test(_edges(), "test_loss_barrier_mid")
    t = -0.1 / (0.1 / math.sqrt(3))
    assert out["n"] == 3 and out["diff"] == pytest.approx(-0.1)
    assert out["p"] == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2))
    assert out["below_in_every"] is False  # the third triple ties
    assert paired_test(_edges(ste=[0.2, 0.4, 0.5]), "test_loss_barrier_mid")["below_in_every"] is True


def test_study_table_means_and_stds_per_point_and_method() -> None:
    table = study_table(_edges()).set_index("method")
    wm = table.loc["wm_sinkhorn"]
    assert wm["n_triples"] == 3
    assert wm["test_loss_barrier_mid_mean"] == pytest.approx(0.2) and wm["test_loss_barrier_mid_std"] == pytest.approx(
        0.1
    )
    assert wm["R_0.3_mean"] == pytest.approx(0.02)  # b–c's R
    assert wm["R_0.3_a-b_mean"] == pytest.approx(1.2) and wm["R_0.3_a-b_std"] == pytest.approx(1.0)
    assert wm["p_test_loss_barrier_mid"] == pytest.approx(paired_test(_edges(), "test_loss_barrier_mid")["p"])
    assert table.loc["ste_sinkhorn", "test_loss_barrier_mid_mean"] == pytest.approx(0.3)


def test_study_markdown_says_whether_the_ordering_holds_per_setting() -> None:
    edges = pd.concat([_edges(), _edges(ste=[0.2, 0.4, 0.5], point="epochs-100").assign(axis="epochs", value="100")])
    text = study_markdown(study_table(edges), edges, defaults={"epochs": "20"})
    ordering = text.split("## Does")[1]
    assert "| default | no (p 0.225)" in ordering and "| epochs 100 | yes (p " in ordering
    assert "| epochs 100 | wm_sinkhorn | 3 | 0.200 ± 0.100 |" in text


def test_r_tracks_barrier_is_spearmans_rho_over_points_and_methods() -> None:
    table = pd.DataFrame(
        {
            "method": ["wm_sinkhorn"] * 3 + ["wm"],
            "R_0.3_mean": [0.1, 0.2, 0.3, 0.9],
            "test_loss_barrier_mid_mean": [0.3, 0.2, 0.1, 5.0],
        }
    )
    out = r_tracks_barrier(table)
    assert out["rho"] == pytest.approx(-1.0) and out["n"] == 3  # coordinate-descent wm left out
