"""``model.arch: traced`` through the real pipeline (`dvc repro` in a temporary git repository): a
network from the repository's own file (a residual stream, a concatenation and a flatten of a 2 × 2 map
into blocks) trains, is aligned by every method on its traced spec, merged and measured; a network the
tracer cannot prove is refused by ``validate`` before any training."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
from dvc_repo import TINY, deep_update, dvc_env, make_repo, run

pytestmark = pytest.mark.slow

NETS = """
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        self.side = nn.Conv2d(channels, channels // 2, 1)
        self.head = nn.Linear((channels + channels // 2) * 4, num_classes)

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(h + self.body(h))  # a residual stream: stem and body share one permutation
        h = torch.cat([h, torch.relu(self.side(h))], 1)  # two groups side by side
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 2), 1))  # blocks of 2 × 2


def build(num_classes: int, channels: int = 8) -> nn.Module:
    return Residual(channels, num_classes)


class Rolled(Residual):
    def forward(self, x):
        h = torch.roll(self.stem(x), 1, dims=1)  # shifts channels by position: no permutation symmetry
        h = torch.cat([h, self.side(h)], 1)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 2), 1))


def build_rolled(num_classes: int, channels: int = 8) -> nn.Module:
    return Rolled(channels, num_classes)
"""

PARAMS = deep_update(
    copy.deepcopy(TINY),
    {
        "model": {
            "arch": "traced",
            "traced": {"factory": "nets.small:build", "kwargs": {"channels": 8}, "in_channels": None, "partial": False},
        },
        "permute": {
            "methods": ["identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"],
            "ste": {"batch_size": 64, "epochs": 1},
            "ste_sinkhorn": {"batch_size": 64, "epochs": 1},
        },
        "three": {"methods": ["wm"]},
        "measure": {"bn_repair_samples": 100},
    },
)


def test_a_traced_network_from_the_repository_runs_the_whole_pipeline(tmp_path: Path):
    repo = make_repo(tmp_path, PARAMS)
    (repo / "nets").mkdir()
    (repo / "nets" / "small.py").write_text(NETS)
    out = run(repo, "dvc", "repro")
    assert "Running stage 'plot'" in out
    headline = json.loads((repo / "metrics" / "headline.json").read_text())
    assert {"identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"} <= set(headline)
    assert headline["identity"]["L2_red"] == 0
    assert all(headline[m]["L2_red"] > 0 for m in ("wm", "wm_sinkhorn"))  # they moved θb on the traced spec
    summary = json.loads((repo / "data" / "measure" / "seed0-seed1" / "wm" / "summary.json").read_text())
    assert summary["bn_repair"] is True and summary["l2_after"] < summary["l2_before"]


def test_validate_refuses_a_network_the_tracer_cannot_prove_before_training(tmp_path: Path):
    params = deep_update(copy.deepcopy(PARAMS), {"model": {"traced": {"factory": "nets.small:build_rolled"}}})
    repo = make_repo(tmp_path, params)
    (repo / "nets").mkdir()
    (repo / "nets" / "small.py").write_text(NETS)
    proc = subprocess.run(["dvc", "repro"], cwd=repo, env=dvc_env(), capture_output=True, text=True)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith("error: model.traced: trace_spec: node 'roll': roll in net ")  # self.net
    assert "train@0" not in proc.stdout and not (repo / "data" / "models").exists()
