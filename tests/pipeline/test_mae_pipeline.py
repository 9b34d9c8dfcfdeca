"""Masked-autoencoder pretraining (train.objective: mae) through the whole DAG by a real ``dvc repro`` on
the offline digits, with REPAIR (measure.repair): MAE checkpoints, headed permutations of the encoder's
and the decoder's groups, the reconstruction curves with and without REPAIR, the probe/kNN curves, the
report."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest
import torch
from dvc_repo import TINY, deep_update, make_repo
from dvc_repo import run as _run

from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.evaluate import evaluate
from lmclab.core.spec import check_permutation

pytestmark = pytest.mark.slow  # ~3 min: a dozen python processes each importing torch

METHODS = ["identity", "wm", "am", "ste"]
MAE = {
    "model": {"arch": "vit", "vit": {"patch_size": 7, "width": 16, "heads": 2, "depth": 1}},
    "train": {"objective": "mae", "mae": {"decoder_width": 16, "decoder_depth": 1, "decoder_heads": 2}},
    "permute": {"methods": METHODS, "ste": {"epochs": 1, "batch_size": 50}},
    "measure": {"repair": True, "repair_samples": 100},
    "three": {"methods": ["wm"]},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("mae_pipeline"), deep_update(copy.deepcopy(TINY), MAE))
    _run(repo, "dvc", "repro")
    return repo


def test_the_train_stage_pretrains_maes_and_logs_their_test_reconstruction_loss(repo):
    ckpt = load_checkpoint(repo / "data" / "models" / "seed0.pt")
    assert ckpt.arch == "mae" and ckpt.config.decoder_width == 16 and ckpt.config.width == 16
    assert any(k.startswith("decoder_blocks.") for k in ckpt.state_dict)
    history = pd.read_parquet(repo / "data" / "history" / "seed0.parquet")
    assert history["test_loss"].notna().all() and history["test_acc"].isna().all()


def test_every_method_permutes_the_encoder_and_decoder_heads(repo):
    ckpt = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    spec = get_arch("mae").permutation_spec(ckpt.config)
    assert {"P_qk_0", "P_dec_qk_0"} <= set(spec.heads)
    for method in METHODS:
        perm = torch.load(repo / "data" / "perms" / "seed0-seed1" / method / "perm.pt", weights_only=True)
        check_permutation(perm, spec.group_sizes(ckpt.state_dict), spec.heads)
        assert "P_dec" in perm


def test_measure_writes_reconstruction_curves_with_and_without_repair_and_the_probe_curves(repo):
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


def test_the_merged_midpoint_and_the_three_model_edges_are_repaired_too(repo):
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


def test_the_report_says_the_barriers_are_repaired_and_shows_them_without(repo):
    report = (repo / "reports" / "report.md").read_text()
    assert "measured with REPAIR at every λ" in report
    assert (repo / "data" / "merge_many").is_dir()
