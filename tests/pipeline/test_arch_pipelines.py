"""Every registered architecture and data kind through the whole DAG by a real ``dvc repro``: one test,
parametrised by :data:`CASES`. Each case restores the session's tiny run (``tiny_run``: an MLP on the
mnist5k digits), changes ``params.yaml`` to its architecture and data, writes the inputs a user would bring
(a corpus, a network file, CIFAR-10 files) and reruns: only what the change reaches runs again. A new
architecture or data kind adds a case here; ``test_every_registered_architecture_and_data_kind_has_a_case``
fails until it does. The cases' params, inputs and checks are in ``cases_vision.py`` and ``cases_data.py``."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml
from cases_data import DATA_CASES
from cases_vision import NETS, TRACED, VISION_CASES
from dvc_repo import TINY, deep_update, dvc_env, make_repo

from lmclab.archs import ARCHS
from lmclab.core.data import FOLDER_LOADERS, LOADERS
from lmclab.core.text import TEXTS

pytestmark = pytest.mark.slow  # each case: a dozen python processes, each importing torch

CASES = {**VISION_CASES, **DATA_CASES}  # name: architecture-data kind
# not a case here: each is the same pipeline path as a case (the same stages, the same kind of model or
# loader), so what it adds is tested without a DVC run, where the named test says
COVERED_ELSEWHERE = {
    "mlp": "the tiny run itself (tests/pipeline/test_pipeline.py and every test that restores it)",
    "mnist5k": "the tiny run itself",
    "vgg": "a BatchNorm conv net like resnet20-cifar10; tests/archs/test_every_arch.py (spec, invariance, WM)",
    "resnet50": "a BatchNorm conv net like resnet20-cifar10; tests/archs/test_every_arch.py",
    "mixer": "an MLP over patches; tests/archs/test_mixer.py (spec, WM, AM, traced spec, validate)",
    "mnist": "torchvision's loader of resnet20-cifar10's kind; tests/core/test_data.py (its on-disk format)",
    "fashion_mnist": "torchvision's loader of resnet20-cifar10's kind; tests/core/test_data.py (its on-disk format)",
    "imagenet": "a local ImageFolder; tests/core/test_conv_data.py",
    "pydoc": "token windows like gpt-text's; tests/core/test_text.py (prepared as byte windows)",
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_whole_dag_runs_on_every_architecture_and_data_kind(name, tiny_run, tmp_path):
    case = CASES[name]
    repo = tiny_run.restore(tmp_path / "repo")
    (repo / "params.yaml").write_text(yaml.safe_dump(deep_update(copy.deepcopy(TINY), case.params), sort_keys=False))
    env = {**dvc_env(), **case.inputs(repo)}
    proc = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc repro failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Running stage 'plot'" in proc.stdout
    for check in case.checks:
        check(repo, env)


def test_every_registered_architecture_and_data_kind_has_a_case():
    archs = {c.params.get("model", {}).get("arch", TINY["model"]["arch"]) for c in CASES.values()}
    archs |= {"mae"} if any(c.params.get("train", {}).get("objective") == "mae" for c in CASES.values()) else set()
    data = {c.params.get("data", {}).get("name", TINY["data"]["name"]) for c in CASES.values()}
    assert set(ARCHS) - archs - set(COVERED_ELSEWHERE) == set(), "add a case to CASES"
    assert {*LOADERS, *FOLDER_LOADERS, *TEXTS} - data - set(COVERED_ELSEWHERE) == set(), "add a case to CASES"


def test_validate_refuses_a_network_the_tracer_cannot_prove_before_training(tmp_path):
    params = deep_update(copy.deepcopy(TINY), copy.deepcopy(TRACED))
    params["model"]["traced"]["factory"] = "nets.small:build_rolled"
    repo = make_repo(tmp_path, params)  # no run to restore: nothing may train
    (repo / "nets").mkdir()
    (repo / "nets" / "small.py").write_text(NETS)
    proc = subprocess.run(["dvc", "repro"], cwd=repo, env=dvc_env(), capture_output=True, text=True)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith("error: model.traced: trace_spec: node 'roll': roll in net ")  # self.net
    assert "train@0" not in proc.stdout and not (repo / "data" / "models").exists()
