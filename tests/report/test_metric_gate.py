"""The metric gate's verdicts, the headline metrics and the DVC plot data, on hand-made tables."""

from __future__ import annotations

import pandas as pd
import pytest

from lmclab.report.headline import headline_metrics
from lmclab.report.metric_gate import Tolerance, judge, judge_all, parse_tolerances, summary_line, verdict_table
from lmclab.report.plot_data import interpolation_points, plot_tables, write_plot_tables

RULES = parse_tolerances(
    {
        "rules": {
            "wm.sec": {"rel": 0.5},
            "*.sec": {"abs": 1.0},
            "*.B_loss": {"abs": 0.05},
            "*.L2_red": {"abs": 0.1, "rel": 0.1},
        }
    }
)


def test_a_metric_passes_exactly_up_to_abs_plus_rel_times_the_baseline():
    assert judge("am.L2_red", 10.0, 11.1, RULES).ok and not judge("am.L2_red", 10.0, 11.11, RULES).ok
    assert judge("am.L2_red", -10.0, -11.1, RULES).ok  # rel scales |old|
    assert judge("am.B_loss", 0.10, 0.05, RULES).ok and not judge("am.B_loss", 0.10, 0.0499, RULES).ok


def test_the_first_matching_rule_wins():
    assert judge("wm.sec", 2.0, 2.9, RULES).tolerance == Tolerance(rel=0.5)
    assert not judge("wm.sec", 2.0, 3.1, RULES).ok  # 1.0 abs of *.sec would pass it
    assert judge("am.sec", 2.0, 3.0, RULES).ok


def test_no_rule_or_a_missing_side_fails():
    assert judge("wm.R03", 0.1, 0.1, RULES).reason == "no tolerance"
    assert judge("wm.B_loss", None, 0.1, RULES).reason == "missing in baseline"
    assert judge("wm.B_loss", 0.1, None, RULES).reason == "missing in this run"
    assert not any(v.ok for v in (judge("wm.R03", 0.1, 0.1, RULES), judge("wm.B_loss", 0.1, None, RULES)))


def test_dvc_metrics_diff_json_is_judged_per_metric_and_summarised():
    diff = {
        "metrics/headline.json": {
            "wm.B_loss": {"old": 0.1, "new": 0.3, "diff": 0.2},
            "am.B_loss": {"old": 0.1, "new": 0.1, "diff": 0.0},
        }
    }
    verdicts = judge_all(diff, RULES)
    assert [v.name for v in verdicts] == ["am.B_loss", "wm.B_loss"]
    assert summary_line(verdicts) == "FAIL: 1 of 2 headline metrics: wm.B_loss (beyond)"
    table = verdict_table(verdicts)
    assert table.index("wm.B_loss") < table.index("am.B_loss")  # failures first
    assert "| `wm.B_loss` | 0.1 | 0.3 | 0.2 | ±0.05 | ❌ beyond |" in table
    assert summary_line(verdicts[:1]) == "PASS: all 1 headline metrics within tolerance"


@pytest.mark.parametrize(
    "doc", [{}, {"rules": {}}, {"rules": {"*": {"abs": -1}}}, {"rules": {"*": {"tol": 1}}}, {"rules": {"*": 0.1}}]
)
def test_a_bad_tolerance_file_is_a_one_line_error(doc):
    with pytest.raises(ValueError, match="tolerance file"):
        parse_tolerances(doc)


def _curves() -> pd.DataFrame:
    rows = []
    for pair in ("seed0-seed1", "seed2-seed3"):
        for method, bump in (("identity", 1.0), ("wm", 0.1)):
            for lam in (0.0, 0.5, 1.0):
                for split in ("train", "test"):
                    mid = lam == 0.5
                    rows.append(
                        {
                            "pair": pair,
                            "method": method,
                            "lam": lam,
                            "split": split,
                            "loss": 0.2 + bump * mid,
                            "acc": 0.9 - 0.5 * bump * mid,
                        }
                    )
    return pd.DataFrame(rows)


