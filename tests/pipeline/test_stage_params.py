"""Stages read params.yaml as DVC does (YAML 1.2) and only through the keys their ``params:`` in
dvc.yaml declare, so a key a stage reads but does not declare fails the stage instead of letting
DVC serve a stale result when it changes (every stage runs this reader in tests/pipeline/test_pipeline.py)."""

from __future__ import annotations

import ast
import re

import pytest
import yaml
from dvc.utils.serialize import parse_yaml as dvc_parse_yaml
from dvc_repo import ROOT

from lmclab.pipeline.stage import StageParams, declared_keys, load_yaml, parse_yaml

PIPELINE = load_yaml(ROOT / "dvc.yaml")
STAGES = sorted(PIPELINE["stages"])


@pytest.mark.parametrize("text", ["1e-06", "1E-3", ".5", "5e2", "1.0e-7"])
def test_numbers_as_dvc_writes_them_are_read_as_dvc_reads_them(text: str) -> None:
    ours = parse_yaml(f"tol: {text}")["tol"]
    assert isinstance(ours, float) and ours == dvc_parse_yaml(f"tol: {text}", "params.yaml")["tol"]


def test_pyyaml_would_read_dvcs_exponent_as_a_string() -> None:
    """The YAML float trap: `dvc exp run -S tol=1e-6` writes `tol: 1e-06`."""
    assert yaml.safe_load("tol: 1e-06")["tol"] == "1e-06"


def _write(tmp_path, tree: dict):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_matrix_and_templated_declarations_resolve_to_the_actual_keys() -> None:
    tree = {"model": {"arch": "vgg"}}
    assert declared_keys(PIPELINE, "permute", tree, {"method": "wm"}) == [
        "permute.wm",
        "permute.seed",
        "permute.symmetry",
        "device",
        "threads",
    ]
    assert declared_keys(PIPELINE, "train", tree, {})[:2] == ["model.arch", "model.vgg"]
    assert declared_keys(PIPELINE, "validate", tree, {}) == [""]  # the whole file


def test_keys_listed_under_params_yaml_are_declared_and_another_file_s_are_not() -> None:
    params = ["device", {"params.yaml": ["train.lr", "train.${model.arch}"]}, {"other.yaml": ["x"]}]
    dvc_yaml = {"stages": {"s": {"params": params}, "whole": {"params": [{"params.yaml": None}]}}}
    assert declared_keys(dvc_yaml, "s", {"model": {"arch": "mlp"}}, {}) == ["device", "train.lr", "train.mlp"]
    assert declared_keys(dvc_yaml, "whole", {}, {}) == [""]  # the whole file


def test_an_undeclared_key_is_refused_with_one_line(tmp_path) -> None:
    read = StageParams(
        "permute",
        _write(tmp_path, {"permute": {"seed": 1, "wm": {"tol": 0.5}, "am": {}}, "device": "cpu", "train": {"lr": 1}}),
        dvc_yaml=ROOT / "dvc.yaml",
        method="wm",
    ).read
    assert read("permute.seed") == 1 and read("permute.wm") == {"tol": 0.5} and read("permute.wm.tol") == 0.5
    for key in ("train.lr", "permute.am", "train"):
        with pytest.raises(SystemExit, match=rf"^error: stage permute reads params key {key}, which its params: "):
            read(key)


def test_look_ups_inside_a_block_read_whole_are_checked(tmp_path) -> None:
    tree = {
        "measure": {
            "num_lambdas": 3,
            "gammas": [0],
            "secret": 1,
            "repair": "bn",
            "repair_samples": None,
            "taylor_splits": ["test"],
            "conv_spectrum": "fft",
        }
    }
    opts = StageParams("measure", _write(tmp_path, tree), dvc_yaml=ROOT / "dvc.yaml").read("measure")
    assert opts["gammas"] == [0] and opts.get("repair_samples", 5) is None and len(opts) == 7
    with pytest.raises(SystemExit, match="reads params key measure.secret"):
        opts["secret"]
    with pytest.raises(SystemExit, match="reads params key measure.secret"):
        dict(opts)


