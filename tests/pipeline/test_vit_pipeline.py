"""A Vision Transformer through the whole DAG by a real ``dvc repro`` on the offline digits: every
method that searches attention heads, the merged models, the curves, three models and the report."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from dvc_repo import TINY, deep_update, make_repo
from dvc_repo import run as _run

from lmclab.archs import get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.spec import check_permutation

pytestmark = pytest.mark.slow  # ~2 min: a dozen python processes each importing torch

METHODS = ["identity", "wm", "am", "ste"]
VIT = {
    "model": {"arch": "vit", "vit": {"patch_size": 7, "width": 16, "heads": 2, "depth": 1}},
    "permute": {"methods": METHODS, "ste": {"epochs": 1, "batch_size": 50}},
    "three": {"methods": ["wm", "ste"]},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("vit_pipeline"), deep_update(copy.deepcopy(TINY), VIT))
    _run(repo, "dvc", "repro")
    return repo


def test_every_method_aligns_the_vits_with_headed_permutations(repo):
    model = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    spec = get_arch("vit").permutation_spec(model.config)
    assert spec.heads and {"P_qk_0", "P_vo_0"} <= set(spec.heads)
    sizes = spec.group_sizes(model.state_dict)
    for method in METHODS:
        perm = torch.load(repo / "data" / "perms" / "seed0-seed1" / method / "perm.pt", weights_only=True)
        check_permutation(perm, sizes, spec.heads)
    pairs = pd.read_parquet(repo / "data" / "tables" / "pairs.parquet")
    assert set(pairs["method"]) == set(METHODS)
    l2 = pairs.set_index("method")["l2_after"]
    assert (l2[["wm", "am", "ste"]] < l2["identity"]).all()  # each alignment brings θb closer to θa


def test_three_models_and_the_report_cover_the_vit(repo):
    for method in ("wm", "ste"):
        assert (repo / "data" / "connect" / "seed0-seed1-seed2" / method).is_dir()
    report = (repo / "reports" / "report.md").read_text()
    assert all(f"| {row} |" in report for row in ("WM (re-basin)", "AM", "STE (re-basin)"))
