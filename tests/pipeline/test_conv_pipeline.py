"""The whole DAG through a real ``dvc repro`` on the CIFAR-format fixture with ResNet20 ×¼:
augmentation, BatchNorm repair at every λ and of the merged model, both curves in the report."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from cifar_fixture import write_cifar10, write_sitecustomize
from dvc_repo import ROOT, copy_committed_inputs
from preset import set_values

pytestmark = pytest.mark.slow  # ~1–2 min: a dozen python processes each importing torch

OVERRIDES = {
    "data.name": "cifar10",
    "model.arch": "resnet20",
    "model.resnet20.width_multiplier": 0.25,
    "train.seeds": [0, 1, 2],
    "train.epochs": 2,
    "train.batch_size": 50,
    "train.lr": 0.003,
    "permute.pairs": [[0, 1]],
    "permute.methods": ["identity", "wm"],
    "measure.num_lambdas": 3,
    "measure.bn_repair_samples": 60,
    "three.triples": [[0, 1, 2]],
    "three.methods": ["wm"],
    "three.resolution": 2,
    "three.margin": 0.0,
    "merge_many.seeds": [0, 1, 2],
    "merge_many.merge_many.max_iter": 2,
    "merge_many.repair": "bn",  # a BatchNorm net
}


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("conv_pipeline")
    for name in ("src", "stages"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    copy_committed_inputs(repo)
    (repo / "params.yaml").write_text(set_values((ROOT / "params.yaml").read_text(), OVERRIDES))
    md5 = write_sitecustomize(repo / "sitecustomize", write_cifar10(repo / "data" / "raw"))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(repo / "sitecustomize"),
        "LMCLAB_CIFAR_MD5": str(md5),
        "OMP_NUM_THREADS": "1",
    }
    _run(["git", "init", "-q"], repo, env)
    _run([sys.executable, "-m", "dvc", "init", "-q"], repo, env)
    _run([sys.executable, "-m", "dvc", "repro"], repo, env)
    return repo, env


def test_repro_writes_repaired_and_stale_curves(repo):
    root, _ = repo
    curves = pd.read_parquet(root / "data" / "tables" / "curves.parquet")
    assert set(curves["repair"]) == {False, True}
    assert set(curves["method"]) == {"identity", "wm"} and set(curves["lam"]) == {0.0, 0.5, 1.0}
    pairs = pd.read_parquet(root / "data" / "tables" / "pairs.parquet")
    assert pairs["bn_repair"].all() and "norepair_test_loss_barrier_mid" in pairs
    # the repaired endpoints are the trained ones up to their statistics: repair is not a no-op
    # at λ = ½ (stale statistics of two different nets), so the two curves differ there
    mid = curves[(curves["lam"] == 0.5) & (curves["split"] == "test")].groupby(["method", "repair"])["loss"].first()
    assert mid["wm", True] != mid["wm", False]
    report = (root / "reports" / "report.md").read_text()
    assert "Without repair" in report and "interpolation.png" in report
    history = pd.read_parquet(root / "data" / "tables" / "history.parquet")
    assert len(history) == 3 * 2 and history["lr"].notna().all()  # 3 seeds × 2 epochs


def test_merged_model_has_repaired_statistics(repo):
    root, _ = repo
    blob = lambda p: torch.load(p, weights_only=True)["state_dict"]  # noqa: E731
    a = blob(root / "data" / "models" / "seed0.pt")
    merged = root / "data" / "merged" / "seed0-seed1" / "wm"
    permuted_b, midpoint = blob(merged / "permuted_b.pt"), blob(merged / "midpoint.pt")
    key = "layer3.2.bn2.running_var"
    assert not torch.allclose(midpoint[key], (a[key] + permuted_b[key]) / 2)
    weight = "layer3.2.conv2.weight"
    assert torch.allclose(midpoint[weight], (a[weight] + permuted_b[weight]) / 2)


def test_changing_repair_samples_reruns_only_downstream(repo):
    root, env = repo
    params = root / "params.yaml"
    params.write_text(set_values(params.read_text(), {"measure.bn_repair_samples": 40}))
    status = _run([sys.executable, "-m", "dvc", "status"], root, env).stdout
    assert "merge@" in status and "measure@" in status
    assert "train@" not in status and "permute@" not in status and "download" not in status
