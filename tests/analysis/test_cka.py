"""Linear CKA: closed-form invariances, independence, both formulas, and the layer rows of an
aligned pair (CKA is blind to the permutation itself; the merged midpoint is not)."""

from __future__ import annotations

import math

import pytest
import torch

from lmclab.analysis.cka import PAIRS, cka_rows, hidden_layers, linear_cka
from lmclab.archs import build_model, get_arch
from lmclab.core.merge import lerp_params
from lmclab.core.spec import apply_permutation
from lmclab.search.weight_matching import weight_matching


def features(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_cka_of_a_representation_with_itself_rotated_scaled_and_shifted_is_one():
    x = features(300, 40, 0)
    rotation, _ = torch.linalg.qr(features(40, 40, 1))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, 3.7 * x @ rotation + 5.0) == pytest.approx(1.0, abs=1e-12)  # orthogonal, isotropic, offset
    assert linear_cka(x, x * torch.linspace(0.1, 3, 40, dtype=torch.float64)) < 0.99  # anisotropic scaling is not


def test_cka_of_independent_random_features_is_near_zero():
    assert linear_cka(features(4000, 20, 2), features(4000, 20, 3)) < 0.02


def test_the_feature_and_sample_formulas_agree():
    x, y = features(50, 30, 4), features(50, 30, 5) + 0.5 * features(50, 30, 4)
    narrow = linear_cka(x, y)  # 60 features ≤ 2 × 50 samples: the feature-space formula
    wide = linear_cka(torch.cat([x, torch.zeros(50, 100, dtype=torch.float64)], 1), y)  # the Gram formula
    assert narrow == pytest.approx(wide, rel=1e-10) and 0.1 < narrow < 0.9
    assert math.isnan(linear_cka(torch.ones(5, 3), features(5, 3, 6)))


def test_layer_rows_of_an_aligned_pair(trained, splits):
    a, b = trained(0), trained(1)
    spec = get_arch(a.arch).permutation_spec(a.config)
    model = build_model(a.arch, a.config)
    perm = weight_matching(spec, a.state_dict, b.state_dict).perm
    pi_b = apply_permutation(spec, perm, b.state_dict)
    models = {"a": a.state_dict, "b": b.state_dict, "pi_b": pi_b, "mid": lerp_params(a.state_dict, pi_b, 0.5)}
    rows = cka_rows(spec, model, models, splits["test"])
    layers = hidden_layers(spec, model)
    assert layers == [f"layers.{i}" for i in range(a.config.hidden)]
    assert [(r["layer"], r["pair"]) for r in rows] == [(n, f"{x}-{y}") for n in layers for x, y in PAIRS]
    by = {(r["layer"], r["pair"]): r["cka"] for r in rows}
    for name in layers:
        assert by[name, "a-b"] == pytest.approx(by[name, "a-pi_b"], rel=1e-6)  # blind to the permutation (float32 sums)
        assert 0 < by[name, "a-b"] < 1 and 0 < by[name, "a-mid"] <= 1
