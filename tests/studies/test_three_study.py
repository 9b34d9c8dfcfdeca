"""The three-model study's table builder (src/lmclab/studies/three_study.py): closed forms."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from lmclab.studies.three_note import EXPLANATION, study_note
from lmclab.studies.three_study import (
    BC,
    edge_stalled,
    objective_ratio,
    ordering,
    paired_test,
    r_explains_ordering,
    r_tracks_barrier,
    search_objective,
    study_markdown,
    study_summary,
    study_table,
)

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
    text = study_markdown(study_table(edges), defaults={"epochs": "20"})
    ordering = text.split("## Does")[1]
    assert "| default | mixed (p 0.225)" in ordering and "| epochs 100 | yes (p " in ordering
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


def _three_points() -> pd.DataFrame:
    """default: mixed (a tie); epochs 100: WM below in every triple; width 128: STE below in every triple."""
    return pd.concat(
        [
            _edges(),
            _edges(ste=[0.2, 0.4, 0.5], point="epochs-100").assign(axis="epochs", value="100"),
            _edges(ste=[0.05, 0.1, 0.2], point="width-128").assign(axis="width", value="128"),
        ]
    )


def test_ordering_is_holds_reversed_or_mixed_over_every_triple() -> None:
    table = study_table(_three_points()).set_index(["point", "method"])
    found = {p: ordering(table.loc[(p, "wm_sinkhorn")]) for p in ("default", "epochs-100", "width-128")}
    assert found == {"default": "mixed", "epochs-100": "holds", "width-128": "reversed"}
    assert ordering(table.loc[("default", "ste_sinkhorn")]) is None  # only the paper's WM row has the test


def test_study_summary_and_the_findings_note_name_each_setting_with_both_means() -> None:
    summary = study_summary(study_table(_three_points()))
    by = {s["setting"]: s for s in summary["settings"]}
    assert by["width 128"]["ordering"] == "reversed"
    assert by["width 128"]["WM"] == pytest.approx(0.2) and by["width 128"]["STE"] == pytest.approx(0.35 / 3)
    assert summary["r_tracks_barrier"]["n"] == 6
    note = study_note(summary)
    assert "holds in every triple: epochs 100 (WM 0.200 vs STE 0.367, p " in note
    assert "reversed in every triple: width 128 (WM 0.200 vs STE 0.117, p " in note
    assert "mixed: default (WM 0.200 vs STE 0.300, p 0.23)" in note
    assert "opposite signs in 0 of 3 settings (sign test p 0.25)" in note  # here R = barrier / 10
    assert note.endswith(
        "the data do not show the paper's explanation (the method that aligns b and c's dominant "
        "singular directions better has the lower b–c barrier)."
    )


def test_r_explains_ordering_counts_opposite_signs_with_the_sign_tests_closed_form() -> None:
    """dR = R_WM − R_STE, dB = B_WM − B_STE per setting; two-sided binomial sign test: 8 of 9 opposite
    gives p = 2·(C(9,8) + C(9,9))/2⁹ = 20/512."""
    d_r = [0.1, 0.2, -0.1, 0.3, -0.2, 0.1, 0.4, -0.3, 0.2]
    d_b = [-1.0, -2.0, 1.0, -3.0, 2.0, -1.0, -4.0, 3.0, 5.0]  # the last has the same sign
    rows = []
    for i, (r, b) in enumerate(zip(d_r, d_b, strict=True)):
        rows += [
            {"point": f"p{i}", "method": "wm_sinkhorn", "R_0.3_mean": 1.0 + r, "test_loss_barrier_mid_mean": b},
            {"point": f"p{i}", "method": "ste_sinkhorn", "R_0.3_mean": 1.0, "test_loss_barrier_mid_mean": 0.0},
            {"point": f"p{i}", "method": "wm", "R_0.3_mean": 9.0, "test_loss_barrier_mid_mean": 9.0},
        ]
    out = r_explains_ordering(pd.DataFrame(rows))
    assert out["n"] == 9 and out["opposite"] == 8
    assert out["p_sign"] == pytest.approx(20 / 512)
    ranks_r = [4.5, 6.5, 3, 8, 2, 4.5, 9, 1, 6.5]  # Spearman ρ: Pearson's r of the ranks (ties averaged)
    ranks_b = [4.5, 3, 6, 2, 7, 4.5, 1, 8, 9]
    assert out["rho"] == pytest.approx(float(pd.Series(ranks_r).corr(pd.Series(ranks_b))))


def test_edge_stalled_names_the_searches_behind_each_edge() -> None:
    moved, stuck = {"curve": [{"changed": None}, {"changed": 4}]}, {"curve": [{"changed": None}, {"changed": 0}]}
    search = {"b": stuck, "c": moved}
    assert edge_stalled("a-b", search) and not edge_stalled("a-c", search) and edge_stalled("b-c", search)
    assert not edge_stalled("b-c", {"b": moved, "c": moved})
    assert not edge_stalled("a-b", {"b": {"objective": [1.0, 2.0]}})  # coordinate descent: no curve


def test_a_stalled_search_leaves_its_setting_out_of_the_verdicts_and_the_statistics() -> None:
    """width 128's STE below WM in every triple; one of its WM searches (triple t1's θb) stalled: the
    setting gets no verdict, its WM row leaves the pooled ρ (6 rows → 5) and the sign test (3 → 2)."""
    edges = _three_points()
    stuck = (edges["point"] == "width-128") & (edges["method"] == "wm_sinkhorn") & (edges["triple"] == "t1")
    edges["stalled"] = stuck & (edges["edge"] != "a-c")  # a–b and b–c: θb's search
    table = study_table(edges)
    rows = table.set_index(["point", "method"])
    assert (
        rows.loc[("width-128", "wm_sinkhorn"), "stalled"] == 1 and rows.loc[("default", "wm_sinkhorn"), "stalled"] == 0
    )
    assert ordering(rows.loc[("width-128", "wm_sinkhorn")]) == "stalled"
    assert ordering(rows.loc[("epochs-100", "wm_sinkhorn")]) == "holds"
    assert r_tracks_barrier(table)["n"] == 5 and r_explains_ordering(table)["n"] == 2
    text = study_markdown(table, defaults={"epochs": "20"})
    assert "| width 128 | wm_sinkhorn (**stalled** in 1 of 6 searches) | 3 |" in text
    assert "| width 128 | — (a search stalled) |" in text
    note = study_note(study_summary(table))
    assert "no verdict, a search stalled (found no alignment): width 128 (WM " in note
    assert "reversed in every triple" not in note and "in 0 of 2 settings" in note


def test_search_objective_is_that_of_the_returned_permutation() -> None:
    assert search_objective({"objective": [6.3, 200.0, 324.5]}) == 324.5  # coordinate descent: last sweep
    curve = [{"epoch": e, "objective": v} for e, v in enumerate([6.3, 50.0, 90.0, 80.0])]
    assert search_objective({"curve": curve, "best_epoch": 2}) == 90.0  # select: best
    assert search_objective({"curve": curve, "best_epoch": 3}) == 80.0  # select: last
    assert search_objective({"curve": [{"epoch": 0, "train_loss": None}]}) is None  # STE: none recorded
    edges = _edges().assign(objective=lambda e: [None if x != "a-b" else 10.0 + i for i, x in enumerate(e["edge"])])
    edges.loc[edges["method"] == "ste_sinkhorn", "objective"] = None
    text = study_markdown(study_table(edges), defaults={})
    assert "| 0.020 ± 0.010 | 13.0 ± 3.0 |" in text  # wm_sinkhorn's a–b rows 0, 3, 6: 10, 13, 16
    assert "| 0.030 ± 0.010 | — |" in text  # STE records no objective


def test_the_objective_ratio_is_a_mean_of_per_triple_ratios() -> None:
    """References that differ per triple (100, 200, 400) with Sinkhorn WM at (50, 180, 400): the mean of the
    ratios (0.5 + 0.9 + 1.0) / 3 = 0.8, not the ratio of the means 630 / 700 = 0.9."""
    rows = [
        {"triple": f"t{t}", "edge": "a-b", "method": method, "objective": value}
        for t, (sinkhorn, wm) in enumerate([(50.0, 100.0), (180.0, 200.0), (400.0, 400.0)])
        for method, value in (("wm_sinkhorn", sinkhorn), ("wm", wm))
    ]
    rows.append({"triple": "t0", "edge": "a-c", "method": "wm", "objective": 1.0})  # other edges are not read
    assert objective_ratio(pd.DataFrame(rows)) == pytest.approx(0.8)
    apart = [("t0", "wm_sinkhorn"), ("t1", "wm")]  # each triple recorded one of the two: none to compare
    rows = [{"triple": t, "edge": "a-b", "method": m, "objective": 1.0} for t, m in apart]
    assert objective_ratio(pd.DataFrame(rows)) is None


def test_an_unconverged_sinkhorn_wm_gets_no_verdict_and_leaves_the_statistics() -> None:
    """Sinkhorn WM's a–b objective over coordinate descent's, per triple then averaged: width 128's
    (40, 45, 50)/100 = 0.45 < ½ → unconverged; epochs 100's (90, 95, 100)/100 = 0.95 keeps its verdict."""
    edges = _three_points().assign(objective=float("nan"))
    ab = edges["edge"] == "a-b"
    for point, values in (("width-128", [40.0, 45.0, 50.0]), ("epochs-100", [90.0, 95.0, 100.0])):
        for t, v in enumerate(values):
            edges.loc[
                ab & (edges["point"] == point) & (edges["method"] == "wm_sinkhorn") & (edges["triple"] == f"t{t}"),
                "objective",
            ] = v
    wm_rows = edges[ab & (edges["method"] == "wm_sinkhorn")].assign(method="wm", objective=100.0)
    edges = pd.concat([edges, wm_rows], ignore_index=True)
    assert objective_ratio(edges[edges["point"] == "width-128"]) == pytest.approx(0.45)
    assert objective_ratio(edges[edges["point"] == "default"]) is None  # Sinkhorn WM recorded none there
    table = study_table(edges)
    rows = table.set_index(["point", "method"])
    assert ordering(rows.loc[("width-128", "wm_sinkhorn")]) == "unconverged"
    assert ordering(rows.loc[("epochs-100", "wm_sinkhorn")]) == "holds"
    assert r_explains_ordering(table)["n"] == 2 and r_tracks_barrier(table)["n"] == 5
    text = study_markdown(table, defaults={})
    assert "| width 128 | — (WM unconverged: ⟨θa, π(θb)⟩ 0.45 of coordinate descent's) |" in text
    assert "no verdict, Sinkhorn WM unconverged" in study_note(study_summary(table))


