"""Theorem 3.1: exact on a quadratic loss; HVP and slopes against finite differences."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from lmclab.analysis.taylor import (
    TaylorTerms,
    directional_terms,
    gradient_and_hvp,
    split_loss_fns,
    taylor_barrier,
    taylor_curve,
    taylor_terms,
)
from lmclab.archs import build_model, make_config
from lmclab.core.data import Split


def _flat(params):
    return torch.cat([v.reshape(-1) for v in params.values()])


def test_quadratic_loss_taylor_is_exact_on_the_whole_grid():
    g = torch.Generator().manual_seed(0)
    shapes = {"w": (4, 3), "b": (4,)}
    n = 16
    m = torch.randn(n, n, generator=g, dtype=torch.float64)
    hess = m + m.T  # indefinite on purpose: the identity does not need convexity
    lin = torch.randn(n, generator=g, dtype=torch.float64)

    def loss(params):
        theta = _flat(params)
        return 0.5 * theta @ hess @ theta + lin @ theta + 3.0

    rand = lambda: {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}  # noqa: E731
    params_a, params_b = rand(), rand()
    diff = {k: params_b[k] - params_a[k] for k in shapes}
    delta = float(_flat(diff).norm())
    unit = {k: v / delta for k, v in diff.items()}
    slope_a, curv_a = directional_terms(loss, params_a, unit)
    slope_b, curv_b = directional_terms(loss, params_b, unit)
    terms = TaylorTerms(delta, slope_a, slope_b, curv_a, curv_b)
    lams = [i / 10 for i in range(11)]
    for lam, estimate in zip(lams, taylor_curve(terms, lams), strict=True):
        mid = {k: lam * params_a[k] + (1 - lam) * params_b[k] for k in shapes}
        real = float(loss(mid) - lam * loss(params_a) - (1 - lam) * loss(params_b))
        assert abs(estimate - real) < 1e-9 * max(1.0, abs(real))
    assert (
        abs(taylor_barrier(terms, 0.5) - (0.25 * delta * (slope_a - slope_b) + delta**2 / 16 * (curv_a + curv_b)))
        < 1e-12
    )


def test_cubic_loss_weights_each_hessian_by_the_other_endpoints_share():
    """H_a ≠ H_b: L(w) = w³ with θa = 1, θb' = 0, so f(λ) = L(θ(λ)) = λ³. By hand: δ = 1, Δ = −1,
    Δᵀg_a = −3, Δᵀg_b = 0, ΔᵀH_aΔ = 6, ΔᵀH_bΔ = 0, and Theorem 3.1 gives
    B(λ) ≈ λ(1−λ)[−3 + ½ · 6(1−λ)] = −3λ²(1−λ): −9/64 at λ = ¼ and −27/64 at λ = ¾
    (the weights swapped, λH_a + (1−λ)H_b, would give −27/64 and −9/64)."""

    def loss(params):
        return (params["w"] ** 3).sum()

    point = lambda w: {"w": torch.tensor([w], dtype=torch.float64)}  # noqa: E731
    params_a, params_b, unit = point(1.0), point(0.0), point(-1.0)
    slope_a, curv_a = directional_terms(loss, params_a, unit)
    slope_b, curv_b = directional_terms(loss, params_b, unit)
    assert (slope_a, curv_a, slope_b, curv_b) == (-3.0, 6.0, 0.0, 0.0)
    terms = TaylorTerms(1.0, slope_a, slope_b, curv_a, curv_b)
    assert taylor_curve(terms, [0.0, 0.25, 0.5, 0.75, 1.0]) == pytest.approx(
        [0.0, -9 / 64, -3 / 8, -27 / 64, 0.0], abs=1e-15
    )


def _tiny_mlp_problem(seed=0):
    config = make_config("mlp", input_shape=(1, 3, 3), num_classes=4, hidden=2, width=6)
    model = build_model("mlp", config, seed=seed).double()
    g = torch.Generator().manual_seed(seed + 10)
    split = Split(torch.randn(40, 1, 3, 3, generator=g, dtype=torch.float64), torch.randint(0, 4, (40,), generator=g))
    params_a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params_b = {
        k: v.detach() + 0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in model.state_dict().items()
    }
    return model, split, params_a, params_b


def test_hvp_matches_finite_differences_of_the_gradient():
    model, split, params, other = _tiny_mlp_problem()
    [(_, loss_fn)] = split_loss_fns(model, split, batch_size=len(split))
    direction = {k: other[k] - params[k] for k in params}
    gradient, hvp = gradient_and_hvp(loss_fn, params, direction)
    eps = 1e-5
    shifted = lambda s: {k: params[k] + s * eps * direction[k] for k in params}  # noqa: E731
    g_plus, g_minus = grad(loss_fn)(shifted(1)), grad(loss_fn)(shifted(-1))
    for k in params:
        fd = (g_plus[k] - g_minus[k]) / (2 * eps)
        assert torch.allclose(hvp[k], fd, atol=1e-6, rtol=1e-5), k
        assert torch.allclose(gradient[k], grad(loss_fn)(params)[k])
    slope = float(sum((gradient[k] * direction[k]).sum() for k in params))
    fd_slope = float(loss_fn(shifted(1)) - loss_fn(shifted(-1))) / (2 * eps)
    assert abs(slope - fd_slope) < 1e-6


def test_taylor_terms_do_not_depend_on_batching():
    model, split, params_a, params_b = _tiny_mlp_problem(1)
    whole = taylor_terms(model, params_a, params_b, split, batch_size=len(split))
    batched = taylor_terms(model, params_a, params_b, split, batch_size=7)
    assert all(abs(x - y) < 1e-10 for x, y in zip(whole, batched, strict=True))
    assert abs(whole.delta - float(torch.cat([(params_b[k] - params_a[k]).flatten() for k in params_a]).norm())) < 1e-12


def test_taylor_terms_are_the_eval_mode_derivatives_along_the_line_at_each_endpoint():
    """Central finite differences of the eval-mode mean loss along Δ, at θa and at θb' separately,
    on a net with BatchNorm (running statistics held at each endpoint's own values)."""
    with torch.random.fork_rng():  # the initial weights do not depend on which tests ran before
        torch.manual_seed(3)
        model = nn.Sequential(nn.Flatten(), nn.Linear(9, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 4)).double()
    g = torch.Generator().manual_seed(3)

    def noisy(params, scale):  # running variances stay positive
        out = {
            k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v
            for k, v in params.items()
        }
        return {k: v.abs() if k.endswith("running_var") else v for k, v in out.items()}

    params_a = noisy(model.state_dict(), 0.5)
    params_b = noisy(params_a, 0.3)
    split = Split(torch.randn(30, 1, 3, 3, generator=g, dtype=torch.float64), torch.randint(0, 4, (30,), generator=g))
    terms = taylor_terms(model, params_a, params_b, split, batch_size=7)
    names = [name for name, _ in model.named_parameters()]
    unit = {k: (params_b[k] - params_a[k]) / terms.delta for k in names}
    model.eval()

    def along(params, t):  # the eval-mode mean loss at params + t Δ
        moved = {**params, **{k: params[k] + t * unit[k] for k in names}}
        return float(F.cross_entropy(functional_call(model, moved, (split.x,)), split.y))

    h = 1e-4
    for params, slope, curvature in (
        (params_a, terms.slope_a, terms.curvature_a),
        (params_b, terms.slope_b, terms.curvature_b),
    ):
        signs = [  # the premise of a finite difference: no ReLU input changes sign inside the window
            functional_call(model[:3], {k: v + t * unit.get(k, 0) for k, v in params.items() if k[0] in "12"}, split.x)
            > 0
            for t in (-h, h)
        ]
        assert torch.equal(*signs)
        plus, zero, minus = along(params, h), along(params, 0.0), along(params, -h)
        assert slope == pytest.approx((plus - minus) / (2 * h), rel=1e-6, abs=1e-9)
        assert curvature == pytest.approx((plus - 2 * zero + minus) / h**2, rel=1e-4, abs=1e-6)
    assert terms.slope_a != pytest.approx(terms.slope_b, rel=0.1)  # the two endpoints are told apart


def test_the_batch_losses_read_their_batches_on_the_device_asked_for():
    """``meta`` stands in for a GPU: the losses of a split held on the CPU evaluate on meta parameters."""
    model, split, params, _ = _tiny_mlp_problem()
    on_meta = {k: v.to("meta") for k, v in params.items()}
    losses = split_loss_fns(model, split, batch_size=16, device=torch.device("meta"))
    assert [w for w, _ in losses] == [0.4, 0.4, 0.2] and all(fn(on_meta).is_meta for _, fn in losses)


def test_taylor_terms_evaluate_the_batches_where_theta_a_lives(monkeypatch):
    """Where the batches go is the parameters' device (a GPU's, for parameters there): recorded on the CPU."""
    import lmclab.analysis.taylor as taylor

    model, split, params_a, params_b = _tiny_mlp_problem()
    asked = []

    def recording(*args, device, **kwargs):
        asked.append(device)
        return split_loss_fns(*args, device=device, **kwargs)

    monkeypatch.setattr(taylor, "split_loss_fns", recording)
    assert taylor_terms(model, params_a, params_b, split).delta > 0 and asked == [torch.device("cpu")]


def test_identical_endpoints_have_zero_taylor_barrier():
    model, split, params_a, _ = _tiny_mlp_problem()
    terms = taylor_terms(model, params_a, params_a, split)
    assert terms.delta == 0 and taylor_barrier(terms, 0.5) == 0
