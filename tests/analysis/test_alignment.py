"""R_γ (Theorem 4.1) and spectra (reshape and exact circular-convolution, Theorem F.1)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmclab.analysis.alignment import (
    alignment_r,
    check_gammas,
    circular_operator_blocks,
    layer_alignment,
    layer_names,
    layer_svd,
    model_factors,
    output_layer,
    output_scale,
    singular_values,
)
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.options import OptionError
from lmclab.core.spec import apply_permutation, build_spec, random_permutation
from lmclab.core.spec_builders import conv, dense, norm


def mlp_case(seed=0):
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=5, hidden=3, width=12)
    return get_arch("mlp").permutation_spec(config), dict(build_model("mlp", config, seed=seed).state_dict())


def conv_case(seed=0):
    """A conv net's spec (kernels, BatchNorm, a dense read-out) with random parameters."""
    spec = build_spec(
        conv("c0", "P_0", None), norm("bn0", "P_0"), conv("c1", "P_1", "P_0", bias=True), dense("fc", None, "P_1")
    )
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "c0.weight": (6, 3, 3, 3),
        "c1.weight": (5, 6, 3, 3),
        "c1.bias": (5,),
        "bn0.weight": (6,),
        "bn0.bias": (6,),
        "bn0.running_mean": (6,),
        "bn0.running_var": (6,),
        "fc.weight": (4, 5),
        "fc.bias": (4,),
    }
    params = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    params["bn0.num_batches_tracked"] = torch.tensor(3)
    return spec, params


CASES = {
    "mlp": (mlp_case, "reshape", None),
    "conv": (conv_case, "reshape", None),
    "conv_fft": (conv_case, "fft", {"c0.weight": (6, 6), "c1.weight": (6, 6)}),
}


def factors(params, spec, mode, sizes):
    return model_factors(params, layer_names(spec, params), mode=mode, input_sizes=sizes)


def noisy(params, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in params.items()}


def test_layers_are_the_two_dimensional_weights():
    spec, params = conv_case()
    assert layer_names(spec, params) == ["c0.weight", "c1.weight", "fc.weight"]
    assert output_layer(spec, layer_names(spec, params)) == "fc.weight"
    # the last of several layers whose output axis is not permuted
    spec = build_spec(dense("l0", None, None), dense("l1", "P", None), dense("out", None, "P"))
    assert output_layer(spec, ["l0.weight", "l1.weight", "out.weight"]) == "out.weight"


@pytest.mark.parametrize("case", sorted(CASES))
def test_r_of_a_model_with_itself_is_one(case):
    make, mode, sizes = CASES[case]
    spec, params = make()
    f = factors(params, spec, mode, sizes)
    for gamma in (0.0, 0.3, 0.7, 1.0):
        assert alignment_r(f, f, gamma) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("case", sorted(CASES))
