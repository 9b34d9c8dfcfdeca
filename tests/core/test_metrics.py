"""Barriers, L2 distances and interpolation curves: closed forms and hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmclab.archs import build_model, get_arch
from lmclab.core.data import Split
from lmclab.core.interpolation import barriers_from_curve, interpolation_curve, measure_pair
from lmclab.core.merge import aligned_midpoint, lerp_params
from lmclab.core.metrics import barrier, l2_distance, lambda_grid, midpoint_barrier, reduction_rate
from lmclab.core.spec import build_spec, identity_permutation
from lmclab.core.spec_builders import dense


def test_lambda_grid_contains_endpoints_and_half() -> None:
    assert lambda_grid(25)[0] == 0.0 and lambda_grid(25)[-1] == 1.0 and 0.5 in lambda_grid(25)
    assert len(lambda_grid(25)) == 25 and len(lambda_grid(4)) == 5 and 0.5 in lambda_grid(4)
    with pytest.raises(ValueError, match="^num_lambdas must be at least 2"):
        lambda_grid(1)


def test_barrier_closed_forms() -> None:
    lams = [0.0, 0.25, 0.5, 0.75, 1.0]
    # loss 1 at θb (λ=0), 3 at θa (λ=1): the line is 1 + 2λ; bump of 0.5 at λ = ½
    loss = [1.0, 1.5, 2.5, 2.5, 3.0]
    assert barrier(lams, loss) == pytest.approx(0.5)
    assert midpoint_barrier(2.5, 3.0, 1.0) == pytest.approx(0.5)
    assert barrier(lams, [1.0, 1.2, 1.4, 1.6, 3.0]) == pytest.approx(0.0)  # below the line: 0 on a grid
    assert midpoint_barrier(1.4, 3.0, 1.0) == pytest.approx(-0.6)  # the midpoint version can be negative
    acc = [90.0, 80.0, 70.0, 85.0, 94.0]  # line 90 + 4λ; at ½ it is 92, drop 22
    assert barrier(lams, acc, higher_is_better=True) == pytest.approx(22.0)
    assert midpoint_barrier(70.0, 94.0, 90.0, higher_is_better=True) == pytest.approx(22.0)


def test_l2_distance_excludes_running_stats_and_reduction() -> None:
    spec = build_spec(dense("l", "P", None, bias=False), {"bn.running_mean": ("P",)})
    a = {"l.weight": torch.zeros(2, 2), "bn.running_mean": torch.zeros(2)}
    b = {"l.weight": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "bn.running_mean": torch.full((2,), 100.0)}
    assert l2_distance(spec, a, b) == pytest.approx(5.0)
    assert reduction_rate(10.0, 8.0) == pytest.approx(20.0)


def test_interpolate_endpoints_and_merge_midpoint() -> None:
    spec = build_spec(dense("l", "P", None))
    a = {"l.weight": torch.ones(3, 2), "l.bias": torch.zeros(3)}
    b = {"l.weight": 3 * torch.ones(3, 2), "l.bias": torch.ones(3)}
    assert torch.equal(lerp_params(a, b, 1.0)["l.weight"], a["l.weight"])
    assert torch.equal(lerp_params(a, b, 0.0)["l.weight"], b["l.weight"])
    permuted_b, mid = aligned_midpoint(spec, a, b, identity_permutation({"P": 3}))
    assert torch.equal(permuted_b["l.weight"], b["l.weight"])
    assert torch.equal(mid["l.weight"], 2 * torch.ones(3, 2)) and torch.equal(mid["l.bias"], torch.full((3,), 0.5))
    # a real permutation: the midpoint is (θa + π(θb)) / 2, not (θa + θb) / 2
    b = {"l.weight": torch.arange(6.0).reshape(3, 2), "l.bias": torch.tensor([0.0, 2.0, 4.0])}
    permuted_b, mid = aligned_midpoint(spec, a, b, {"P": torch.tensor([2, 0, 1])})
    assert torch.equal(permuted_b["l.bias"], torch.tensor([4.0, 0.0, 2.0]))
    assert torch.equal(mid["l.weight"], (a["l.weight"] + b["l.weight"][[2, 0, 1]]) / 2)
    assert torch.equal(mid["l.bias"], torch.tensor([2.0, 0.0, 1.0]))


def test_barrier_of_a_model_with_itself_is_zero(trained, splits) -> None:
    ckpt = trained(0)
    spec = get_arch("mlp").permutation_spec(ckpt.config)
    model = build_model("mlp", ckpt.config)
    curve, summary = measure_pair(
        spec, model, ckpt.state_dict, ckpt.state_dict, ckpt.state_dict, lambda_grid(5), {"test": splits["test"]}
    )
    for key in ("loss", "acc"):
        assert summary[f"test_{key}_barrier_max"] == pytest.approx(0.0, abs=1e-5)
        assert summary[f"test_{key}_barrier_mid"] == pytest.approx(0.0, abs=1e-5)
    assert summary["l2_before"] == 0.0 and summary["l2_reduction_pct"] == 0.0
    assert len(curve) == 5


class _Scalar(nn.Module):
    """logits = [w·x, 0]: a model whose loss along the path is computable by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.w * x[:, 0]
        return torch.stack([z, torch.zeros_like(z)], 1)