def test_headline_metrics_average_pairs_and_take_the_b_c_edge():
    pairs = pd.DataFrame(
        {
            "method": ["wm", "wm", "am", "am"],
            "test_loss_barrier_mid": [0.1, 0.3, 0.0, 0.2],
            "test_acc_barrier_max": [1.0, 3.0, 0.0, 1.0],
            "l2_reduction_pct": [7.0, 9.0, 5.0, 5.0],
            "R_0.3": [0.2, 0.4, 0.1, 0.1],
            "search_seconds": [1.0, 3.0, 0.5, 0.5],
        }
    )
    edges = pd.DataFrame(
        {
            "method": ["wm"] * 3,
            "edge": ["a-b", "a-c", "b-c"],
            "test_loss_barrier_max": [9.0, 9.0, 0.25],
            "test_acc_barrier_max": [9.0, 9.0, 1.5],
        }
    )
    history = pd.DataFrame({"seed": [0, 0, 1, 1], "epoch": [1, 2, 1, 2], "test_acc": [0.5, 0.9, 0.5, 0.95]})
    evaluation = pd.DataFrame(
        {
            "split": ["test"] * 6,
            "method": ["merge_many", "naive", "ensemble", "c2m3", "c2m3", "models"],
            "model": ["merged", "average", "ensemble", "merged", "merged", "seed0"],
            "repaired": [False, False, False, False, True, False],
            "acc": [0.8, 0.1, 0.97, 0.85, 0.9, 0.95],
            "loss": [0.5, 2.3, 0.1, 0.4, 0.3, 0.2],
        }
    )
    out = headline_metrics(
        history=history, pairs=pairs, edges=edges, evaluation=evaluation, methods=["wm", "am"], three_methods=["wm"]
    )
    assert out["endpoints"] == {"acc": 92.5}
    assert out["wm"] == {
        "B_loss": 0.2,
        "B_acc": 2.0,
        "L2_red": 8.0,
        "R03": 0.3,
        "sec": 2.0,
        "bc_B_loss": 0.25,
        "bc_B_acc": 1.5,
    }
    assert "bc_B_loss" not in out["am"] and out["merge_many"] == {
        "merged_acc": 80.0,
        "naive_acc": 10.0,
        "ensemble_acc": 97.0,
        "c2m3_acc": 85.0,  # the unrepaired merge; members are no headline
    }


def test_interpolation_points_have_one_row_per_pair_method_and_lambda_with_percent_accuracy():
    points = interpolation_points(_curves())
    assert len(points) == 2 * 2 * 3 and list(points.columns[:3]) == ["pair", "method", "lam"]
    mid = points[(points["method"] == "identity") & (points["lam"] == 0.5)].iloc[0]
    assert mid["test_loss"] == pytest.approx(1.2) and mid["test_acc"] == pytest.approx(40.0)
    repaired = pd.concat([_curves().assign(repair=False), _curves().assign(repair=True, loss=7.0)])
    assert set(interpolation_points(repaired)["test_loss"]) == {7.0}  # the repaired curve is plotted


def test_plot_tables_are_written_as_csv_without_leftovers(tmp_path):
    history = pd.DataFrame(
        {
            "seed": [0],
            "epoch": [1],
            "train_loss": [0.5],
            "test_loss": [0.4],
            "train_acc": [0.8],
            "test_acc": [0.9],
            "lr": [1e-3],
        }
    )
    search = pd.DataFrame(
        {"pair": ["p"], "method": ["ste"], "epoch": [0], "l2": [3.0], "test_loss": [1.0], "test_acc": [0.5]}
    )
    objective = pd.DataFrame({"pair": ["p"], "method": ["wm"], "sweep": [0], "objective": [1.0]})
    paths = write_plot_tables(
        plot_tables({"curves": _curves(), "history": history, "search_curves": search, "search_objective": objective}),
        tmp_path,
    )
    assert (
        sorted(p.name for p in tmp_path.iterdir())
        == sorted(p.name for p in paths)
        == ["interpolation.csv", "search_curves.csv", "training.csv", "wm_objective.csv"]
    )
    training = pd.read_csv(tmp_path / "training.csv")
    assert training.loc[0, "seed"] == "seed0" and training.loc[0, "test_acc"] == 90.0 and "lr" not in training


def test_the_verdict_table_has_its_header_then_failures_first_with_their_tolerances():
    from lmclab.report.metric_gate import Verdict

    verdicts = [
        Verdict("wm.sec", 2.0, 2.5, Tolerance(rel=0.5), True, "within"),
        Verdict("am.B_loss", 0.1, 0.2, Tolerance(abs=0.05, rel=0.1), False, "beyond"),
        Verdict("wm.R03", 0.1, 0.1, Tolerance(), True, "within"),
        Verdict("wm.B_acc", None, 1.0, None, False, "missing in baseline"),
    ]
    lines = verdict_table(verdicts).splitlines()
    assert lines[:2] == ["| metric | baseline | this run | Δ | tolerance | verdict |", "|---|---:|---:|---:|---|---|"]
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["`am.B_loss`", "`wm.B_acc`", "`wm.sec`", "`wm.R03`"]
    assert [line.split("|")[5].strip() for line in lines[2:]] == ["±0.05 + ±10 %", "—", "±50 %", "0"]
    assert [line.split("|")[1].strip() for line in verdict_table(verdicts, only_changed=True).splitlines()[2:]] == [
        "`am.B_loss`",
        "`wm.B_acc`",
        "`wm.sec`",
    ]
