"""The pipeline's helpers off their common path: the schema built afresh (its overridden defaults and the
library's kept beside them), the checks that span several keys on both sides of their boundaries, the
torchrun relaunch and join, a missing YAML file, a command that runs no Python script, and a ``dvc exp``
sweep read back (lmclab.pipeline.runs)."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
from dvc_repo import ROOT
from test_pipeline import TINY

import lmclab.core.distributed as distributed
from lmclab.pipeline import runs, schema, stage, torchrun
from lmclab.pipeline.block import Block, key
from lmclab.pipeline.closure import code_closure, stage_script
from lmclab.pipeline.defaults import Override
from lmclab.pipeline.keys import defaults
from lmclab.pipeline.stage import load_yaml
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.search import METHODS


def _params(**blocks) -> dict:
    params = copy.deepcopy(TINY)
    for block, values in blocks.items():
        params[block] = {**params[block], **values}
    return params


@pytest.fixture
def fresh_schema():
    """The params.yaml schema built again in the test (it is built once per process and cached)."""
    schema._params_model.cache_clear()
    yield schema.params_model()
    schema._params_model.cache_clear()


def test_the_schema_built_afresh_holds_the_pipeline_defaults_and_the_librarys(fresh_schema) -> None:
    assert defaults(fresh_schema) == load_yaml(ROOT / "params.yaml")
    permute = fresh_schema.model_fields["permute"].annotation
    sinkhorn = permute.model_fields["wm_sinkhorn"].annotation.model_fields["epochs"]
    library = METHODS["wm_sinkhorn"].options.model_fields["epochs"]
    assert sinkhorn.default == schema.PIPELINE_DEFAULTS["permute.wm_sinkhorn.epochs"].default != library.default
    assert sinkhorn.json_schema_extra["library_default"] == library.default
    assert sinkhorn.description == library.description and sinkhorn.metadata == library.metadata


def test_an_options_block_keeps_the_fields_own_schema_extras_beside_the_library_default() -> None:
    class Options(Block):
        epochs: int = key(3, "passes", ge=1, json_schema_extra={"unit": "epoch"})
        shape: tuple[int, ...] = key((2, 3), "a shape")

    overridden = Override(7, "a test")
    saved = dict(schema.PIPELINE_DEFAULTS)
    schema.PIPELINE_DEFAULTS["test.block.epochs"] = overridden
    try:
        block = schema.options_block(Options, "test.block")
    finally:
        schema.PIPELINE_DEFAULTS.clear()
        schema.PIPELINE_DEFAULTS.update(saved)
    epochs, shape = block.model_fields["epochs"], block.model_fields["shape"]
    assert epochs.default == 7 and epochs.json_schema_extra == {"unit": "epoch", "library_default": 3}
    assert shape.default == [2, 3] and shape.json_schema_extra is None  # a sequence is written as a list
    assert list(schema.options_block(Options, "other", ["shape"]).model_fields) == ["shape"]
    assert defaults(block) == {"epochs": 7, "shape": [2, 3]} and defaults(Options) == {"epochs": 3, "shape": (2, 3)}


def test_a_derived_block_replaces_only_the_types_it_names() -> None:
    class Base(Block):
        methods: list[str] = key(["wm"], "methods")
        seeds: list[int] = key([0, 1], "seeds")

    derived = schema._derived(Base, types={"methods": list[int]})
    assert derived.model_fields["methods"].annotation == list[int]
    assert derived.model_fields["seeds"].annotation == list[int]
    assert defaults(derived) == {"methods": ["wm"], "seeds": [0, 1]}
    extended = schema._derived(Base, last={"seed": (int, key(0, "the seed"))})  # no types: every one kept
    assert {n: f.annotation for n, f in extended.model_fields.items()} == {
        "methods": list[str],
        "seeds": list[int],
        "seed": int,
    }


@pytest.mark.parametrize("block", ["merge_many", "measure"])
def test_a_batchnorm_repair_must_fit_the_network_of_merge_many_and_measure(block: str) -> None:
    with pytest.raises(ParamsError) as err:
        check_params(_params(**{block: {"repair": "bn"}}))  # the MLP has no BatchNorm
    assert err.value.lines == [
        f"{block}.repair: 'bn' does not fit model.arch 'mlp'; expected repair or none (the network has no BatchNorm)"
    ]
    check_params(_params(**{block: {"repair": "repair"}}))
    check_params(_params(**{block: {"repair": "auto"}}))
    vgg = {**TINY["model"], "arch": "vgg"}
    with pytest.raises(ParamsError) as err:
        check_params(_params(model=vgg, **{block: {"repair": "repair"}}))
    assert err.value.lines == [
        f"{block}.repair: 'repair' does not fit model.arch 'vgg'; expected bn (the network has BatchNorm)"
    ]


def test_a_traced_network_is_checked_by_the_merge_many_stage_not_before(monkeypatch) -> None:
    """Validation builds no traced network for merge_many.repair: its stage does (with the data's shape)."""
    params = _params(model={**TINY["model"], "arch": "traced"}, merge_many={"repair": "bn"})
    params["model"]["traced"] = {"factory": "torch.nn:Flatten", "kwargs": {}, "in_channels": None, "partial": False}
    monkeypatch.setattr("lmclab.pipeline.validate.has_batchnorm", lambda net: pytest.fail("built for repair"))
    check_params(params)


@pytest.mark.parametrize(("batch_size", "refused"), [(7, True), (8, False)])
def test_each_data_parallel_process_needs_two_images(batch_size: int, refused: bool) -> None:
    """2 processes on each of 2 nodes: 8 images is the least batch (2 per process)."""
    train = {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "localhost:29500", "batch_size": batch_size}
    if not refused:
        check_params(_params(train=train))
        return
    with pytest.raises(ParamsError) as err:
        check_params(_params(train=train))
    assert err.value.lines == [
        "train.batch_size: expected at least 2 images for each of the 4 data-parallel processes, got 7"
    ]


def test_problems_of_several_checks_each_get_a_line_joined_by_newlines() -> None:
    params = _params(train={"nproc_per_node": 2, "batch_size": 3}, merge_many={"repair": "bn"})
    with pytest.raises(ParamsError) as err:
        check_params(params)
    assert [line.split(":")[0] for line in err.value.lines] == ["merge_many.repair", "train.batch_size"]
    assert str(err.value) == "\n".join(err.value.lines)


def test_torchrun_relaunches_a_stage_once_and_joins_its_world(monkeypatch) -> None:
    runs = []
    monkeypatch.setattr(torchrun.subprocess, "run", lambda command, env: runs.append((command, env)) or _Done())
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    torchrun.relaunch_under_torchrun("stages/train.py", ["--x"], run_id="r", nproc_per_node=1)  # one process
    assert runs == []
    with pytest.raises(SystemExit) as done:
        torchrun.relaunch_under_torchrun("stages/train.py", ["--x"], run_id="r", nproc_per_node=2)
    assert done.value.code == 3
    ((command, env),) = runs
    assert command == distributed.torchrun_command(
        sys.executable, "stages/train.py", ["--x"], run_id="r", nproc_per_node=2, nnodes=1, rdzv_endpoint=None
    )
    assert env["LMCLAB_WARM"] == "0"
    with pytest.raises(SystemExit):  # two processes on each of two machines: four
        torchrun.relaunch_under_torchrun("t.py", [], run_id="r", nproc_per_node=2, nnodes=2, rdzv_endpoint="h:1")
    assert len(runs) == 2 and "--nnodes=2" in runs[1][0]
    monkeypatch.setenv("LOCAL_RANK", "1")  # already one of torchrun's processes
    torchrun.relaunch_under_torchrun("stages/train.py", [], run_id="r", nproc_per_node=2)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(distributed, "join_world", lambda *args: args)
    assert torchrun.join_torchrun(_Device()) == (3, 4, 1, "cpu")


class _Done:
    returncode = 3


class _Device:
    type = "cpu"


def test_a_missing_yaml_file_is_named(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"^error: .*nowhere\.yaml: file not found$"):
        load_yaml(tmp_path / "nowhere.yaml")


@pytest.mark.parametrize(
    ("cmd", "script"),
    [
        ("python stages/train.py --x", "stages/train.py"),
        ("python3 stages/plot.py", "stages/plot.py"),
        ("dvc exp show", None),
        ("python -m lmclab", None),
        ("python", None),
    ],
)
def test_the_script_of_a_stage_command(cmd: str, script: str | None) -> None:
    assert stage_script(cmd) == script


def test_a_scripts_closure_holds_no_package_file_it_does_not_run(tmp_path) -> None:
    """``python stages/run.py`` runs ``stages/run.py`` as a script: ``stages/__init__.py`` is not run, even
    though the folder is a package, and neither is any ``__init__`` of ``src/`` it does not import."""
    (tmp_path / "stages").mkdir()
    (tmp_path / "src" / "lib").mkdir(parents=True)
    (tmp_path / "stages" / "__init__.py").write_text("")
    (tmp_path / "src" / "__init__.py").write_text("")
    (tmp_path / "src" / "lib" / "__init__.py").write_text("")
    (tmp_path / "src" / "lib" / "tool.py").write_text("")
    (tmp_path / "stages" / "helper.py").write_text("import lib.tool\n")
    (tmp_path / "stages" / "run.py").write_text("import helper\n")
    assert code_closure(tmp_path, "stages/run.py") == {
        "stages/run.py",
        "stages/helper.py",
        "src/lib/__init__.py",
        "src/lib/tool.py",
    }


FLIPPED_NET = """from torch import nn


class Flipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.conv(x).flip(1).mean((2, 3)))


def build():
    return Flipped()
"""


@pytest.mark.parametrize(
    ("factory", "line"),
    [
        ("nowhere.module:build", "model.traced.factory: cannot import 'nowhere.module:build' (No module named"),
        ("torch.nn:LSTM", "model.traced: torch.nn:LSTM(**{'num_classes': 10}) failed: "),
        ("flipped_net:build", "model.traced: trace_spec: node 'flip'"),
    ],
    ids=["names-its-key", "fails-to-build", "refused-by-the-tracer"],
)
def test_a_traced_factory_that_fails_is_one_line_naming_its_key(factory: str, line: str, tmp_path, monkeypatch) -> None:
    """An error that names its key is kept as it is; any other is prefixed with the block's key."""
    (tmp_path / "flipped_net.py").write_text(FLIPPED_NET)  # its channels read in reverse: refused by the tracer
    monkeypatch.syspath_prepend(str(tmp_path))
    params = _params(model={**TINY["model"], "arch": "traced"})
    params["model"]["traced"] = {"factory": factory, "kwargs": {}, "in_channels": 3, "partial": False}
    with pytest.raises(ParamsError) as err:
        check_params(params)
    assert len(err.value.lines) == 1 and err.value.lines[0].startswith(line)


@pytest.mark.parametrize(
    ("warm", "accepted", "code"), [(True, True, 4), (True, True, None), (False, True, 4), (True, False, 4)]
)
def test_a_stage_runs_in_a_warm_worker_or_here(monkeypatch, warm: bool, accepted: bool, code: int | None) -> None:
    """With warm start on and the command line accepted, the worker's exit code ends the stage (None: the
    worker was unavailable, the stage runs here); with it off, or a command line the stage refuses (``--help``,
    a usage error), the stage runs here without asking."""
    calls = []
    monkeypatch.setattr(stage, "die_with_parent", lambda pid: calls.append(("parent", pid)))
    monkeypatch.setattr(stage, "enabled", lambda: warm)
    monkeypatch.setattr(stage, "accepts", lambda app, argv: accepted)
    monkeypatch.setattr(stage, "run_script", lambda script, argv: calls.append(("worker", script, argv)) or code)
    monkeypatch.setattr(sys, "argv", ["stages/x.py", "--seed", "1"])
    if warm and accepted and code is not None:
        with pytest.raises(SystemExit) as done:
            stage.run_warm(lambda: calls.append("here"))
        assert done.value.code == 4
    else:
        stage.run_warm(lambda: calls.append("here"))
        assert calls[-1] == "here"
    assert calls[0] == ("parent", stage.STARTED_BY)
    assert (("worker", "stages/x.py", ["--seed", "1"]) in calls) == (warm and accepted)


@pytest.mark.parametrize(
    ("args", "code", "warm"), [(["--seed", "1"], 4, True), (["--help"], 0, False), (["--seed", "x"], 2, False)]
)
def test_a_stage_asks_a_worker_only_for_a_command_line_it_accepts(monkeypatch, args, code: int, warm: bool) -> None:
    """The stage's own command line decides: ``--help`` and a refused one are answered here by the app."""
    import typer

    app = typer.Typer(add_completion=False)

    @app.command()
    def main(seed: int = typer.Option(...)) -> None:
        pytest.fail("ran here")

    asked = []
    monkeypatch.setattr(stage, "die_with_parent", lambda pid: None)
    monkeypatch.setattr(stage, "enabled", lambda: True)
    monkeypatch.setattr(stage, "run_script", lambda script, argv: asked.append(argv) or 4)
    monkeypatch.setattr(sys, "argv", ["stages/x.py", *args])
    with pytest.raises(SystemExit) as done:
        stage.run_warm(app)
    assert done.value.code == code and asked == ([args] if warm else [])


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
            {"Experiment": "vgg", "train.epochs": 4, "model.arch": "vgg"},  # a third's, in two keys
        ]
    )
    found = runs.experiment_runs(lambda r: r["train.lr"], ("curves",), swept=lambda k: k == "train.lr")
    assert found == {0.01: {"curves": ("curves", "lr-small")}, 0.5: {"curves": ("curves", "lr-large")}}
    out = capsys.readouterr().out.splitlines()
    assert "longer: left out (differs in train.epochs)" in out
    assert "vgg: left out (differs in train.epochs, model.arch)" in out
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
        "vgg: left out (differs in train.epochs, model.arch)",
    ]


def test_an_experiment_of_the_sweep_left_out_of_exps_is_said_to_be_not_named(dvc_api, capsys) -> None:
    """With ``--exps`` an experiment of the sweep not named there differs in no other key: "not named" says why."""
    dvc_api["rows"] = _exp_show(
        [{"Experiment": "lr-small", "train.lr": 0.01}, {"Experiment": "lr-large", "train.lr": 0.5}]
    )
    found = runs.experiment_runs(
        lambda r: r["train.lr"], ("curves",), swept=lambda k: k == "train.lr", exps="lr-small", workspace=True
    )
    assert sorted(found) == [0.01, 0.1]
    assert "lr-large: left out (differs in not named)" in capsys.readouterr().out.splitlines()


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
