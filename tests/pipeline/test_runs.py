"""Reading a ``dvc exp`` sweep back (lmclab.pipeline.runs): the experiments that differ only in the swept
keys, those named, the workspace's own run, the refusals, and a table read from an experiment's cache."""

from __future__ import annotations

from typing import Any

import pytest

from lmclab.pipeline import runs


def _exp_show(rows: list[dict]) -> list[dict]:
    base = {"rev": "workspace", "Experiment": None, "train.lr": 0.1, "train.epochs": 2, "model.arch": "mlp"}
    return [base, *({**base, "rev": f"r{i}", **row} for i, row in enumerate(rows))]


@pytest.fixture
def dvc_api(monkeypatch):
    """``dvc.api`` answering from the rows a test sets, and tables named by (table, experiment)."""
    import dvc.api

    state: dict[str, Any] = {"rows": []}
    monkeypatch.setattr(dvc.api, "params_show", lambda: {"train": {"lr": 0.1, "epochs": 2}, "model": {"arch": "mlp"}})
    monkeypatch.setattr(dvc.api, "exp_show", lambda: state["rows"])
    monkeypatch.setattr(runs, "_read_table", lambda table, rev: (table, rev))
    return state


def test_a_sweep_gathers_the_experiments_that_differ_only_in_swept_keys(dvc_api, capsys) -> None:
    dvc_api["rows"] = _exp_show(
        [
            {"Experiment": "lr-small", "train.lr": 0.01},
            {"Experiment": "lr-large", "train.lr": 0.5},
            {"Experiment": "longer", "train.lr": 0.3, "train.epochs": 4},  # another sweep's
        ]
    )
    found = runs.experiment_runs(lambda r: r["train.lr"], ("curves",), swept=lambda k: k == "train.lr")
    assert found == {0.01: {"curves": ("curves", "lr-small")}, 0.5: {"curves": ("curves", "lr-large")}}
    assert "longer: left out (differs in train.epochs)" in capsys.readouterr().out
    named = runs.experiment_runs(
        lambda r: r["train.lr"], ("curves", "pairs"), swept=lambda k: False, exps="longer,lr-small", workspace=True
    )
    assert named == {
        0.1: {"curves": ("curves", None), "pairs": ("pairs", None)},
        0.01: {"curves": ("curves", "lr-small"), "pairs": ("pairs", "lr-small")},
        0.3: {"curves": ("curves", "longer"), "pairs": ("pairs", "longer")},
    }
    assert capsys.readouterr().out.splitlines() == [
        "0.1: workspace",
        "0.01: lr-small",
        "lr-large: left out (differs in train.lr)",
        "0.3: longer",
    ]


def test_a_sweep_refuses_two_runs_of_one_value_and_fewer_than_two(dvc_api) -> None:
    dvc_api["rows"] = _exp_show([{"Experiment": "a", "train.lr": 0.5}, {"Experiment": "b", "train.lr": 0.5}])
    with pytest.raises(ValueError, match=r"^two runs have the value 0\.5; pick experiments with --exps$"):
        runs.experiment_runs(lambda r: r["train.lr"], ("t",), swept=lambda k: k == "train.lr")
    dvc_api["rows"] = _exp_show([{"Experiment": "a", "train.lr": 0.5}])
    with pytest.raises(ValueError, match=r"^found fewer than two runs; queue a sweep first"):
        runs.experiment_runs(lambda r: r["train.lr"], ("t",), swept=lambda k: k == "train.lr")


def test_nested_params_flatten_to_dotted_keys() -> None:
    assert runs._flat({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": None}) == {"a.b.c": 1, "a.d": [1, 2], "e": None}


def test_a_table_is_read_from_the_workspace_or_from_an_experiments_cache(tmp_path, monkeypatch) -> None:
    import io

    import dvc.api
    import pandas as pd

    (tmp_path / "data" / "tables").mkdir(parents=True)
    here, there = pd.DataFrame({"x": [1, 2]}), pd.DataFrame({"x": [3]})
    here.to_parquet(tmp_path / "data" / "tables" / "pairs.parquet")
    monkeypatch.chdir(tmp_path)
    opened = []

    def dvc_open(path, rev, mode):
        opened.append((path, rev, mode))
        buffer = io.BytesIO()
        there.to_parquet(buffer)
        return io.BytesIO(buffer.getvalue())

    monkeypatch.setattr(dvc.api, "open", dvc_open)
    assert runs._read_table("pairs", None).equals(here) and opened == []
    assert runs._read_table("pairs", "exp-1").equals(there)
    assert opened == [("data/tables/pairs.parquet", "exp-1", "rb")]
