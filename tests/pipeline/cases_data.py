"""The pipeline cases that bring their own data: a language model on text files, ResNet20 on CIFAR-10 files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from cifar_fixture import write_cifar10, write_sitecustomize
from pipeline_cases import Case, perms_fit

from lmclab.archs.checkpoint import load_checkpoint
from lmclab.studies.layer_alignment import gpt_role, pooled_alignment

# ---------------------------------------------------------------- a language model on a corpus of text files

LM_METHODS = ["identity", "wm", "am", "wm_sinkhorn", "ste_sinkhorn"]
LM = {
    "data": {"name": "text", "root": "corpus", "context": 16, "max_train": None, "max_test": None},
    "model": {"arch": "gpt", "gpt": {"width": 16, "depth": 1, "heads": 2, "mlp_ratio": 2}},
    "train": {"objective": "lm", "batch_size": 32, "epochs": 1},
    "permute": {
        "methods": LM_METHODS,
        "am": {"max_samples": 64},
        "wm_sinkhorn": {"epochs": 2, "iterations": 2},
        "ste_sinkhorn": {"epochs": 1, "batch_size": 64},
    },
    "measure": {"repair": "repair", "repair_samples": 16, "train_samples": 40, "num_lambdas": 3},
    "three": {"methods": ["wm"]},
    "merge_many": {"methods": ["merge_many"], "repair_samples": 16},
}
WORDS = "the merged model keeps what both endpoints computed when their units are aligned".split()  # noqa: SIM905


def lm_corpus(repo: Path) -> dict:
    corpus = repo / "corpus"
    corpus.mkdir()
    for i in range(12):  # twelve documents split by files: about a tenth of the bytes held out
        (corpus / f"doc{i:02d}.txt").write_text(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(400)))
    return {}


def lm_the_corpus_is_split_by_files_and_trains_next_token_models(repo: Path, env: dict) -> None:
    meta = json.loads((repo / "data" / "prepared" / "meta.json").read_text())
    assert (meta["name"], meta["tokenizer"], meta["num_classes"], meta["input_shape"]) == ("text", "bytes", 256, [16])
    assert sum(meta["documents"].values()) == 12 and meta["documents"]["test"] >= 1
    ckpt = load_checkpoint(repo / "data" / "models" / "seed0.pt")
    assert ckpt.arch == "gpt" and ckpt.config.num_classes == 256
    history = pd.read_parquet(repo / "data" / "history" / "seed0.parquet")
    assert history["test_loss"].notna().all() and (history["test_acc"] > 0).all()  # next-token accuracy


def lm_every_method_aligns_the_stream_heads_and_mlp_units(repo: Path, env: dict) -> None:
    perms_fit(repo, "gpt", LM_METHODS, {"P_res", "P_mlp_0", "P_qk_0", "P_vo_0"})


def lm_measure_writes_perplexity_barriers_with_and_without_repair_and_layer_shares(repo: Path, env: dict) -> None:
    out = repo / "data" / "measure" / "seed0-seed1" / "wm"
    curve = pd.read_parquet(out / "curve.parquet")
    assert set(curve["repair"]) == {True, False} and curve["ppl"].notna().all()
    assert curve["ppl"].to_numpy() == pytest.approx(curve["loss"].map(math.exp).to_numpy())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ln_repair"] is True
    for key in ("test_ppl_barrier_mid", "norepair_test_ppl_barrier_mid", "test_ppl_barrier_max"):
        assert math.isfinite(summary[key])
    shares = pd.read_parquet(out / "alignment.parquet").assign(pair="p", method="wm")
    whole = pooled_alignment(shares, 0.3, group=lambda _: "all")["R"].item()
    assert whole == pytest.approx(summary["R_0.3"], abs=1e-12)
    assert set(pooled_alignment(shares, 0.3, group=gpt_role)["part"]) == {"stream", "attention", "MLP"}


def lm_the_report_has_the_perplexity_table_and_the_tables_the_layer_shares(repo: Path, env: dict) -> None:
    report = (repo / "reports" / "report.md").read_text()
    assert "## Perplexity barriers (language model)" in report and "| method | ppl B½ REPAIR |" in report
    assert "| seed | epochs | train loss | test loss | test token acc % | test ppl |" in report
    assert "### R_0.3 by layer family" in report and "`blocks.*.attn.q.weight`" in report
    layers = pd.read_parquet(repo / "data" / "tables" / "alignment.parquet")
    assert set(layers["method"]) == set(LM_METHODS) and set(layers["gamma"]) == {0.0, 0.3}
    edges = json.loads((repo / "data" / "connect" / "seed0-seed1-seed2" / "wm" / "edges.json").read_text())
    assert all(math.isfinite(e["test_loss_barrier_max"]) for e in edges["edges"])
    assert (repo / "reports" / "detail" / "merge_many.json").is_file()


# ------------------------------------ the same language model aligned by orthogonal maps (permute.symmetry): its
# LayerNorm stream takes the maps that fix the all-ones vector (centred), the heads orthogonal maps inside

ORTHOGONAL_METHODS = ["identity", "wm", "am", "ste"]
LM_ORTHOGONAL = {
    **LM,
    "permute": {
        "methods": ORTHOGONAL_METHODS,
        "symmetry": "orthogonal",
        "am": {"max_samples": 64},
        "ste": {"epochs": 1, "batch_size": 64},
    },
}


def orthogonal_maps_rotate_the_stream_and_permute_the_mlp_units(repo: Path, env: dict) -> None:
    perms = repo / "data" / "perms" / "seed0-seed1"
    for method in ORTHOGONAL_METHODS:
        perm = torch.load(perms / method / "perm.pt", weights_only=True)
        matrices = {g for g, p in perm.items() if p.ndim == 2}
        mlp = [g for g, p in perm.items() if p.ndim == 1 and not torch.equal(p, torch.arange(len(p)))]
        if method == "identity":  # the identity of every group: index tensors in order
            assert not matrices and not mlp, method
            continue
        assert matrices and mlp, method  # the stream (and heads) rotated, the GELU MLP's units permuted
        eye = torch.eye(16, dtype=torch.float64)
        stream = next(p for p in perm.values() if p.ndim == 2 and p.shape == (16, 16))
        assert torch.allclose(stream.double() @ stream.double().T, eye, atol=1e-5), method
        assert not torch.allclose(stream.double().abs(), stream.double().abs().round(), atol=1e-3)  # no permutation


def orthogonal_merge_writes_canonical_forms_of_the_same_function(repo: Path, env: dict) -> None:
    from lmclab.archs import build_model
    from lmclab.core.data import load_split

    x = load_split(repo / "data" / "prepared", "test").x[:4]
    b = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    aligned = load_checkpoint(repo / "data" / "merged" / "seed0-seed1" / "wm" / "permuted_b.pt")
    assert b.config.tie_embeddings and not aligned.config.tie_embeddings  # the tied head untied, then folded
    logits = []
    for ckpt in (b, aligned):
        net = build_model(ckpt.arch, ckpt.config).eval()
        net.load_state_dict(ckpt.state_dict)
        logits.append(net(x).detach())
    assert torch.allclose(logits[0], logits[1], atol=1e-4)  # π(θb) computes θb's function
    gains = [v for k, v in aligned.state_dict.items() if "norm" in k and k.endswith(".weight")]
    assert gains and all(torch.equal(g, torch.ones_like(g)) for g in gains)  # folded into their readers
    rows = {
        m: json.loads((repo / "data" / "measure" / "seed0-seed1" / m / "summary.json").read_text())
        for m in ORTHOGONAL_METHODS
    }
    assert rows["identity"]["l2_reduction_pct"] == pytest.approx(0.0, abs=1e-9)
    assert rows["wm"]["l2_reduction_pct"] > 0 and math.isfinite(rows["ste"]["test_loss_barrier_mid"])
    edges = json.loads((repo / "data" / "connect" / "seed0-seed1-seed2" / "wm" / "edges.json").read_text())
    assert all(math.isfinite(e["test_loss_barrier_max"]) for e in edges["edges"])
    title = (repo / "reports" / "report.md").read_text().splitlines()[0]
    assert title.endswith(", aligned by orthogonal maps where the tracer proves them (permute.symmetry: orthogonal)")


# ---------------------------------------------------------------- ResNet20 ×¼ on CIFAR-10 files: BatchNorm repair

CONV = {
    "data": {"name": "cifar10", "max_train": None, "max_test": None},
    "model": {"arch": "resnet20", "resnet20": {"width_multiplier": 0.25}},
    "train": {"epochs": 2, "batch_size": 50, "lr": 0.003},
    "permute": {"methods": ["identity", "wm"]},
    "measure": {"num_lambdas": 3, "repair": "bn", "repair_samples": 60},
    "three": {"methods": ["wm"], "resolution": 2, "margin": 0.0},
    "merge_many": {"merge_many": {"max_iter": 2}, "repair": "bn"},  # a BatchNorm net
}


def cifar_files(repo: Path) -> dict:
    """CIFAR-10 in torchvision's format under data.root, accepted by the real class in the stages."""
    md5 = write_sitecustomize(repo / "sitecustomize", write_cifar10(repo / "data" / "raw"))
    return {"PYTHONPATH": str(repo / "sitecustomize"), "LMCLAB_CIFAR_MD5": str(md5), "OMP_NUM_THREADS": "1"}


