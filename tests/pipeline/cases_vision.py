"""The pipeline cases of the image models on the mnist5k digits: a ViT, an MAE, a traced network."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from pipeline_cases import Case, perms_fit

from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.evaluate import evaluate

# ---------------------------------------------------------------- ViT: headed permutations

VIT_METHODS = ["identity", "wm", "am", "ste"]
VIT = {
    "model": {"arch": "vit", "vit": {"patch_size": 7, "width": 16, "heads": 2, "depth": 1}},
    "permute": {"methods": VIT_METHODS, "ste": {"epochs": 1, "batch_size": 50}},
    "three": {"methods": ["wm", "ste"]},
}


def vit_every_method_aligns_the_vits_with_headed_permutations(repo: Path, env: dict) -> None:
    model = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    spec = get_arch("vit").permutation_spec(model.config)
    assert spec.heads and {"P_qk_0", "P_vo_0"} <= set(spec.heads)
    perms_fit(repo, "vit", VIT_METHODS, set())
    pairs = pd.read_parquet(repo / "data" / "tables" / "pairs.parquet")
    assert set(pairs["method"]) == set(VIT_METHODS)
    l2 = pairs.set_index("method")["l2_after"]
    assert (l2[["wm", "am", "ste"]] < l2["identity"]).all()  # each alignment brings θb closer to θa


def vit_three_models_and_the_report_cover_the_vit(repo: Path, env: dict) -> None:
    for method in ("wm", "ste"):
        assert (repo / "data" / "connect" / "seed0-seed1-seed2" / method).is_dir()
    report = (repo / "reports" / "report.md").read_text()
    assert all(f"| {row} |" in report for row in ("WM (re-basin)", "AM", "STE (re-basin)"))


# ---------------------------------------------------------------- MAE pretraining with REPAIR

MAE_METHODS = ["identity", "wm", "am", "ste"]
MAE = {
    "model": {"arch": "vit", "vit": {"patch_size": 7, "width": 16, "heads": 2, "depth": 1}},
    "train": {"objective": "mae", "mae": {"decoder_width": 16, "decoder_depth": 1, "decoder_heads": 2}},
    "permute": {"methods": MAE_METHODS, "ste": {"epochs": 1, "batch_size": 50}},
    "measure": {"repair": "repair", "repair_samples": 100},
    "three": {"methods": ["wm"]},
}


def mae_the_train_stage_pretrains_maes_and_logs_their_test_reconstruction_loss(repo: Path, env: dict) -> None:
    ckpt = load_checkpoint(repo / "data" / "models" / "seed0.pt")
    assert ckpt.arch == "mae" and ckpt.config.decoder_width == 16 and ckpt.config.width == 16
    assert any(k.startswith("decoder_blocks.") for k in ckpt.state_dict)
    history = pd.read_parquet(repo / "data" / "history" / "seed0.parquet")
    assert history["test_loss"].notna().all() and history["test_acc"].isna().all()


def mae_every_method_permutes_the_encoder_and_decoder_heads(repo: Path, env: dict) -> None:
    ckpt = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    assert {"P_qk_0", "P_dec_qk_0"} <= set(get_arch("mae").permutation_spec(ckpt.config).heads)
    perms_fit(repo, "mae", MAE_METHODS, {"P_dec"})


def mae_measure_writes_reconstruction_curves_with_and_without_repair_and_the_probe_curves(repo: Path, env: dict):
    out = repo / "data" / "measure" / "seed0-seed1" / "wm"
    curve = pd.read_parquet(out / "curve.parquet")
    assert set(curve["repair"]) == {True, False} and curve["acc"].isna().all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ln_repair"] is True and not summary["bn_repair"]
    plain = curve[~curve["repair"] & (curve["split"] == "test")].set_index("lam")["loss"]
    assert summary["norepair_test_loss_mid"] == pytest.approx(plain[0.5])
    repaired = curve[curve["repair"] & (curve["split"] == "test")].set_index("lam")["loss"]
    assert repaired[1.0] == pytest.approx(plain[1.0], rel=1e-5)  # REPAIR leaves an endpoint as it is
    mae = pd.read_parquet(out / "mae.parquet")
    assert list(mae.columns) == ["lam", "probe_acc", "knn_acc", "masked_error", "visible_error"]
    assert mae["lam"].tolist() == sorted(curve["lam"].unique())
    assert all(0 <= v <= 1 for v in mae["probe_acc"]) and math.isfinite(summary["probe_acc_barrier_mid"])
    residual = pd.read_parquet(out / "residual.parquet")
    assert set(residual["block"]) == {"blocks.0"} and set(residual["lam"]) == {0.0, 0.5, 1.0}


def mae_the_merged_midpoint_and_the_three_model_edges_are_repaired_too(repo: Path, env: dict) -> None:
    """The merge stage writes REPAIR's θ(½) (the measure's repaired midpoint: the same loss); the
    connect stage measures every edge with and without REPAIR."""
    merged = repo / "data" / "merged" / "seed0-seed1" / "wm"
    mid, pi_b = (load_checkpoint(merged / f"{name}.pt").state_dict for name in ("midpoint", "permuted_b"))
    a = load_checkpoint(repo / "data" / "models" / "seed0.pt")
    plain = {k: (v + pi_b[k]) / 2 for k, v in a.state_dict.items()}
    assert any(not torch.allclose(mid[k], plain[k]) for k in plain)  # not the plain average
    curve = pd.read_parquet(repo / "data" / "measure" / "seed0-seed1" / "wm" / "curve.parquet")
    at = curve[curve["repair"] & (curve["split"] == "test") & (curve["lam"] == 0.5)]["loss"].item()
    test = load_split(repo / "data" / "prepared", "test")
    assert evaluate(build_model(a.arch, a.config), mid, test).loss == pytest.approx(at, rel=1e-5)
    where = repo / "data" / "connect" / "seed0-seed1-seed2" / "wm"
    edges = json.loads((where / "edges.json").read_text())["edges"]
    assert all(e["ln_repair"] and "norepair_test_loss_barrier_max" in e for e in edges)
    assert set(pd.read_parquet(where / "curves.parquet")["repair"]) == {True, False}


def mae_the_report_says_the_barriers_are_repaired_and_shows_them_without(repo: Path, env: dict) -> None:
    report = (repo / "reports" / "report.md").read_text()
    assert "measured with REPAIR at every λ" in report
    assert (repo / "data" / "merge_many").is_dir()


# ---------------------------------------------------------------- model.arch traced: a network from the repository

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

TRACED = {
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
    "measure": {"repair": "auto", "repair_samples": 100},  # bn: the traced resnet has BatchNorm
}


def traced_nets(repo: Path) -> dict:
    (repo / "nets").mkdir()
    (repo / "nets" / "small.py").write_text(NETS)
    return {}


def traced_every_method_aligns_the_traced_network(repo: Path, env: dict) -> None:
    """A residual stream, a concatenation and a flatten of a 2 × 2 map into blocks: trained, aligned by every
    method on its traced spec, merged and measured."""
    headline = json.loads((repo / "metrics" / "headline.json").read_text())
    assert {"identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"} <= set(headline)
    assert headline["identity"]["L2_red"] == 0
    assert all(headline[m]["L2_red"] > 0 for m in ("wm", "wm_sinkhorn"))  # they moved θb on the traced spec
    summary = json.loads((repo / "data" / "measure" / "seed0-seed1" / "wm" / "summary.json").read_text())
    assert summary["bn_repair"] is True and summary["l2_after"] < summary["l2_before"]


VISION_CASES = {  # name: architecture-data kind
    "vit-mnist5k": Case(
        VIT, (vit_every_method_aligns_the_vits_with_headed_permutations, vit_three_models_and_the_report_cover_the_vit)
    ),
    "mae-mnist5k": Case(
        MAE,
        (
            mae_the_train_stage_pretrains_maes_and_logs_their_test_reconstruction_loss,
            mae_every_method_permutes_the_encoder_and_decoder_heads,
            mae_measure_writes_reconstruction_curves_with_and_without_repair_and_the_probe_curves,
            mae_the_merged_midpoint_and_the_three_model_edges_are_repaired_too,
            mae_the_report_says_the_barriers_are_repaired_and_shows_them_without,
        ),
    ),
    "traced-mnist5k": Case(TRACED, (traced_every_method_aligns_the_traced_network,), traced_nets),
}