def test_hand_computed_curve_on_a_tiny_model() -> None:
    # one sample x=1, label 0: loss(w) = log(1 + e^{-w}); θa: w=2, θb: w=-3, so w(λ) = 5λ - 3
    data = Split(x=torch.ones(1, 1), y=torch.zeros(1, dtype=torch.long))
    rows = interpolation_curve(
        _Scalar(), {"w": torch.tensor([2.0])}, {"w": torch.tensor([-3.0])}, [0.0, 0.5, 1.0], {"test": data}
    )
    expected = {lam: math.log1p(math.exp(-(5 * lam - 3))) for lam in (0.0, 0.5, 1.0)}
    for r in rows:
        assert r["loss"] == pytest.approx(expected[r["lam"]], rel=1e-6)
    assert [r["acc"] for r in rows] == [0.0, 0.0, 1.0]  # w(½) = -0.5: wrong
    out = barriers_from_curve(rows)
    line_mid = (expected[0.0] + expected[1.0]) / 2
    assert out["test_loss_barrier_mid"] == pytest.approx(expected[0.5] - line_mid, rel=1e-6)
    assert out["test_acc_barrier_mid"] == pytest.approx(50.0)
    assert not any("ppl" in k for k in out) and "ppl" not in rows[0]  # labels per sample: no perplexity


class _ScalarPerPosition(nn.Module):
    """``_Scalar`` at each of a window's 2 positions: logits ``(batch, 2, 2)``, position 1 scaled by 2."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.w * x  # (batch, 2)
        return torch.stack([z, torch.zeros_like(z)], -1)


def test_targets_per_position_add_the_perplexity_and_its_barriers() -> None:
    """A window of two positions (inputs 1 and 2, both of target 0), θa: w=2, θb: w=−3: the loss is the mean
    of the two positions' cross-entropies and the perplexity its exp; the perplexity barriers are those of
    exp(loss) (a curve that is not exp of the loss barriers)."""
    data = Split(x=torch.tensor([[1.0, 2.0]]), y=torch.zeros(1, 2, dtype=torch.long))
    lams = [0.0, 0.25, 0.5, 0.75, 1.0]
    rows = interpolation_curve(
        _ScalarPerPosition(), {"w": torch.tensor([2.0])}, {"w": torch.tensor([-3.0])}, lams, {"test": data}
    )
    loss = {lam: (math.log1p(math.exp(-(5 * lam - 3))) + math.log1p(math.exp(-2 * (5 * lam - 3)))) / 2 for lam in lams}
    for r in rows:
        assert r["loss"] == pytest.approx(loss[r["lam"]], rel=1e-6)
        assert r["ppl"] == pytest.approx(math.exp(loss[r["lam"]]), rel=1e-6)
    out = barriers_from_curve(rows)
    ppl = {lam: math.exp(v) for lam, v in loss.items()}
    assert out["test_ppl_barrier_mid"] == pytest.approx(ppl[0.5] - (ppl[0.0] + ppl[1.0]) / 2, rel=1e-6)
    line = {lam: lam * ppl[1.0] + (1 - lam) * ppl[0.0] for lam in lams}
    assert out["test_ppl_barrier_max"] == pytest.approx(max(ppl[lam] - line[lam] for lam in lams), rel=1e-6)
    assert (out["test_ppl_a"], out["test_ppl_b"]) == (pytest.approx(ppl[1.0]), pytest.approx(ppl[0.0]))
    assert out["test_ppl_barrier_mid"] != pytest.approx(math.exp(out["test_loss_barrier_mid"]))