def conv_repro_writes_repaired_and_stale_curves(repo: Path, env: dict) -> None:
    curves = pd.read_parquet(repo / "data" / "tables" / "curves.parquet")
    assert set(curves["repair"]) == {False, True}
    assert set(curves["method"]) == {"identity", "wm"} and set(curves["lam"]) == {0.0, 0.5, 1.0}
    pairs = pd.read_parquet(repo / "data" / "tables" / "pairs.parquet")
    assert pairs["bn_repair"].all() and "norepair_test_loss_barrier_mid" in pairs
    # the repaired endpoints are the trained ones up to their statistics: repair is not a no-op
    # at λ = ½ (stale statistics of two different nets), so the two curves differ there
    mid = curves[(curves["lam"] == 0.5) & (curves["split"] == "test")].groupby(["method", "repair"])["loss"].first()
    assert mid["wm", True] != mid["wm", False]
    report = (repo / "reports" / "report.md").read_text()
    assert "Without repair" in report and "interpolation.png" in report
    history = pd.read_parquet(repo / "data" / "tables" / "history.parquet")
    assert len(history) == 3 * 2 and history["lr"].notna().all()  # 3 seeds × 2 epochs


def conv_merged_model_has_repaired_statistics(repo: Path, env: dict) -> None:
    blob = lambda p: torch.load(p, weights_only=True)["state_dict"]  # noqa: E731
    a = blob(repo / "data" / "models" / "seed0.pt")
    merged = repo / "data" / "merged" / "seed0-seed1" / "wm"
    permuted_b, midpoint = blob(merged / "permuted_b.pt"), blob(merged / "midpoint.pt")
    key = "layer3.2.bn2.running_var"
    assert not torch.allclose(midpoint[key], (a[key] + permuted_b[key]) / 2)
    weight = "layer3.2.conv2.weight"
    assert torch.allclose(midpoint[weight], (a[weight] + permuted_b[weight]) / 2)