def test_a_declared_key_absent_from_a_block_is_a_missing_key_not_a_refusal(tmp_path) -> None:
    """``permute`` is read in part (``permute.wm`` and ``permute.seed``): a declared key the file lacks
    takes ``.get``'s default; an undeclared one is still refused, present or not."""
    path = _write(tmp_path, {"permute": {"wm": {"tol": 0.5}, "am": {}}, "device": "cpu"})
    block = StageParams("permute", path, dvc_yaml=ROOT / "dvc.yaml", method="wm").read("permute")
    assert block.get("seed", 7) == 7 and "seed" not in block and block["wm"] == {"tol": 0.5}
    with pytest.raises(KeyError, match="^'seed'$"):
        block["seed"]
    for name in ("am", "absent"):
        with pytest.raises(SystemExit, match=rf"^error: stage permute reads params key permute\.{name}, which"):
            block.get(name, 7)


def test_a_stage_and_placeholders_dvc_yaml_does_not_have_are_one_line() -> None:
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml: no stage 'nowhere'$"):
        declared_keys(PIPELINE, "nowhere", {}, {})
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml: no stage 'train'$"):
        declared_keys({}, "train", {}, {})  # a dvc.yaml without stages
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml: stage permute: cannot resolve \$\{item\.method\}$"):
        declared_keys(PIPELINE, "permute", {}, {})
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml: stage train: cannot resolve \$\{model\.arch\}$"):
        declared_keys(PIPELINE, "train", {"model": {}}, {})
    with pytest.raises(SystemExit, match=r"^error: dvc\.yaml: stage train: cannot resolve \$\{model\.arch\}$"):
        declared_keys(PIPELINE, "train", {"model": None}, {})  # `model:` written with nothing under it
    assert declared_keys(PIPELINE, "train", {"model": {"arch": "mlp"}}, {})[:2] == ["model.arch", "model.mlp"]


def test_a_params_file_that_is_not_yaml_is_one_line_naming_it(tmp_path) -> None:
    (tmp_path / "params.yaml").write_text("train: {epochs: 3\nseeds: [0, 1]\n")
    with pytest.raises(SystemExit, match=r"^error: .*params\.yaml: not valid YAML \(while parsing a flow mapping"):
        load_yaml(tmp_path / "params.yaml")
    with pytest.raises(SystemExit, match=r"^error: <text>: not valid YAML \(.*\)$"):
        parse_yaml("a: [1, 2")
    assert parse_yaml("a: [1, 2]") == {"a": [1, 2]}


def test_a_missing_declared_key_is_one_line(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"params.yaml: missing key permute.seed$"):
        StageParams("permute", _write(tmp_path, {"permute": {"wm": {}}}), dvc_yaml=ROOT / "dvc.yaml", method="wm").read(
            "permute.seed"
        )


def _script(stage: str) -> str:
    return re.search(r"stages/(\w+)\.py", PIPELINE["stages"][stage]["cmd"])[1]


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_reads_params_only_through_its_own_declarations(stage: str) -> None:
    """The script reads params with ``stage_params("<its dvc.yaml stage>", …)``, never by itself."""
    source = (ROOT / "stages" / f"{_script(stage)}.py").read_text()
    calls = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "stage_params"
    ]
    assert [c.args[0].value for c in calls] == ([stage] if "params" in PIPELINE["stages"][stage] else [])
    assert not re.search(r"(import|from) (yaml|ruamel)|params\.read_text|open\(params", source)


@pytest.mark.parametrize("stage", STAGES)
def test_every_declared_key_exists_in_params_yaml(stage: str) -> None:
    tree = load_yaml(ROOT / "params.yaml")
    items = (
        [{"method": m} for m in tree["permute"]["methods"]] if "item.method" in str(PIPELINE["stages"][stage]) else [{}]
    )
    for item in items:
        read = StageParams(stage, ROOT / "params.yaml", dvc_yaml=ROOT / "dvc.yaml", **item).read
        for key in declared_keys(PIPELINE, stage, tree, item):
            read(key)


