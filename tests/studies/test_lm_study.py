"""The language-model study (lmclab.studies.lm_study): plain and REPAIR's barriers told apart, means and sample
stds over pairs, the sweeps and their trends, and the explanation's verdict on planted points; the
``lmclab study`` command group that runs it and the six other studies."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lmclab.cli import app
from lmclab.studies.lm_study import (
    explanation,
    method_table,
    plain,
    relative_reductions,
    repaired,
    role_table,
    study_points,
    sweep_points,
    sweep_summary,
    sweep_trends,
)


def pairs_with_repair() -> pd.DataFrame:
    rows = []
    for i, pair in enumerate(("seed0-seed2", "seed1-seed3", "seed4-seed5")):
        for method, plain_b, repair_b, r in (
            ("identity", 2.0, 1.0, 0.1),
            ("wm", 0.3, 0.1, 0.5),
            ("am", 0.2, 0.05, 0.6),
        ):
            rows.append(
                {
                    "pair": pair,
                    "method": method,
                    "ln_repair": True,
                    "test_loss_barrier_mid": repair_b + i * 0.01,
                    "norepair_test_loss_barrier_mid": plain_b + i * 0.01,
                    "test_loss_barrier_max": repair_b,
                    "norepair_test_loss_barrier_max": plain_b,
                    "test_ppl_barrier_mid": 3 * repair_b,
                    "norepair_test_ppl_barrier_mid": 3 * plain_b,
                    "test_acc_barrier_mid": 1.0,
                    "norepair_test_acc_barrier_mid": 10.0 * plain_b,
                    "l2_reduction_pct": 0.0 if method == "identity" else 20.0 + i,
                    "R_0.3": r - 0.01 * i,
                    "search_seconds": 0.0 if method == "identity" else 2.0 * (i + 1),
                }
            )
    return pd.DataFrame(rows)


def test_plain_and_repaired_barriers_come_from_their_own_columns() -> None:
    pairs = pairs_with_repair()
    assert plain(pairs, "test_loss_barrier_mid").equals(pairs["norepair_test_loss_barrier_mid"])
    assert repaired(pairs, "test_loss_barrier_mid").equals(pairs["test_loss_barrier_mid"])
    without = pairs[[c for c in pairs if not c.startswith("norepair_")]].assign(ln_repair=False)
    assert plain(without, "test_loss_barrier_mid").equals(without["test_loss_barrier_mid"])  # measured plain
    assert repaired(without, "test_loss_barrier_mid").isna().all()
    assert plain(pairs, "no_such_column").isna().all() and repaired(pairs, "no_such_column").isna().all()


def test_the_method_table_is_the_mean_and_sample_std_over_pairs_in_the_runs_order() -> None:
    table = method_table(study_points(pairs_with_repair())).set_index("method")
    assert list(table.index) == ["identity", "wm", "am"] and (table["pairs"] == 3).all()
    wm = table.loc["wm"]
    assert wm["B_mid"] == pytest.approx(0.31) and wm["B_mid_std"] == pytest.approx(0.01)  # 0.3, 0.31, 0.32
    assert wm["B_mid_repair"] == pytest.approx(0.11) and wm["ppl_mid"] == pytest.approx(0.9)
    assert wm["acc_mid"] == pytest.approx(3.0) and wm["search_s"] == pytest.approx(4.0)
    assert wm["search_s_std"] == pytest.approx(2.0) and wm["l2_reduction"] == pytest.approx(21.0)


def test_a_run_without_repair_or_perplexity_tabulates_them_as_missing() -> None:
    pairs = pairs_with_repair().drop(columns=["ln_repair", "test_ppl_barrier_mid", "norepair_test_ppl_barrier_mid"])
    table = method_table(study_points(pairs)).set_index("method")
    assert table["B_mid_repair"].isna().all() and table["ppl_mid"].isna().all() and table["ppl_mid_std"].isna().all()
    assert table.loc["wm", "B_mid"] == pytest.approx(0.31)
    assert all(table[c].dtype == float for c in ("B_mid", "B_mid_repair", "ppl_mid"))
    shifted = pairs.set_index(pairs.index + 100)  # a filtered table: no row 0
    points = study_points(shifted)
    assert len(points) == len(pairs) and points["method"].notna().all() and (points["ppl_mid"].dtype == float)


def test_the_explanation_holds_when_better_alignment_means_lower_barriers_and_not_otherwise() -> None:
    points = study_points(pairs_with_repair())
    found = explanation(points, ["wm", "am"])
    assert found["points"] == 6 and found["pairs"] == 3 and found["pairs_agreeing"] == 3
    assert (found["best_aligned"], found["lowest_barrier"]) == ("am", "am")
    # within a method and across methods, the higher R_0.3 the lower B½: ρ = −1
    assert found["rho"] == pytest.approx(-1.0) and found["holds"]
    flipped = points.assign(B_mid=lambda f: -f["B_mid"])
    against = explanation(flipped, ["wm", "am"])
    assert against["rho"] > 0 and not against["holds"] and against["pairs_agreeing"] == 0
    assert against["lowest_barrier"] == "wm"


def test_the_explanations_verdict_needs_significance() -> None:
    """Eight points in perfect inverse order (ρ = −1) hold; four at ρ = −0.8 do not reach p < 0.05."""
    many = pd.DataFrame(
        {
            "method": ["wm", "am"] * 4,
            "pair": [f"p{i // 2}" for i in range(8)],
            "R_0.3": range(8),
            "B_mid": range(8, 0, -1),
        }
    )
    assert explanation(many, ["wm", "am"])["holds"] and explanation(many, ["wm", "am"])["rho"] == pytest.approx(-1.0)
    few = many.iloc[:4].assign(B_mid=[3, 1, 2, 0])
    assert explanation(few, ["wm", "am"])["rho"] == pytest.approx(-0.8) and not explanation(few, ["wm", "am"])["holds"]


def test_sweeps_tabulate_each_value_and_test_the_trend() -> None:
    """B½ of WM falls with width (1.0, 0.5, 0.2 + noise per pair) and R_0.3 rises: both trends hold."""
    runs, final = {}, {}
    for width, b, r in ((32, 1.0, 0.2), (64, 0.5, 0.4), (128, 0.2, 0.6)):
        frame = pairs_with_repair()
        frame = frame[frame["method"] == "wm"].assign(
            norepair_test_loss_barrier_mid=[b, b + 0.01, b + 0.02], **{"R_0.3": [r, r + 0.01, r + 0.02]}
        )
        runs[float(width)], final[float(width)] = study_points(frame), 1.5 - width / 1000
    points = sweep_points(runs, final)
    assert len(points) == 9 and set(points["value"]) == {32.0, 64.0, 128.0}
    summary = sweep_summary(points).set_index("value")
    assert summary.loc[64.0, "B_half"] == pytest.approx(0.51) and summary.loc[64.0, "B_half_std"] == pytest.approx(0.01)
    assert summary.loc[128.0, "final_test_loss"] == pytest.approx(1.372)
    verdicts = {v["quantity"]: v for v in sweep_trends(points, "wm", "width")}
    assert verdicts["B_half"]["holds"] and verdicts["R_0.3"]["holds"] and verdicts["B_half"]["rho"] < 0
    assert verdicts["B_half"]["n_points"] == 9 and verdicts["B_half"]["param"] == "width"


def test_a_sweep_compares_the_methods_every_one_of_its_runs_has(tmp_path) -> None:
    from lmclab.cli.studies.lm import _sweeps

    # AM is missing at two of the three widths; the epochs sweep has the preset's run alone: left out

    dirs, runs = {}, {}
    for name, width in (("preset", 64), ("width 32", 32), ("width 128", 128)):
        dirs[name] = tmp_path / name
        (dirs[name] / "data" / "tables").mkdir(parents=True)
        frame = pairs_with_repair()
        frame = frame if name == "preset" else frame[frame["method"] != "am"]
        frame.to_parquet(dirs[name] / "data" / "tables" / "pairs.parquet")
        runs[name] = {"gpt": {"width": width}, "train": {"epochs": 5}, "final_test_loss": 1.5 - width / 1000}
    points, table, verdicts = _sweeps(dirs, runs)
    assert len(points) == 3 * 2 * 3 and set(points["method"]) == {"identity", "wm"}
    assert set(points["sweep"]) == set(table["sweep"]) == {"width"}
    assert list(zip(table["value"], table["method"], strict=True)) == [
        (w, m) for w in (32.0, 64.0, 128.0) for m in ("identity", "wm")
    ]
    assert table.loc[table["value"] == 128.0, "final_test_loss"].tolist() == pytest.approx([1.372, 1.372])
    assert [(v["method"], v["quantity"], v["param"], v["n_points"]) for v in verdicts] == [
        ("wm", "B_half", "width", 9),
        ("wm", "R_0.3", "width", 9),
    ]


def test_the_width_and_epochs_sweeps_are_one_table_numbered_from_zero(tmp_path) -> None:
    from lmclab.cli.studies.lm import _sweeps

    dirs, runs = {}, {}
    for name, width, epochs in (("preset", 64, 5), ("width 32", 32, 5), ("epochs 10", 64, 10)):
        dirs[name] = tmp_path / name
        (dirs[name] / "data" / "tables").mkdir(parents=True)
        pairs_with_repair().to_parquet(dirs[name] / "data" / "tables" / "pairs.parquet")
        runs[name] = {"gpt": {"width": width}, "train": {"epochs": epochs}, "final_test_loss": 1.5 - epochs / 100}
    _, table, _ = _sweeps(dirs, runs)
    sweeps = {"width": (32.0, 64.0), "epochs": (5.0, 10.0)}
    assert list(zip(table["sweep"], table["value"], table["method"], strict=True)) == [
        (kind, v, m) for kind, values in sweeps.items() for v in values for m in ("am", "identity", "wm")
    ]
    assert list(table.index) == list(range(12))  # one row per sweep, value and method, as sweep.parquet reads back


def test_a_sweep_value_of_one_pair_shows_a_spread_of_zero() -> None:
    from lmclab.cli.studies.lm_page import sweep_markdown

    one = pairs_with_repair().query("pair == 'seed0-seed2' and method == 'wm'")
    summary = sweep_summary(sweep_points({32.0: study_points(one)}, {32.0: 1.4})).assign(sweep="width")
    assert summary["B_half_std"].isna().all()  # the sample std of one pair
    row = "| width | 32 | WM (re-basin) | 0.300 ± 0.000 | 0.900 ± 0.000 | 0.500 ± 0.000 | 20.0 ± 0.0 | 1.4000 |"
    assert sweep_markdown(summary, []).splitlines()[2] == row


def test_the_roles_pool_a_gpts_layers() -> None:
    shares = [
        ("embed.weight", 1.0, 2),
        ("head.weight", 1.0, 2),
        ("blocks.0.attn.q.weight", 0.0, 4),
        ("blocks.0.attn.out.weight", 2.0, 4),
        ("blocks.0.fc1.weight", 3.0, 4),
        ("blocks.1.fc2.weight", 1.0, 4),
    ]
    alignment = pd.DataFrame(
        [
            {"pair": "p", "method": "wm", "layer": layer, "gamma": 0.3, "numerator": n, "kept": k, "R": n / k}
            for layer, n, k in shares
        ]
    )
    roles = role_table(alignment).set_index("part")["mean"]
    assert list(roles.items()) == [("stream", 0.5), ("attention", 0.25), ("MLP", 0.5)]  # in the order met
    assert math.isnan(role_table(alignment).set_index("part").loc["stream", "std"])  # one pair


def test_a_run_whose_repair_flag_is_missing_or_unset_has_no_repaired_barriers() -> None:
    pairs = pairs_with_repair()
    for flag in (None, False, float("nan")):
        unset = pairs.assign(ln_repair=flag)
        assert repaired(unset, "test_loss_barrier_mid").isna().all()
    assert repaired(pairs.drop(columns=["ln_repair"]), "test_loss_barrier_mid").isna().all()


def test_the_explanation_keeps_points_missing_other_columns_and_reports_every_key() -> None:
    points = study_points(pairs_with_repair()).assign(ppl_mid=float("nan"))  # unrelated NaNs drop nothing
    found = explanation(points, ["wm", "am"])
    assert found["points"] == 6
    assert sorted(found) == sorted(
        ["methods", "points", "rho", "p", "pairs_agreeing", "pairs", "best_aligned", "lowest_barrier", "holds"]
    )
    assert found["methods"] == ["wm", "am"] and 0 <= found["p"] < 0.05
    gapped = points.copy()
    gapped.loc[gapped.index[1], "R_0.3"] = float("nan")  # a point without R_0.3 is left out
    assert explanation(gapped, ["wm", "am"])["points"] == 5
    positive = pd.DataFrame(
        {"method": ["wm", "am"] * 4, "pair": [f"p{i // 2}" for i in range(8)], "R_0.3": range(8)}
    ).assign(B_mid=[0, 2, 1, 3, 4, 6, 5, 7])  # ρ = 0.905, p < 0.05, the wrong sign
    against = explanation(positive, ["wm", "am"])
    assert 0.9 < against["rho"] < 1 and against["p"] < 0.05 and not against["holds"]


def test_sweep_points_and_summary_keep_pairs_in_order() -> None:
    frame = pairs_with_repair()
    frame = frame[frame["method"] != "identity"].iloc[::-1]  # am before wm, index not from 0
    points = sweep_points({2.0: study_points(frame), 1.0: study_points(frame)}, {1.0: 2.0, 2.0: 1.5})
    assert list(points.index) == list(range(12)) and points["value"].tolist() == [1.0] * 6 + [2.0] * 6
    assert points["pair"].tolist()[:3] == ["seed4-seed5", "seed4-seed5", "seed1-seed3"]
    summary = sweep_summary(sweep_points({1.0: study_points(frame.iloc[::-1])}, {1.0: 2.0}))  # wm met first
    assert summary["method"].tolist() == ["am", "wm"]
    summary = sweep_summary(points)
    assert list(zip(summary["value"], summary["method"], strict=True)) == [
        (1.0, "am"),
        (1.0, "wm"),
        (2.0, "am"),
        (2.0, "wm"),
    ]


def test_a_sweep_run_is_split_at_its_first_equals_sign_so_its_folder_may_hold_one() -> None:
    from lmclab.cli.studies.lm import _sweep_runs

    got = _sweep_runs(["64=runs/width=64", "128=b"], "width")
    assert got == {"width 64": Path("runs/width=64"), "width 128": Path("b")}


def test_collect_refuses_a_sweep_without_a_value_and_a_folder_that_is_no_run(tmp_path) -> None:
    bad = CliRunner().invoke(app, ["study", "lm", "collect", "--run", str(tmp_path), "--width", str(tmp_path)])
    assert (
        bad.exit_code == 1 and bad.output == f"error: --width: expected VALUE=DIR of a finished run, got '{tmp_path}'\n"
    )
    (tmp_path / "params.yaml").write_text("data: {}\n")
    missing = CliRunner().invoke(
        app, ["study", "lm", "collect", "--run", str(tmp_path), "--out", str(tmp_path / "out")]
    )
    no_run = f"error: {tmp_path}: no data/tables/history.parquet (expected a finished run of the pipeline)\n"
    assert missing.exit_code == 1 and missing.output == no_run
    assert not (tmp_path / "out").exists()


# `lmclab study NAME`: the seven studies over finished runs, each with its own subcommands and options
STUDIES = {"lm": "collect", "many": "collect", "three": "queue", "transformer": "collect"}
SWEEPS = ("width", "sweep", "mixup")


def test_the_study_group_lists_the_seven_studies_and_each_its_own_options() -> None:
    listed = CliRunner().invoke(app, ["study", "--help"])
    assert listed.exit_code == 0
    assert all(f" {name} " in listed.output for name in [*STUDIES, *SWEEPS])
    for name, command in STUDIES.items():
        group = CliRunner().invoke(app, ["study", name, "--help"])
        assert group.exit_code == 0 and f" {command} " in group.output, name
    sweep = CliRunner().invoke(app, ["study", "sweep", "--help"])
    assert sweep.exit_code == 0 and "--param" in sweep.output and "--workspace" in sweep.output
    assert "preset" in CliRunner().invoke(app, ["--help"]).output


def test_a_sweep_study_names_a_parameter_its_experiments_lack(monkeypatch, tmp_path) -> None:
    """The swept value is read from each run's `dvc exp show` row; a key no row has is one line naming --param."""
    import lmclab.cli.studies.sweeps as sweeps

    def runs(value_of, tables, **_):
        return {value_of({"train.lr": 0.1}): {}}

    monkeypatch.setattr(sweeps, "experiment_runs", runs)
    result = CliRunner().invoke(app, ["study", "sweep", "--param", "train.nope", "--out", str(tmp_path)])
    assert (
        result.exit_code == 1 and result.output == "error: --param train.nope: not a parameter of these experiments\n"
    )
    mixup = CliRunner().invoke(app, ["study", "mixup", "--out", str(tmp_path)])
    assert mixup.exit_code == 1 and mixup.output == "error: train.mixup_alpha: not a parameter of these experiments\n"