def conv_changing_repair_samples_reruns_only_downstream(repo: Path, env: dict) -> None:
    from lmclab.pipeline.preset import set_values

    params = repo / "params.yaml"
    params.write_text(set_values(params.read_text(), {"measure.repair_samples": 40}))
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=repo, env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "merge@" in status.stdout and "measure@" in status.stdout
    assert "train@" not in status.stdout and "permute@" not in status.stdout and "download" not in status.stdout


DATA_CASES = {  # name: architecture-data kind
    "gpt-text": Case(
        LM,
        (
            lm_the_corpus_is_split_by_files_and_trains_next_token_models,
            lm_every_method_aligns_the_stream_heads_and_mlp_units,
            lm_measure_writes_perplexity_barriers_with_and_without_repair_and_layer_shares,
            lm_the_report_has_the_perplexity_table_and_the_tables_the_layer_shares,
        ),
        lm_corpus,
    ),
    "gpt-text-orthogonal": Case(
        LM_ORTHOGONAL,
        (
            orthogonal_maps_rotate_the_stream_and_permute_the_mlp_units,
            orthogonal_merge_writes_canonical_forms_of_the_same_function,
        ),
        lm_corpus,
    ),
    "resnet20-cifar10": Case(
        CONV,
        (
            conv_repro_writes_repaired_and_stale_curves,
            conv_merged_model_has_repaired_statistics,
            conv_changing_repair_samples_reruns_only_downstream,  # last: it edits params.yaml
        ),
        cifar_files,
    ),
}
