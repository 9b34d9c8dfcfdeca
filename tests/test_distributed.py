"""Data-parallel training under torchrun (issue 16): two gloo processes of the train stage give the
single-process model on the same global batch (up to float reduction order), the launcher's command,
and the one-line refusals of impossible launches."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from dvc_repo import TINY, deep_update
from lmclab.checkpoint import load_checkpoint
from lmclab.distributed import torchrun_command
from lmclab.validate import ParamsError, check_params

ROOT = Path(__file__).resolve().parent.parent
# max |Δθ| after 2 epochs of Adam on 800 digits: measured 3.0e-8 (float32 summation in another order);
# Adam's normalisation lets such differences grow (default MLP, 5 epochs on 4,000 digits: 1.3e-5,
# benchmarks/bench_ddp.py), so the bound is loose but far below any training effect (~1e-2)
TOLERANCE = 1e-6


def params(tmp_path: Path, **train: object) -> Path:
    tree = deep_update(copy.deepcopy(TINY), {"model": {"mlp": {"hidden": 2, "width": 32}},
                                             "train": {"epochs": 2, "batch_size": 63, **train}})  # shards of 32 and 31
    path = tmp_path / f"params-{train.get('nproc_per_node', 1)}-{train.get('precision', 'fp32')}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def train_stage(tmp_path: Path, prepared: Path, name: str, **train: object) -> tuple[dict, pd.DataFrame, str]:
    out, history = tmp_path / f"{name}.pt", tmp_path / f"{name}.parquet"
    proc = subprocess.run([sys.executable, "stages/train.py", "--seed", "0", "--data", str(prepared), "--out", str(out),
                           "--history", str(history), "--params", str(params(tmp_path, **train))],
                          cwd=ROOT, env={**os.environ, "LMCLAB_WARM": "0"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_checkpoint(out).state_dict, pd.read_parquet(history), proc.stdout


@pytest.mark.slow
def test_two_gloo_processes_train_the_single_process_model(tmp_path: Path, prepared: Path):
    one, history_one, _ = train_stage(tmp_path, prepared, "one")
    two, history_two, stdout = train_stage(tmp_path, prepared, "two", nproc_per_node=2)
    assert "(2 processes)" in stdout  # it did run under torchrun
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= TOLERANCE
    assert any(not torch.equal(one[k], two[k]) for k in one)  # two reductions, not one run twice
    pd.testing.assert_frame_equal(history_one, history_two, rtol=1e-4)


@pytest.mark.slow
def test_bf16_autocast_trains_a_different_close_model(tmp_path: Path, prepared: Path):
    fp32, _, _ = train_stage(tmp_path, prepared, "fp32")
    bf16, history, _ = train_stage(tmp_path, prepared, "bf16", precision="bf16")
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    gap = max(float((fp32[k] - bf16[k]).abs().max()) for k in fp32)
    assert 0 < gap < 0.1 and all(v.dtype == torch.float32 for v in bf16.values() if v.is_floating_point())


def test_the_launcher_runs_standalone_on_one_machine_and_rendezvous_across_several():
    single = torchrun_command("py", "stages/train.py", ["--seed", "0"], nproc_per_node=2, nnodes=1,
                              rdzv_endpoint=None, run_id="r")
    assert single == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                      "stages/train.py", "--seed", "0"]
    multi = torchrun_command("py", "s.py", [], nproc_per_node=8, nnodes=2, rdzv_endpoint="node0:29400", run_id="r")
    assert "--nnodes=2" in multi and "--rdzv-endpoint=node0:29400" in multi and "--rdzv-backend=c10d" in multi
    with pytest.raises(ValueError, match="train.rdzv_endpoint"):
        torchrun_command("py", "s.py", [], nproc_per_node=8, nnodes=2, rdzv_endpoint=None, run_id="r")


@pytest.mark.parametrize("train,message", [
    ({"nnodes": 2}, "train.rdzv_endpoint: expected the host:port of torchrun's rendezvous for train.nnodes = 2"),
    ({"nproc_per_node": 4, "batch_size": 6}, "train.batch_size: expected at least 2 images for each of the 4"),
    ({"rdzv_endpoint": "no port"}, "train.rdzv_endpoint: expected"),
    ({"precision": "fp16"}, "train.precision: expected one of fp32, bf16"),
])
def test_impossible_launches_are_refused_in_one_line(train, message):
    with pytest.raises(ParamsError) as err:
        check_params(deep_update(copy.deepcopy(TINY), {"train": train}))
    assert any(line.startswith(message) for line in err.value.lines), err.value.lines