def test_r_is_invariant_under_a_common_permutation_and_bounded(case):
    make, mode, sizes = CASES[case]
    spec, params_a = make(0)
    params_b = noisy(params_a, 0.5, 1)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(2))
    fa, fb = factors(params_a, spec, mode, sizes), factors(params_b, spec, mode, sizes)
    fpa = factors(apply_permutation(spec, perm, params_a), spec, mode, sizes)
    fpb = factors(apply_permutation(spec, perm, params_b), spec, mode, sizes)
    for gamma in (0.0, 0.3):
        r = alignment_r(fa, fb, gamma)
        assert 0.05 < r <= 1.0  # correlated pair: clearly positive
        assert alignment_r(fpa, fpb, gamma) == pytest.approx(r, abs=1e-10)
    # permuting only one side destroys the alignment; undoing it restores R = 1
    assert abs(alignment_r(fa, fpa, 0.0)) < 0.5
    assert alignment_r(fpa, factors(apply_permutation(spec, perm, params_a), spec, mode, sizes), 0.0) == pytest.approx(
        1.0
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_abs_r_at_most_one_on_random_pairs(case):
    make, mode, sizes = CASES[case]
    for seed in range(5):
        spec, params_a = make(seed)
        _, params_b = make(100 + seed)
        fa, fb = factors(params_a, spec, mode, sizes), factors(params_b, spec, mode, sizes)
        for gamma in (0.0, 0.1, 0.3, 0.6):
            assert abs(alignment_r(fa, fb, gamma)) <= 1.0 + 1e-12


def test_r_keeps_triplets_relative_to_the_largest_singular_value():
    """W_a = diag(10, 1), W_b = diag(10, −1): the second triplets are opposed. γ = 0.3 keeps s ≥ 3
    (0.3 × 10), only the first triplets, so R = 1; γ = 0 keeps both, R = (1 − 1)/2 = 0."""
    diag = lambda *s: layer_svd(torch.diag(torch.tensor(s)))  # noqa: E731
    fa, fb = {"w": diag(10.0, 1.0)}, {"w": diag(10.0, -1.0)}
    assert alignment_r(fa, fb, 0.3) == pytest.approx(1.0)
    assert alignment_r(fa, fb, 0.0) == pytest.approx(0.0)
    # s_max is over all layers of a model: in a second layer, a's s ≤ 1 < 3 keeps nothing of a at
    # γ = 0.3 (a per-layer s_max of a would keep them, opposed to b's kept triplet: R = 0)
    fa["v"], fb["v"] = diag(1.0, 0.5), diag(-5.0, 0.5)
    assert alignment_r(fa, fb, 0.3) == pytest.approx(1.0)
    assert alignment_r(fa, fb, 0.0) == pytest.approx(0.0)
    # the denominator is min(n^a, n^b): a keeps 2 triplets, b keeps 1, the common one agrees
    assert alignment_r({"w": diag(10.0, 5.0)}, {"w": diag(10.0, 1.0)}, 0.3) == pytest.approx(1.0)


def test_each_layers_share_of_r_keeps_the_model_wide_threshold():
    """The same two-layer pair: at γ = 0.3 layer v keeps no triplet of a (a's s ≤ 1 < 3) so its share is
    (0, 0), layer w's is (1, 1); at γ = 0, w's is (1 − 1, 2) and v's (−1 + 1, 2). A sign-flipped layer's
    share is −(its rank) (u_b = −u_a, v_b = v_a)."""
    diag = lambda *s: layer_svd(torch.diag(torch.tensor(s)))  # noqa: E731
    fa, fb = {"w": diag(10.0, 1.0), "v": diag(1.0, 0.5)}, {"w": diag(10.0, -1.0), "v": diag(-5.0, 0.5)}
    assert layer_alignment(fa, fb, 0.3) == {"w": pytest.approx((1.0, 1)), "v": (0.0, 0)}
    assert layer_alignment(fa, fb, 0.0) == {"w": pytest.approx((0.0, 2)), "v": pytest.approx((0.0, 2))}
    assert layer_alignment({"w": diag(3.0, 2.0, 1.0)}, {"w": diag(-3.0, -2.0, -1.0)}, 0.0) == {
        "w": pytest.approx((-3.0, 3))
    }
    with pytest.raises(OptionError, match="gamma"):
        layer_alignment(fa, fb, 1.5)


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_shares_add_up_to_r(case, gamma):
    """Σ numerators / Σ counts over every layer is R_γ of the model, on a pair that is not aligned."""
    make, mode, sizes = CASES[case]
    spec, params = make(0)
    other = noisy(make(1)[1], 0.5, 2)
    fa, fb = factors(params, spec, mode, sizes), factors(other, spec, mode, sizes)
    shares = layer_alignment(fa, fb, gamma)
    assert list(shares) == list(fa)
    total = sum(n for n, _ in shares.values()) / sum(k for _, k in shares.values())
    assert total == pytest.approx(alignment_r(fa, fb, gamma), abs=1e-12)
    assert alignment_r(fa, fb, gamma) != pytest.approx(1.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_r_is_invariant_to_scaling_either_model(case):
    make, mode, sizes = CASES[case]
    spec, params = make(0)
    params_a = {k: v.double() if v.is_floating_point() else v for k, v in params.items()}  # exact scaling
    params_b = noisy(params_a, 0.5, seed=4)
    fa, fb = factors(params_a, spec, mode, sizes), factors(params_b, spec, mode, sizes)
    scale = lambda params, c: {k: c * v if v.is_floating_point() else v for k, v in params.items()}  # noqa: E731
    for c_a, c_b in ((0.01, 0.01), (100.0, 100.0), (0.05, 20.0)):
        fa_c, fb_c = factors(scale(params_a, c_a), spec, mode, sizes), factors(scale(params_b, c_b), spec, mode, sizes)
        for gamma in (0.0, 0.3, 0.6):
            assert alignment_r(fa_c, fb_c, gamma) == pytest.approx(alignment_r(fa, fb, gamma), abs=1e-9)


def test_r0_of_independent_random_matrices_matches_its_closed_form():
    """For bi-orthogonally invariant W^a, W^b (m×n, k = min(m, n)): E[⟨U_aV_aᵀ, U_bV_bᵀ⟩] = 0 and
    E[⟨·,·⟩²] = k²/(mn), so E[R_0] = 0 and E[R_0²] = 1/(mn)."""
    m, n, trials = 12, 20, 200
    g = torch.Generator().manual_seed(0)
    rs = []
    for _ in range(trials):
        fa = {"w": layer_svd(torch.randn(m, n, generator=g))}
        fb = {"w": layer_svd(torch.randn(m, n, generator=g))}
        rs.append(alignment_r(fa, fb, 0.0))
    rs = torch.tensor(rs, dtype=torch.float64)
    second = 1 / (m * n)
    assert abs(float(rs.mean())) < 4 * math.sqrt(second / trials)
    assert float((rs**2).mean()) == pytest.approx(second, rel=0.35)


@pytest.mark.parametrize("case", sorted(CASES))
def test_permutation_leaves_every_layers_singular_values_unchanged(case):
    make, mode, sizes = CASES[case]
    spec, params = make()
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(5))
    before = factors(params, spec, mode, sizes)
    after = factors(apply_permutation(spec, perm, params), spec, mode, sizes)
    for name in before:
        assert torch.allclose(singular_values(before[name]), singular_values(after[name]), atol=1e-10)


def test_fft_spectrum_of_a_1x1_convolution_is_the_svd_of_its_matrix():
    kernel = torch.randn(5, 3, 1, 1, generator=torch.Generator().manual_seed(0))
    exact = singular_values(layer_svd(kernel, mode="fft", input_size=(4, 3)))
    matrix = torch.linalg.svdvals(kernel[:, :, 0, 0].double())
    assert torch.allclose(exact, torch.sort(matrix.repeat(12), descending=True).values, atol=1e-10)


def circulant_operator(kernel, n):
    """The doubly-circulant matrix of the stride-1 circular convolution on an n×n input, built by
    applying the layer (circular padding, then PyTorch's cross-correlation) to every basis image."""
    out_ch, in_ch, kh, kw = kernel.shape
    basis = torch.eye(in_ch * n * n, dtype=torch.float64).reshape(-1, in_ch, n, n)
    padded = F.pad(basis, (kw // 2, kw // 2, kh // 2, kh // 2), mode="circular")
    images = F.conv2d(padded, kernel.double())  # (in·n², out, n, n)
    return images.reshape(in_ch * n * n, out_ch * n * n).T


def test_fft_spectrum_of_a_3x3_kernel_matches_the_explicit_doubly_circulant_operator():
    kernel = torch.randn(3, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    n = 5
    operator = circulant_operator(kernel, n)  # (3·25, 2·25)
    assert operator.shape == (75, 50)
    exact = singular_values(layer_svd(kernel, mode="fft", input_size=(n, n)))
    assert torch.allclose(exact, torch.linalg.svdvals(operator), atol=1e-9)
    assert circular_operator_blocks(kernel, (n, n)).shape == (25, 3, 2)


def test_output_scale_is_the_least_squares_factor():
    s_b = torch.tensor([3.0, 2.0, 1.0])
    assert output_scale(2.5 * s_b, s_b) == pytest.approx(2.5)
    s_a = torch.tensor([6.2, 4.1, 1.9])
    alpha = output_scale(s_a, s_b)
    assert all(((s_a - a * s_b) ** 2).sum() >= ((s_a - alpha * s_b) ** 2).sum() for a in (alpha - 0.01, alpha + 0.01))


def test_bad_gamma_and_mode_are_one_line_errors():
    spec, params = mlp_case()
    f = factors(params, spec, "reshape", None)
    with pytest.raises(ValueError, match=r"^gamma: γ must lie in \[0, 1\]"):
        alignment_r(f, f, 1.5)
    with pytest.raises(ValueError, match="^conv_spectrum must be one of"):
        layer_svd(params["out.weight"], mode="exact")
    with pytest.raises(ValueError, match=r"^gammas: γ must lie in \[0, 1\], got -0.1$"):
        check_gammas([0.0, 0.3, -0.1])
    check_gammas([0.0, 1.0])


def test_the_exact_convolution_spectrum_without_an_input_size_is_refused():
    with pytest.raises(ValueError, match=r"^the exact convolution spectrum needs the layer's input size$"):
        layer_svd(torch.randn(4, 3, 3, 3), mode="fft")
    assert len(singular_values(layer_svd(torch.randn(4, 3, 3, 3), mode="reshape"))) == 4  # no size needed