def test_collect_keeps_the_committed_rows_of_points_run_on_another_machine(tmp_path, monkeypatch) -> None:
    """No experiment of the study exists in this checkout: collect rebuilds the page from the committed
    edges of the points it is asked for, unchanged, instead of leaving them out."""
    import shutil

    from dvc_repo import ROOT
    from typer.testing import CliRunner

    from lmclab.cli import app

    committed = pd.read_parquet(ROOT / "reports/three_study/edges.parquet")
    shutil.copy(ROOT / "reports/three_study/edges.parquet", tmp_path / "edges.parquet")
    monkeypatch.chdir(ROOT)
    args = [
        "study",
        "three",
        "collect",
        "--out",
        str(tmp_path),
        "--points",
        "default,width-128",
        "--params",
        str(ROOT / "params.yaml"),
    ]
    result = CliRunner().invoke(app, [*args, "--dpi", "30"])
    assert result.exit_code == 0, result.output
    assert "default: 27 edges kept from" in result.output
    edges = pd.read_parquet(tmp_path / "edges.parquet")
    expected = committed[committed["point"].isin(["default", "width-128"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(edges.reset_index(drop=True), expected)
    assert set(pd.read_parquet(tmp_path / "table.parquet")["point"]) == {"default", "width-128"}


@pytest.mark.parametrize(
    ("opposite", "n", "p_sign", "level", "says"),
    [
        (10, 12, 0.039, 0.05, "lower b–c barrier, as the paper says."),
        (2, 12, 0.039, 0.05, "higher b–c barrier, the reverse of the paper's explanation."),
        (10, 12, 0.039, 0.01, "the data do not show the paper's explanation"),  # not significant at this level
        (0, 3, 0.25, 0.05, "the data do not show the paper's explanation"),
        (2, 4, 0.01, 0.05, "the data do not show the paper's explanation"),  # no majority, whatever p says
        (0, 0, None, 0.05, "the data do not show the paper's explanation"),  # no setting left to test
    ],
)
def test_the_notes_explanation_follows_the_sign_test_either_way(opposite, n, p_sign, level, says) -> None:
    """The note's last sentence is the sign test's verdict: the paper's explanation, its reverse, or neither."""
    paired = {"n": n, "opposite": opposite, "p_sign": p_sign, "rho": None}
    summary = {"column": "test_loss_barrier_mid", "settings": [], "r_explains_ordering": paired}
    note = study_note(summary, level)
    p = "—" if p_sign is None else f"{p_sign:.2g}"
    assert note.endswith(f"opposite signs in {opposite} of {n} settings (sign test p {p}): {explanation_of(says)}")
    assert ("as the paper says" in note) == (says.endswith("as the paper says."))


def explanation_of(says: str) -> str:
    return next(s for s in EXPLANATION.values() if says in s)


def test_the_default_run_of_each_axis_is_read_from_params_yaml_or_the_file_named(tmp_path) -> None:
    from lmclab.cli.studies.three import defaults

    params = tmp_path / "params.yaml"
    params.write_text(
        "train: {epochs: 20}\ndata: {max_train: null}\nmodel: {mlp: {width: 512}}\npermute:\n"
        "  wm_sinkhorn: {lr: 0.1, epochs: 5, iterations: 20}\n  ste_sinkhorn: {epochs: 3, init: wm}\n"
    )
    assert defaults(params) == {
        "training epochs": "20",
        "training digits": "all",
        "width": "512",
        "width (Sinkhorn WM lr scaled)": "512 × 0.1",
        "Sinkhorn WM schedule": "5 × 20",
        "STE epochs": "3",
        "STE initialisation": "wm",
    }
    params.write_text("train: [\n")
    with pytest.raises(SystemExit, match=f"^error: {re.escape(str(params))}: not valid YAML"):
        defaults(params)
