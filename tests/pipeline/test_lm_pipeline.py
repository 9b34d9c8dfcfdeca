"""A language model (model.arch gpt, train.objective lm) through the whole DAG by a real ``dvc repro``, on a corpus
of text files given as ``data.name: text`` and tokenised as bytes, with REPAIR and the train curves on a subset:
next-token checkpoints, every method's alignment of the residual stream, heads and MLP units, the perplexity
curves and barriers with and without REPAIR, the per-layer R_γ shares, three models, n models and the report."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest
import torch
from dvc_repo import TINY, deep_update, make_repo
from dvc_repo import run as _run

from lmclab.archs import get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.spec import check_permutation
from lmclab.studies.layer_alignment import gpt_role, pooled_alignment

pytestmark = pytest.mark.slow  # ~3 min: a dozen python processes each importing torch

METHODS = ["identity", "wm", "am", "wm_sinkhorn", "ste_sinkhorn"]
LM = {
    "data": {"name": "text", "root": "corpus", "context": 16, "max_train": None, "max_test": None},
    "model": {"arch": "gpt", "gpt": {"width": 16, "depth": 1, "heads": 2, "mlp_ratio": 2}},
    "train": {"objective": "lm", "batch_size": 32, "epochs": 1},
    "permute": {
        "methods": METHODS,
        "am": {"max_samples": 64},
        "wm_sinkhorn": {"epochs": 2, "iterations": 2},
        "ste_sinkhorn": {"epochs": 1, "batch_size": 64},
    },
    "measure": {"repair": True, "repair_samples": 16, "train_samples": 40, "num_lambdas": 3},
    "three": {"methods": ["wm"]},
    "merge_many": {"methods": ["merge_many"], "repair_samples": 16},
}
WORDS = "the merged model keeps what both endpoints computed when their units are aligned".split()  # noqa: SIM905


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("lm_pipeline"), deep_update(copy.deepcopy(TINY), LM))
    corpus = repo / "corpus"
    corpus.mkdir()
    for i in range(12):  # twelve documents split by files: about a tenth of the bytes held out
        (corpus / f"doc{i:02d}.txt").write_text(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(400)))
    _run(repo, "dvc", "repro")
    return repo


def test_the_corpus_is_split_by_files_and_trains_next_token_models(repo):
    meta = json.loads((repo / "data" / "prepared" / "meta.json").read_text())
    assert (meta["name"], meta["tokenizer"], meta["num_classes"], meta["input_shape"]) == ("text", "bytes", 256, [16])
    assert sum(meta["documents"].values()) == 12 and meta["documents"]["test"] >= 1
    ckpt = load_checkpoint(repo / "data" / "models" / "seed0.pt")
    assert ckpt.arch == "gpt" and ckpt.config.num_classes == 256
    history = pd.read_parquet(repo / "data" / "history" / "seed0.parquet")
    assert history["test_loss"].notna().all() and (history["test_acc"] > 0).all()  # next-token accuracy


def test_every_method_aligns_the_stream_heads_and_mlp_units(repo):
    ckpt = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    spec = get_arch("gpt").permutation_spec(ckpt.config)
    for method in METHODS:
        perm = torch.load(repo / "data" / "perms" / "seed0-seed1" / method / "perm.pt", weights_only=True)
        check_permutation(perm, spec.group_sizes(ckpt.state_dict), spec.heads)
        assert {"P_res", "P_mlp_0", "P_qk_0", "P_vo_0"} <= set(perm)


def test_measure_writes_perplexity_barriers_with_and_without_repair_and_layer_shares(repo):
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


def test_the_report_has_the_perplexity_table_and_the_tables_the_layer_shares(repo):
    report = (repo / "reports" / "report.md").read_text()
    assert "## Perplexity barriers (language model)" in report and "| method | ppl B½ REPAIR |" in report
    assert "| seed | epochs | train loss | test loss | test token acc % | test ppl |" in report
    assert "### R_0.3 by layer family" in report and "`blocks.*.attn.q.weight`" in report
    layers = pd.read_parquet(repo / "data" / "tables" / "alignment.parquet")
    assert set(layers["method"]) == set(METHODS) and set(layers["gamma"]) == {0.0, 0.3}
    edges = json.loads((repo / "data" / "connect" / "seed0-seed1-seed2" / "wm" / "edges.json").read_text())
    assert all(math.isfinite(e["test_loss_barrier_max"]) for e in edges["edges"])
    assert (repo / "reports" / "detail" / "merge_many.json").is_file()
