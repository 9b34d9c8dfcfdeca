"""The transformer study's table (lmclab.studies.transformer_study): closed cases of the identity
fraction, means and sample stds over pairs, a column a run lacks shown as a dash."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from lmclab.studies.transformer_study import identity_fraction, markdown_table, study_table


def test_identity_fraction_counts_the_units_left_in_place():
    assert identity_fraction({"P_res": torch.arange(6)}, "P_res") == 1.0
    assert identity_fraction({"P_res": torch.tensor([1, 0, 2, 3])}, "P_res") == 0.5
    assert identity_fraction({"P_res": torch.tensor([1, 2, 0])}, "P_res") == 0.0
    rotated = {"P_0": torch.eye(3)}  # a run aligned by orthogonal maps: its stream is no permutation
    assert math.isnan(identity_fraction(rotated, "P_res")) and math.isnan(identity_fraction(rotated, "P_0"))


def test_study_table_is_the_mean_and_sample_std_over_pairs_per_run_and_method():
    supervised = pd.DataFrame(
        {
            "method": ["wm", "wm", "identity", "identity"],
            "norepair_test_loss_barrier_mid": [0.1, 0.3, 1.0, 2.0],
            "test_loss_barrier_mid": [0.0, 0.2, 0.5, 0.5],
            "norepair_test_acc_barrier_mid": [1.0, 3.0, 10.0, 20.0],
            "l2_reduction_pct": [10.0, 20.0, 0.0, 0.0],
            "p_res_identity": [0.25, 0.75, 1.0, 1.0],
            "search_seconds": [2.0, 4.0, 0.0, 0.0],
        }
    )
    mae = supervised.drop(columns=["norepair_test_acc_barrier_mid"]).assign(probe_acc_barrier_mid=[4.0, 6.0, 8.0, 8.0])
    table = study_table({"supervised": supervised, "mae": mae})
    assert list(zip(table["run"], table["method"], strict=True)) == [
        ("supervised", "wm"),
        ("supervised", "identity"),
        ("mae", "wm"),
        ("mae", "identity"),
    ]
    wm = table.iloc[0]
    assert wm["B_mid"] == pytest.approx(0.2) and wm["B_mid_std"] == pytest.approx(0.1414213562)
    assert wm["B_mid_repair"] == pytest.approx(0.1) and wm["acc_mid"] == pytest.approx(2.0)
    assert wm["p_res_identity"] == pytest.approx(0.5) and wm["pairs"] == 2
    assert pd.isna(table.iloc[2]["acc_mid"]) and table.iloc[2]["probe_mid"] == pytest.approx(5.0)
    text = markdown_table(table, lambda m: {"wm": "WM (re-basin)"}.get(m, m))
    assert "| supervised | WM (re-basin) | 0.200 ± 0.141 | 0.100 ± 0.141 |" in text
    assert "| mae | identity | 1.500 ± 0.707 | 0.500 ± 0.000 | — | — | — | 8.0 ± 0.0 |" in text
