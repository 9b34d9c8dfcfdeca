"""The n-model comparison: the registry behind one call (``run_many``), every method and
the references of ``compare_many`` on planted and on independent models, the repair of merges, and the
report's objective traces, headline metrics and table."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
import torch
import yaml
from test_many_models import mlp, planted

from lmclab.analysis.many_models import PAIRWISE, compare_many, repaired_merge
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.options import OptionError
from lmclab.report.headline import merge_many_metrics
from lmclab.report.many_models import many_summary, many_table, objective_traces
from lmclab.search.many_methods import MANY_METHODS, UNIVERSE, check_many, run_many
from lmclab.search.universe import shared_objective

METHODS = {"merge_many": {}, "c2m3": {"max_iter": 30}, "sync": {}, "star": {}}


def _model_and_data(width: int = 6, n: int = 64, seed: int = 0):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=width)
    gen = torch.Generator().manual_seed(seed)
    data = Split(torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    return build_model("mlp", config), {"train": data, "test": data}


def _repaired_comparison(model, spec, params, splits):
    """``METHODS`` on three models named a, b, c, each merge also REPAIRed on the training split."""
    return compare_many(
        model,
        spec,
        params,
        ["a", "b", "c"],
        splits,
        methods=METHODS,
        seed=0,
        repair="repair",
        repair_data=splits["train"],
    )


def test_every_method_runs_behind_one_call_and_refuses_bad_options_in_one_line():
    spec, params, _ = planted(5, 3)
    model, splits = _model_and_data(width=5)
    points = get_arch("mlp").activation_points(
        make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=5)
    )
    for method in MANY_METHODS:
        result = run_many(method, spec, params, seed=0, model=model, points=points, data=splits["train"])
        assert result.merged is not None and result.stats["seconds"] >= 0
        assert len(result.perms if method in UNIVERSE else result.merges) == 3
    with pytest.raises(OptionError, match=r"^method: unknown n-model method 'wm'; expected one of \['merge_many'"):
        check_many("wm")
    with pytest.raises(OptionError, match=r"^max_iter must be a positive integer, got 0$"):
        run_many("c2m3", spec, params, seed=0, options={"max_iter": 0})
    with pytest.raises(OptionError, match=r"^init must be one of \['identity', 'sinkhorn_barycenter', 'merge_many'\]"):
        check_many("c2m3", {"init": "random"})


def test_planted_copies_every_method_merges_the_one_model_with_zero_barriers_and_cycle_error():
    spec, params, _ = planted(6, 3)
    model, splits = _model_and_data()
    found = _repaired_comparison(model, spec, params, splits)
    rows = pd.DataFrame(found.methods).set_index("method")
    assert list(rows.index) == [PAIRWISE, *METHODS]
    assert (rows["cycle_error"] == 0).all()  # independent WM recovers each planted map: consistent too
    assert (rows["pair_test_loss_barrier_mid"].abs() < 1e-5).all()
    best = shared_objective(spec, [params[0]] * 3)  # the planted optimum: every model is model 0
    assert rows.loc[list(METHODS), "objective"].sub(best).abs().max() < 1e-6 * abs(best)
    evaluation = pd.DataFrame(found.evaluation)
    test = evaluation[evaluation["split"] == "test"]
    member = test[test["model"] == "a"]["loss"].item()
    merged = test[test["model"] == "merged"]
    assert len(merged) == 2 * len(METHODS) and (merged["loss"] - member).abs().max() < 1e-5  # plain and repaired


def test_independent_models_pairwise_wm_is_not_cycle_consistent_and_universes_are():
    params = [mlp(8, seed=s)[1] for s in range(4)]
    spec = mlp(8)[0]
    model, splits = _model_and_data(width=8)
    found = compare_many(model, spec, params, list("abcd"), splits, methods=METHODS, seed=0)
    rows = pd.DataFrame(found.methods).set_index("method")
    assert rows.loc[PAIRWISE, "cycle_error"] > 0.3
    assert (rows.loc[list(METHODS), "cycle_error"] == 0).all()
    assert rows.loc["c2m3", "objective"] >= rows.loc["star", "objective"] - 1e-9  # FW starts nowhere near star
    assert not pd.DataFrame(found.evaluation)["repaired"].any()  # repair none: plain merges only
    assert set(pd.DataFrame(found.pairwise)["method"]) == {PAIRWISE, *METHODS}
    assert len(found.pairwise) == 6 * (1 + len(METHODS))  # every pair of 4 models


def test_repair_of_merges_fits_the_network_and_is_refused_in_one_line_otherwise():
    model, splits = _model_and_data()
    assert repaired_merge("none", model, None) is None
    assert repaired_merge("auto", model, splits["train"]) is not None  # REPAIR: the MLP has no BatchNorm
    with pytest.raises(OptionError, match=r"^repair: 'bn' does not fit this model; use repair or none"):
        repaired_merge("bn", model, splits["train"])
    with pytest.raises(OptionError, match=r"^repair_data: repair 'repair' needs training data, got None$"):
        repaired_merge("repair", model, None)
    with pytest.raises(OptionError, match=r"^repair must be one of \['auto', 'none', 'bn', 'repair'\], got 'rebasin'$"):
        repaired_merge("rebasin", model, None)


def test_objective_traces_turn_merge_many_distances_into_the_shared_objective():
    spec, params, _ = planted(6, 3, noise=0.5)
    result = run_many("merge_many", spec, params, seed=0, options={"max_iter": 4, "tol": 0.0})
    methods = pd.DataFrame(
        [
            {
                "method": "merge_many",
                "objective": result.stats["objective_final"],
                "distance": result.stats["distance_final"],
                "iterations": result.stats["iterations"],
            }
        ]
    )
    traces = objective_traces({"seeds": [0, 1, 2], "methods": {"merge_many": result.stats}}, methods)
    assert list(traces["iteration"]) == list(range(len(result.stats["distance"])))
    assert traces["objective"].iloc[0] == pytest.approx(shared_objective(spec, params), rel=1e-6)  # the identity
    assert traces["objective"].iloc[-1] == pytest.approx(result.stats["objective_final"], rel=1e-9)


def test_headline_summary_and_table_of_a_comparison():
    spec, params, _ = planted(6, 3, noise=0.3)
    model, splits = _model_and_data()
    found = _repaired_comparison(model, spec, params, splits)
    evaluation, methods = pd.DataFrame(found.evaluation), pd.DataFrame(found.methods)
    headline = merge_many_metrics(evaluation)
    assert set(headline) == {"merged_acc", "naive_acc", "ensemble_acc", "c2m3_acc", "sync_acc", "star_acc"}
    plain = evaluation[(evaluation["method"] == "c2m3") & (evaluation["split"] == "test") & ~evaluation["repaired"]]
    assert headline["c2m3_acc"] == round(100 * plain["acc"].item(), 6)
    summary = many_summary(evaluation, methods)
    assert summary["c2m3"]["cycle_error"] == 0 and "test_acc_repaired" in summary["sync"]
    table = many_table(evaluation, methods)
    assert table.count("\n") == 2 + len(methods) + 3 - 1  # header, rule, a row per method, three references
    assert "| C2M3 | " in table and "| pairwise WM | " in table


def test_transform_methods_join_the_comparison_with_their_merges_plain_and_repaired():
    spec, params, _ = planted(6, 3, noise=0.2)
    model, splits = _model_and_data()
    points = get_arch("mlp").activation_points(
        make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=6)
    )
    methods = {"c2m3": {"max_iter": 10}, "cca": {}, "zipit": {"partial_zip": 1}}
    found = compare_many(
        model,
        spec,
        params,
        list("abc"),
        splits,
        methods=methods,
        seed=0,
        repair="repair",
        repair_data=splits["train"],
        points=points,
        train=splits["train"],
    )
    rows = pd.DataFrame(found.methods).set_index("method")
    assert rows.loc[["cca", "zipit"], ["objective", "cycle_error", "pair_test_loss_barrier_mid"]].isna().all().all()
    assert (rows.loc[["cca", "zipit"], "seconds"] > 0).all()
    evaluation = pd.DataFrame(found.evaluation)
    cca = evaluation[evaluation["method"] == "cca"]
    assert set(zip(cca["model"], cca["repaired"], strict=True)) == {("merged", False), ("merged", True)}
    zipped = evaluation[evaluation["method"] == "zipit"]  # a partial zip: one network per model, no repair
    assert set(zipped["model"]) == {"heads ensemble"} and not zipped["repaired"].any()
    with pytest.raises(OptionError, match=r"^model: cca reads the models' activations and needs it, got None$"):
        run_many("cca", spec, params, seed=0)


def test_the_study_page_is_collected_from_a_finished_run(tmp_path):
    from typer.testing import CliRunner

    from lmclab.cli import app

    spec, params, _ = planted(6, 3, noise=0.3)
    model, splits = _model_and_data()
    found = compare_many(model, spec, params, list("abc"), splits, methods=METHODS, seed=0)
    folder = tmp_path / "run" / "data" / "merge_many"
    folder.mkdir(parents=True)
    for name in ("evaluation", "methods", "pairwise"):
        pd.DataFrame(getattr(found, name)).to_parquet(folder / f"{name}.parquet")
    trace = {"seeds": [0, 1, 2], "repair": "none", "methods": {m: r.stats for m, r in found.results.items()}}
    (folder / "trace.json").write_text(json.dumps(trace))
    tree = {"model": {"arch": "mlp", "mlp": {"hidden": 2, "width": 6}}, "train": {"epochs": 1}}
    tree["merge_many"] = {"seeds": [0, 1, 2], "repair": "none", "methods": list(METHODS), **METHODS}
    (tmp_path / "run" / "params.yaml").write_text(yaml.safe_dump(tree))
    git = ["git", "-C", str(tmp_path / "run"), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "run"]):
        subprocess.run([*git, *command], capture_output=True, check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["study", "many", "collect", "--run", str(tmp_path / "run"), "--out", str(out), "--dpi", "30"]
    )
    assert result.exit_code == 0, result.output
    page = (out / "many_models.md").read_text()
    assert page.count("\n| ") == 1 + 1 + len(METHODS) + 3  # header, pairwise WM, the methods, three references
    assert "| C2M3 | " in page and (out / "many_models.png").stat().st_size > 0
    run = json.loads((out / "run.json").read_text())
    assert run["seeds"] == [0, 1, 2]
    assert 4 <= len(run["commit"]) < len(head) and head.startswith(run["commit"])  # the run's own, --short
    missing = CliRunner().invoke(app, ["study", "many", "collect", "--run", str(tmp_path), "--out", str(out)])
    tables = f"{tmp_path / 'data' / 'merge_many'}/{{evaluation,methods,pairwise}}.parquet"
    assert missing.exit_code == 1 and missing.output == f"error: --run: expected a run with {tables}, got {tmp_path}\n"