@pytest.mark.slow
def test_the_stages_reading_permute_seed_run_on_their_declarations(prepared, tmp_path) -> None:
    """permute, connect and merge_many on three random MLPs, in-process, reading the tiny params
    through their own declarations (tests/pipeline/test_pipeline.py runs every stage through dvc repro)."""
    import connect
    import merge_many
    import permute
    from test_pipeline import TINY
    from typer.testing import CliRunner

    from lmclab.archs import build_model, make_config
    from lmclab.archs.checkpoint import Checkpoint, save_checkpoint

    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=8)
    for seed in (0, 1, 2):
        save_checkpoint(
            tmp_path / f"seed{seed}.pt",
            Checkpoint("mlp", config, seed, build_model("mlp", config, seed=seed).state_dict()),
        )
    params = _write(tmp_path, {**TINY, "three": {**TINY["three"], "resolution": 2}})
    common = ["--data", str(prepared), "--params", str(params)]
    runs = {
        permute: [
            "--method",
            "wm",
            "--model-a",
            str(tmp_path / "seed0.pt"),
            "--model-b",
            str(tmp_path / "seed1.pt"),
            "--out",
            str(tmp_path / "perm"),
        ],
        connect: ["--method", "wm", "--seeds", "0,1,2", "--models", str(tmp_path), "--out", str(tmp_path / "c")],
        merge_many: ["--models", str(tmp_path), "--out", str(tmp_path / "mm")],
    }
    for stage, args in runs.items():
        result = CliRunner().invoke(stage.app, args + common)
        assert result.exit_code == 0, f"{stage.__name__}: {result.output}"


def test_connect_takes_permutes_alignment_of_b_only_from_a_permute_output(tmp_path) -> None:
    """``--aligned-b``: a folder with perm.pt and stats.json of the same method, else one line."""
    import json

    import torch
    from connect import load_alignment

    with pytest.raises(ValueError, match=r"^--aligned-b: expected .* to hold perm.pt and stats.json"):
        load_alignment(tmp_path, "wm")
    torch.save({"h0": torch.tensor([1, 0])}, tmp_path / "perm.pt")
    (tmp_path / "stats.json").write_text(json.dumps({"method": "wm", "seconds": 0.5}))
    with pytest.raises(ValueError, match=r"^--aligned-b: .* holds a 'wm' alignment, expected 'wm_sinkhorn'$"):
        load_alignment(tmp_path, "wm_sinkhorn")
    found = load_alignment(tmp_path, "wm")
    assert torch.equal(found.perm["h0"], torch.tensor([1, 0])) and found.stats == {"seconds": 0.5}


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_that_computes_declares_the_thread_policy(stage: str) -> None:
    """Results depend on the thread count in their last bits: a stage that runs torch on the device
    (it declares ``device``) or repairs statistics reruns when ``threads`` changes."""
    declared = declared_keys(PIPELINE, stage, load_yaml(ROOT / "params.yaml"), {"method": "wm", "seed": 0})
    computes = "device" in declared or stage == "merge"
    assert ("threads" in declared) == computes, declared


def test_a_stage_takes_its_threads_from_the_environment_then_its_params_then_auto(tmp_path, monkeypatch) -> None:
    import torch

    from lmclab.core.threads import starting_threads
    from lmclab.pipeline.stage import stage_params

    before = torch.get_num_threads()
    tree = {"permute": {"seed": 1, "wm": {}}, "device": "cpu", "threads": 3, "plot": {}}
    path = _write(tmp_path, tree)
    try:
        monkeypatch.delenv("LMCLAB_THREADS", raising=False)
        stage_params("permute", path, dvc_yaml=ROOT / "dvc.yaml", method="wm")
        assert torch.get_num_threads() == 3  # declared: params.yaml's
        stage_params("plot", path, dvc_yaml=ROOT / "dvc.yaml")
        assert torch.get_num_threads() == starting_threads()  # not declared: auto, whatever params.yaml says
        monkeypatch.setenv("LMCLAB_THREADS", "2")
        stage_params("permute", path, dvc_yaml=ROOT / "dvc.yaml", method="wm")
        assert torch.get_num_threads() == 2  # the environment overrides params.yaml
        monkeypatch.setenv("LMCLAB_THREADS", "two")
        with pytest.raises(
            SystemExit, match=r"^error: LMCLAB_THREADS: expected auto or a positive integer, got 'two'$"
        ):
            stage_params("permute", path, dvc_yaml=ROOT / "dvc.yaml", method="wm")
    finally:
        torch.set_num_threads(before)