def test_three_queue_prints_one_dvc_exp_per_point_in_a_dry_run() -> None:
    result = CliRunner().invoke(app, ["study", "three", "queue", "--points", "default,width-128", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[1].startswith("dvc exp run --queue -n three-width-128 -S ")
    assert "-S model.mlp.width=128 connect" in lines[1]
    assert lines[0] == (  # each setting one shell word, its JSON without spaces
        "dvc exp run --queue -n three-default -S 'train.seeds=[0,1,2,3,4,5,6,7,8]' "
        "-S 'three.triples=[[0,2,4],[1,3,5],[6,7,8]]' -S 'permute.pairs=[[0,2],[1,3],[6,7]]' "
        """-S 'three.methods=["wm_sinkhorn","ste_sinkhorn","wm"]' connect"""
    )
    unknown = CliRunner().invoke(app, ["study", "three", "queue", "--points", "nope,default,zz", "--dry-run"])
    known = (
        "default, epochs-50, epochs-100, train-1k, train-2k, width-128, width-1024, width-2048, width-1024-wm-lr10, "
        "width-2048-wm-lr80, wm-10x100, ste-epochs-20, ste-init-wm, epochs-100-wm-10x100"
    )
    assert unknown.exit_code == 1 and unknown.output == f"error: --points: unknown point(s) nope, zz; known: {known}\n"


def test_three_queue_without_points_queues_every_point_but_the_costly_widths() -> None:
    result = CliRunner().invoke(app, ["study", "three", "queue", "--dry-run"])
    assert result.exit_code == 0, result.output
    names = [line.split(" -n three-")[1].split()[0] for line in result.output.splitlines()]
    assert names == [
        "default",
        "epochs-50",
        "epochs-100",
        "train-1k",
        "train-2k",
        "width-128",
        "width-1024",
        "width-1024-wm-lr10",
        "wm-10x100",
        "ste-epochs-20",
        "ste-init-wm",
        "epochs-100-wm-10x100",
    ]  # width-2048 and width-2048-wm-lr80 only when named


def _fake_run(run: Path, width: int = 16, symmetry: str = "permutation") -> None:
    """A finished run's params, history, pairs and alignment tables (no git: the commit reads as unknown)."""
    tables = run / "data" / "tables"
    tables.mkdir(parents=True)
    (run / "params.yaml").write_text(
        "data: {name: pydoc, context: 8, tokenizer: null}\nmodel: {gpt: {"
        f"width: {width}, depth: 2, heads: 2, norm: layernorm, position: learned, mlp: gelu, tie_embeddings: true"
        "}}\n"
        "measure: {repair: repair}\ntrain: {epochs: 2, lr: 0.1, batch_size: 4, schedule: cosine, warmup_epochs: 0, "
        "seeds: [0, 1, 2]}\n" + (f"permute: {{symmetry: {symmetry}}}\n" if symmetry != "permutation" else "")
    )
    history = {"epoch": [1, 2, 2], "test_loss": [3.0, 1.0, 2.0], "test_acc": [0.1, 0.5, 0.3]}
    pd.DataFrame(history).to_parquet(tables / "history.parquet")
    pairs = pairs_with_repair()
    pairs["norepair_test_loss_barrier_mid"] *= width / 16  # wider: higher barriers
    pairs.to_parquet(tables / "pairs.parquet")
    layers = ("embed.weight", "blocks.0.attn.q.weight", "blocks.0.fc1.weight")
    rows = [
        {"pair": p, "method": m, "layer": layer, "gamma": 0.3, "numerator": 1.0, "kept": 2, "R": 0.5}
        for p in set(pairs["pair"])
        for m in ("wm", "am")
        for layer in layers
    ]
    pd.DataFrame(rows).to_parquet(tables / "alignment.parquet")


def test_collect_builds_the_study_page_tables_and_figure_from_a_run_and_its_sweeps(tmp_path) -> None:
    for name, width in (("run", 16), ("wide", 32), ("wider", 64)):
        _fake_run(tmp_path / name, width)
    out = tmp_path / "out"
    args = ["study", "lm", "collect", "--run", str(tmp_path / "run"), "--out", str(out), "--dpi", "20"]
    args += ["--width", f"32={tmp_path / 'wide'}", "--width", f"64={tmp_path / 'wider'}"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"{out}: 3 methods, 3 runs"
    names = {"points", "table", "roles", "sweep_points", "sweep"}
    assert {p.name for p in out.iterdir()} == {f"{n}.parquet" for n in names} | {
        "explanation.json",
        "trends.json",
        "runs.json",
        "lm.png",
        "lm.md",
    }
    runs = pd.read_json(out / "runs.json", typ="series")
    assert list(runs.index) == ["preset", "width 32", "width 64"]
    assert "search_seconds" in runs["preset"] and "search_seconds" not in runs["width 32"]  # sweeps: not timed
    sweep = pd.read_parquet(out / "sweep.parquet")
    assert set(sweep["sweep"]) == {"width"} and len(pd.read_parquet(out / "table.parquet")) == 3
    page = (out / "lm.md").read_text()
    assert "GPT width 16, depth 2, 2 heads, layernorm, learned positions, gelu MLP" in page
    assert "- width 32 (commit " in page and "- width 64 (commit " in page
    assert "| WM (re-basin)'s R_0.3 rises as width grows |" in page


def test_the_orthogonal_page_sets_the_orthogonal_runs_methods_beside_the_presets_and_theus_et_al(tmp_path) -> None:
    for name in ("run", "orthogonal", "other"):
        _fake_run(tmp_path / name, 32 if name == "other" else 16)
    tables = tmp_path / "orthogonal" / "data" / "tables"
    pairs = pd.read_parquet(tables / "pairs.parquet")
    aligned = pairs["method"] != "identity"  # the orthogonal maps halve the aligned barriers; naive unchanged
    pairs.loc[aligned, "norepair_test_loss_barrier_mid"] *= 0.5
    pairs.assign(test_loss_barrier_mid_calibrated=0.25).to_parquet(tables / "pairs.parquet")
    out, args = tmp_path / "out", ["study", "lm", "orthogonal", "--run", str(tmp_path / "run")]
    done = CliRunner().invoke(app, [*args, "--out", str(out), "--orthogonal", str(tmp_path / "orthogonal")])
    assert done.exit_code == 0, done.output
    table = pd.read_parquet(out / "orthogonal.parquet").set_index("method")
    assert list(table.index) == ["identity", "wm", "am", "identity@orthogonal", "wm@orthogonal", "am@orthogonal"]
    assert table.loc["wm@orthogonal", "B_mid"] == pytest.approx(0.155)  # (0.30 + 0.31 + 0.32) / 2 / 3
    assert table.loc["wm@orthogonal", "B_mid_T"] == 0.25 and math.isnan(table.loc["wm", "B_mid_T"])
    assert table.loc["wm@orthogonal", "search_s"] == pytest.approx(4.0)
    roles = pd.read_parquet(out / "orthogonal_roles.parquet")
    assert set(roles["method"]) == {"wm", "am", "wm@orthogonal", "am@orthogonal"}
    page = (out / "orthogonal.md").read_text()
    wm = next(line for line in page.splitlines() if line.startswith("| WM (re-basin), orthogonal | 0.155 |"))
    reduction = 100 * (1 - 0.155 / 2.01)  # of the preset's naive B½, (2.00 + 2.01 + 2.02) / 3
    assert wm.split(" | ")[2] == f"{reduction:.1f}" and wm.endswith(" | 83.2 | 78.7 |")  # 1 − 0.34/2.02, 1 − 0.36/1.69
    assert "| naive, canonical forms | 2.010 | 0.0 | — | — | — |" in page
    assert "| naive (w/o) | 2.010 | 0.0 | naive | 0.0 | 0.0 |" in page
    assert "| WM (re-basin), orthogonal | 0.155 ± 0.005 | " in page and " | 0.250 ± 0.000 | " in page
    assert set(pd.read_json(out / "orthogonal_runs.json", typ="series").index) == {"preset", "orthogonal"}
    refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o2"), "--orthogonal", str(tmp_path / "other")])
    assert refused.exit_code != 0
    assert f"--orthogonal: {tmp_path / 'other'} trained other models than --run" in refused.output


def test_both_learned_orthogonal_methods_stand_beside_theus_et_al_s_learned_orthogonal_alignment() -> None:
    """Each method's reduction of the naive barrier, and Theus et al.'s reduction by its counterpart: STE and the
    Sinkhorn STE over orthogonal groups are both learned with the orthogonal map (their 0.02 of 2.02 on GPT-2)."""
    table = pd.DataFrame(
        {
            "method": ["identity", "ste_sinkhorn", "ste@orthogonal", "ste_sinkhorn@orthogonal", "am"],
            "B_mid": [2.0, 1.0, 0.5, 0.4, 1.5],
        }
    )
    rows = relative_reductions(table).set_index("method")
    assert rows["reduction_pct"].tolist() == pytest.approx([0.0, 50.0, 75.0, 80.0, 25.0])
    for method in ("ste@orthogonal", "ste_sinkhorn@orthogonal"):
        assert rows.loc[method, "theirs"] == "learned on the task loss, with the orthogonal map"
        assert rows.loc[method, "GPT-2_reduction_pct"] == pytest.approx(100 * (1 - 0.02 / 2.02))
    assert rows.loc["ste_sinkhorn", "ViT_reduction_pct"] == pytest.approx(100 * (1 - 0.45 / 1.69))
    assert rows.loc["am", "theirs"] == "" and math.isnan(rows.loc["am", "GPT-2_reduction_pct"])


def test_the_orthogonal_page_sets_the_width_sweeps_orthogonal_runs_beside_the_studys_permutation_sweep(
    tmp_path,
) -> None:
    for name, width in (("run", 16), ("orthogonal", 16), ("ow32", 32)):
        _fake_run(tmp_path / name, width, "orthogonal" if name[0] == "o" else "permutation")
    out = tmp_path / "out"
    out.mkdir()
    sweep = [  # the study's sweep at width 32: its runs ended at test loss 1.5, as the fake runs do
        {"sweep": "width", "value": 32.0, "method": m, "B_half": b, "B_half_std": 0.01, "final_test_loss": 1.5}
        for m, b in (("identity", 2.5), ("wm", 1.5), ("am", 1.4), ("wm_sinkhorn", 1.2))
    ]
    pd.DataFrame(sweep).to_parquet(out / "sweep.parquet")
    args = ["study", "lm", "orthogonal", "--run", str(tmp_path / "run"), "--orthogonal", str(tmp_path / "orthogonal")]
    done = CliRunner().invoke(app, [*args, "--out", str(out), "--width", f"32={tmp_path / 'ow32'}"])
    assert done.exit_code == 0, done.output
    widths = pd.read_parquet(out / "orthogonal_widths.parquet")
    at32 = widths[widths["width"] == 32].set_index("method")
    orthogonal = ["identity@orthogonal", "wm@orthogonal", "am@orthogonal"]
    assert list(at32.index) == ["identity", "wm", "am", "wm_sinkhorn", *orthogonal]
    assert at32.loc["wm_sinkhorn", "B_mid"] == 1.2 and at32.loc["wm@orthogonal", "B_mid"] == pytest.approx(0.62)
    assert set(widths["width"]) == {16, 32}  # the preset's width from the page's own runs
    assert (out / "orthogonal_widths.png").stat().st_size > 1000
    page = (out / "orthogonal.md").read_text()
    assert "## Width" in page and "| 32 | 2.500 ± 0.010 | 1.500 ± 0.010 | 1.400 ± 0.010 | 1.200 ± 0.010 | " in page
    pd.DataFrame(sweep).assign(final_test_loss=1.6).to_parquet(out / "sweep.parquet")
    refused = CliRunner().invoke(app, [*args, "--out", str(out), "--width", f"32={tmp_path / 'ow32'}"])
    assert f"--width 32: {tmp_path / 'ow32'} trained other models than the permutation methods' at 32" in refused.output
    refused = CliRunner().invoke(app, [*args, "--out", str(out), "--width", "wide"])
    assert "--width: expected WIDTH=FOLDER, got 'wide'" in refused.output
    _fake_run(tmp_path / "w32", 32)  # the width's own run aligned by permutations: replaces the sweep there
    both = ["--width", f"32={tmp_path / 'w32'}", "--width", f"32={tmp_path / 'ow32'}"]
    done = CliRunner().invoke(app, [*args, "--out", str(out), *both])
    assert done.exit_code == 0, done.output  # its models end at 1.5, as the orthogonal run's: the sweep's 1.6 unread
    at32 = pd.read_parquet(out / "orthogonal_widths.parquet").query("width == 32").set_index("method")
    assert list(at32.index) == ["identity", "wm", "am", *orthogonal]  # the run's methods, no WM Sinkhorn
    assert at32.loc["wm", "B_mid"] == pytest.approx(0.62) and at32.loc["wm", "pairs"] == 3  # 2 × (0.31 ± 0.01)
    for bad, message in (
        ([*both, "--width", f"32={tmp_path / 'ow32'}"], "--width 32: two runs aligned by orthogonal"),
        (["--width", f"48={tmp_path / 'w32'}"], f"--width 48: {tmp_path / 'w32'} is a run at width 32"),
        (["--width", f"16={tmp_path / 'w32'}"], "--width 16: the preset's own width (its runs: --run, --orthogonal)"),
        (["--width", f"32={out}"], f"--width 32: {out} is no run (no params.yaml)"),
    ):
        refused = CliRunner().invoke(app, [*args, "--out", str(out), *bad])
        assert refused.exit_code != 0 and message in refused.output, refused.output


def test_a_runs_information_is_read_from_its_params_tables_and_git_commit(tmp_path) -> None:
    import subprocess

    from lmclab.cli.studies.lm_page import run_info

    run, tables = tmp_path / "run", tmp_path / "run" / "data" / "tables"
    tables.mkdir(parents=True)
    (run / "params.yaml").write_text(
        "data: {name: pydoc, context: 8, tokenizer: null}\nmodel: {gpt: {width: 16}}\nmeasure: {repair: none}\n"
        "train: {epochs: 2, lr: 0.1, batch_size: 4, schedule: cosine, warmup_epochs: 0, seeds: [0, 1, 2]}\n"
    )
    history = {"epoch": [1, 2, 2], "test_loss": [3.0, 1.0, 2.0], "test_acc": [0.1, 0.5, 0.3]}
    pd.DataFrame(history).to_parquet(tables / "history.parquet")
    pairs_with_repair().to_parquet(tables / "pairs.parquet")
    git = ["git", "-C", str(run), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "run"], check=True)
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert run_info(run) == {
        "commit": commit,  # the run's own repository's, not the caller's
        "data": {"name": "pydoc", "context": 8, "tokenizer": None},
        "gpt": {"width": 16},
        "train": {"epochs": 2, "lr": 0.1, "batch_size": 4, "schedule": "cosine", "warmup_epochs": 0},
        "seeds": 3,
        "repair": False,
        "final_test_loss": pytest.approx(1.5),  # the last epoch's mean over the seeds
        "final_test_ppl": pytest.approx((math.e + math.e**2) / 2),
        "final_test_acc": pytest.approx(0.4),
        "search_seconds": {"identity": 0.0, "wm": 4.0, "am": 4.0},
    }
    assert list(run_info(run)["search_seconds"]) == ["identity", "wm", "am"]  # in the run's order
    for repair, measured in (("bn", True), ("false", False), ("true", True)):  # true, false: an older run
        params = (run / "params.yaml").read_text()
        (run / "params.yaml").write_text(re.sub(r"repair: \w+", f"repair: {repair}", params))
        assert run_info(run)["repair"] is measured, repair


def _learned_run(folder: Path, epochs: int, spread: float | None, scale: float) -> None:
    """A copy of the orthogonal run that learned its alignment (``ste``, the fake runs' ``am`` renamed) at
    ``permute.ste`` settings ``epochs`` and ``spread`` (None: a run before the option), its barriers × ``scale``."""
    ste = f"{{epochs: {epochs}}}" if spread is None else f"{{epochs: {epochs}, lam_spread: {spread}}}"
    (folder / "params.yaml").write_text((folder / "params.yaml").read_text() + f"permute: {{ste: {ste}}}\n")
    tables = folder / "data" / "tables"
    pairs = pd.read_parquet(tables / "pairs.parquet").replace({"method": {"am": "ste"}})
    pairs.loc[pairs["method"] == "ste", "norepair_test_loss_barrier_mid"] *= scale
    pairs.to_parquet(tables / "pairs.parquet")


def _families(folder: Path, methods: dict[str, float]) -> None:
    rows = [
        {"pair": p, "method": m, "family": f, "alone": a * share, "all_but": a * (1 - share) + i * 0.01}
        for i, p in enumerate(("seed0-seed2", "seed1-seed3", "seed4-seed5"))
        for m, a in methods.items()
        for f, share in (("(all)", 1.0), ("blocks.*.fc1", 0.75), ("blocks.*.attn.q", 0.25))
    ]
    pd.DataFrame(rows).to_parquet(folder / "data" / "tables" / "families.parquet")


def test_the_orthogonal_page_sets_the_learned_runs_and_the_barriers_by_family(tmp_path) -> None:
    for name in ("run", "orthogonal", "ste15", "ste5", "other"):
        _fake_run(tmp_path / name)
    for name, epochs, spread, scale in (("orthogonal", 5, None, 1.0), ("ste15", 15, 0.0, 0.5), ("ste5", 5, 0.1, 0.8)):
        _learned_run(tmp_path / name, epochs, spread, scale)
    _families(tmp_path / "run", {"wm": 0.4})
    _families(tmp_path / "orthogonal", {"wm": 0.2, "ste": 0.1})
    _families(tmp_path / "ste15", {"wm": 0.2, "ste": 0.08})  # its wm is the orthogonal run's: left out
    out, args = tmp_path / "out", ["study", "lm", "orthogonal", "--run", str(tmp_path / "run")]
    args += ["--orthogonal", str(tmp_path / "orthogonal"), "--out", str(out)]
    done = CliRunner().invoke(app, [*args, "--learned", str(tmp_path / "ste15"), "--learned", str(tmp_path / "ste5")])
    assert done.exit_code == 0, done.output
    learned = pd.read_parquet(out / "orthogonal_learned.parquet")
    assert learned[["epochs", "lam_spread"]].values.tolist() == [[5, 0.0], [5, 0.1], [15, 0.0]]
    assert learned["B_mid"].tolist() == pytest.approx([0.21, 0.168, 0.105])  # (0.20 + 0.21 + 0.22) / 3 × scale
    page = (out / "orthogonal.md").read_text()
    assert "| 5 | U(0.4, 0.6) | 0.168 ± 0.008 | — | — | 4 | 3 |" in page and "| 15 | ½ | 0.105 ± 0.005 |" in page
    families = pd.read_parquet(out / "orthogonal_families.parquet")
    assert list(dict.fromkeys(families["method"])) == [
        "wm",
        "wm@orthogonal",
        "ste@orthogonal",
        "ste@orthogonal, 15 epochs, λ ± 0",
    ]
    section = page[page.index("## Where the barrier is") : page.index("## Beside Theus")]
    head = "| family | WM (re-basin) | WM (re-basin), orthogonal | STE (re-basin), orthogonal | "
    assert section.count(head + "STE (re-basin), orthogonal, 15 epochs, λ ± 0 |") == 2  # alone, all but
    assert "| `blocks.*.fc1` | 0.300 ± 0.000 | 0.150 ± 0.000 | 0.075 ± 0.000 | 0.060 ± 0.000 |" in section
    assert "| `blocks.*.fc1` | 0.110 ± 0.010 | 0.060 ± 0.010 | 0.035 ± 0.010 | 0.030 ± 0.010 |" in section
    history = pd.read_parquet(tmp_path / "other" / "data" / "tables" / "history.parquet")
    history.assign(test_loss=history["test_loss"] + 0.5).to_parquet(
        tmp_path / "other" / "data" / "tables" / "history.parquet"
    )
    for folder, line in (
        ("other", "trained other models than --run (expected a copy of --orthogonal)"),
        ("run", "has no learned orthogonal alignment (permute.methods without ste)"),
    ):
        refused = CliRunner().invoke(app, [*args, "--learned", str(tmp_path / folder)])
        assert refused.exit_code != 0 and f"--learned: {tmp_path / folder} {line}" in refused.output
