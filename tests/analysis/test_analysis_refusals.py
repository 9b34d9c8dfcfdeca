"""The analyses' refusals of a bad input, each reached through the function a caller uses and asserted as
its whole one-line message, next to the nearest accepted input and the value it gives: the spectra and R's
layers (a logits layer, a kernel within its input, output spectra of one length), CKA's samples, neural
collapse's classes, the convolutions input energy can unfold, the MAE analyses' masks, pool and probe
steps, and the n-model comparison's models and names."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mae_reference import reconstruction_loss
from test_many_models import planted
from torch import nn

from lmclab.analysis.alignment import layer_svd, output_scale, singular_values
from lmclab.analysis.cka import cka_rows, linear_cka
from lmclab.analysis.collapse import collapse_stats, neural_collapse
from lmclab.analysis.energy import input_energy
from lmclab.analysis.mae import fixed_masks, masked_visible_error
from lmclab.analysis.mae_probe import encoder_features, linear_probe_accuracy, probe_curve
from lmclab.analysis.many_models import compare_many
from lmclab.archs import build_model, mae, make_config, seeded_model, vit
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import lerp_params
from lmclab.core.objective import functional_method
from lmclab.core.options import OptionError
from lmclab.core.spec import build_spec
from lmclab.core.spec_builders import dense

MAE = mae.from_vit(
    vit.Config(input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=16, depth=1, heads=2),
    decoder_width=8,
    decoder_depth=1,
    decoder_heads=2,
)


def _net() -> nn.Sequential:
    """A 3 → 4 → 2 ReLU network in float64 (modules "0" and "2")."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()


def _split(labels: list[int], seed: int = 1) -> Split:
    gen = torch.Generator().manual_seed(seed)
    return Split(torch.randn(len(labels), 3, generator=gen, dtype=torch.float64), torch.tensor(labels))


def test_neural_collapse_needs_a_logits_layer_whose_output_axis_is_never_permuted():
    net, split = _net(), _split([0, 1, 1, 0, 1])
    params = dict(net.state_dict())
    every_output_permuted = build_spec(dense("0", "P_0", None), dense("2", "P_1", "P_0"))
    with pytest.raises(ValueError, match=r"^the permutation spec has no layer with an unpermuted output axis$"):
        neural_collapse(every_output_permuted, net, params, split)
    logits_fixed = build_spec(dense("0", "P_0", None), dense("2", None, "P_0"))
    features = torch.relu(net[0](split.x)).detach()  # the inputs of the logits layer "2"
    assert neural_collapse(logits_fixed, net, params, split) == pytest.approx(collapse_stats(features, split.y))


def test_neural_collapse_is_not_measured_on_targets_per_position():
    """A language model's next tokens ``(B, T)``: no statistics (``{}``), where per-sample targets give them."""
    net, split = _net(), _split([0, 1, 1, 0, 1])
    spec = build_spec(dense("0", "P_0", None), dense("2", None, "P_0"))
    assert neural_collapse(spec, net, dict(net.state_dict()), split)  # per sample: measured
    tokens = Split(split.x, torch.stack([split.y, split.y], 1))  # (5, 2): a target per position
    assert neural_collapse(spec, net, dict(net.state_dict()), tokens) == {}


def test_neural_collapse_needs_two_classes_among_the_samples():
    net = _net()
    spec = build_spec(dense("0", "P_0", None), dense("2", None, "P_0"))
    with pytest.raises(ValueError, match=r"^neural collapse needs at least 2 classes among the samples, got 1$"):
        neural_collapse(spec, net, dict(net.state_dict()), _split([1, 1, 1]))
    # two classes, collapsed onto two points, three samples against one: the centred means are −d/4 and 3d/4,
    # opposed (an ETF of 2) with norms a and 3a, whose coefficient of variation is √2·a / 2a
    features = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [-3.0, 5.0]])
    got = collapse_stats(features, torch.tensor([0, 0, 0, 1]))
    assert got == pytest.approx({"nc1": 0.0, "nc2_etf": 0.0, "nc_equinorm": 1 / math.sqrt(2)}, abs=1e-12)


def _circular_correlation(kernel: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The matrix of the stride-1 circular cross-correlation of ``kernel`` on an input of ``size``."""
    out_ch, in_ch, kh, kw = kernel.shape
    basis = torch.eye(in_ch * size[0] * size[1], dtype=torch.float64).reshape(-1, in_ch, *size)
    images = F.conv2d(F.pad(basis, (0, kw - 1, 0, kh - 1), mode="circular"), kernel.double())
    return images.reshape(len(basis), -1).T


def test_the_exact_spectrum_refuses_a_kernel_larger_than_its_input_in_either_dimension():
    kernel = torch.randn(3, 2, 2, 3, generator=torch.Generator().manual_seed(0))  # kh = 2, kw = 3
    for size in ((1, 3), (2, 2)):
        with pytest.raises(ValueError, match=rf"^kernel \(2, 3\) is larger than its input \({size[0]}, {size[1]}\)$"):
            layer_svd(kernel, mode="fft", input_size=size)
    exact = singular_values(layer_svd(kernel, mode="fft", input_size=(2, 3)))  # the kernel fills the input
    assert torch.allclose(exact, torch.linalg.svdvals(_circular_correlation(kernel, (2, 3))), atol=1e-10)


def test_the_output_scale_refuses_spectra_of_different_lengths():
    with pytest.raises(ValueError, match=r"^output spectra differ in length: \(3,\) vs \(2,\)$"):
        output_scale([6.2, 4.1, 1.9], [3.0, 2.0])
    with pytest.raises(ValueError, match=r"^output spectra differ in length: \(2,\) vs \(3,\)$"):
        output_scale(torch.tensor([6.2, 4.1]), torch.tensor([3.0, 2.0, 1.0]))
    # ⟨s_a, s_b⟩ / ‖s_b‖² = (18.6 + 8.2 + 1.9) / 14
    assert output_scale([6.2, 4.1, 1.9], [3.0, 2.0, 1.0]) == pytest.approx(28.7 / 14, rel=1e-12)


def _hsic_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA as HSIC with the centring matrix H: tr(K H L H) / √(tr(K H K H) tr(L H L H))."""
    h = torch.eye(len(x), dtype=torch.float64) - 1 / len(x)
    k, m = h @ x.double() @ x.double().T @ h, h @ y.double() @ y.double().T @ h
    return float(torch.trace(k @ m) / torch.sqrt(torch.trace(k @ k) * torch.trace(m @ m)))


def test_cka_needs_the_same_two_or_more_samples_on_both_sides():
    net = _net()
    params = dict(net.state_dict())
    spec = build_spec(dense("0", "P_0", None), dense("2", None, "P_0"))
    models = dict.fromkeys(("a", "b", "pi_b", "mid"), params)
    with pytest.raises(ValueError, match=r"^CKA needs the same ≥ 2 samples on both sides, got 1 and 1$"):
        cka_rows(spec, net, models, _split([0]))
    assert [r["cka"] for r in cka_rows(spec, net, models, _split([0, 1]))] == pytest.approx([1.0] * 4)
    x, y = torch.randn(3, 4, generator=torch.Generator().manual_seed(2)), torch.tensor([[1.0], [-2.0], [4.0]])
    with pytest.raises(ValueError, match=r"^CKA needs the same ≥ 2 samples on both sides, got 3 and 2$"):
        linear_cka(x, y[:2])
    with pytest.raises(ValueError, match=r"^CKA needs the same ≥ 2 samples on both sides, got 2 and 3$"):
        linear_cka(x[:2], y)
    assert linear_cka(x, y) == pytest.approx(_hsic_cka(x, y), rel=1e-12)
    assert linear_cka(x[:2], y[:2]) == pytest.approx(1.0)  # two samples: one centred direction on each side


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(2, 4, (1, 2), padding="same"),
        nn.Conv2d(2, 4, (1, 2), padding=(1, 0), padding_mode="circular"),
        nn.Conv2d(2, 4, (1, 2), padding=(1, 0), groups=2),
    ],
    ids=["string padding", "circular padding", "grouped"],
)
def test_input_energy_refuses_convolutions_it_cannot_unfold(conv):
    model = nn.Sequential(conv).double()
    split = Split(torch.randn(3, 2, 3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long))
    message = r"^input energy needs zero-padded, ungrouped convolutions with numeric padding$"
    with pytest.raises(ValueError, match=message):
        input_energy(model, dict(model.state_dict()), split, ["0.weight"])


def test_input_energy_of_a_zero_padded_convolution_sums_to_its_patches_second_moment():
    """A (1, 2) kernel on one channel padded by one zero row above and below a 3 × 4 image: 5 · 3 patches per
    image, each real row's entries c and c + 1; the 2 right singular vectors of the 4 × 2 matrix span them."""
    model = nn.Sequential(nn.Conv2d(1, 4, (1, 2), padding=(1, 0))).double()
    x = torch.randn(3, 1, 3, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s, energy = input_energy(model, dict(model.state_dict()), Split(x, torch.zeros(3, dtype=torch.long)), ["0.weight"])[
        "0.weight"
    ]
    squares = x[:, 0] ** 2
    assert len(s) == 2 and bool(s[0] >= s[1])
    assert float(energy.sum()) == pytest.approx(float(squares[..., :-1].sum() + squares[..., 1:].sum()) / (3 * 5 * 3))


def _mae_pair():
    model = seeded_model(mae.Model, MAE, 0).double().eval()
    a, b = ({k: v.double() for k, v in seeded_model(mae.Model, MAE, s).state_dict().items()} for s in (0, 1))
    return model, a, b


def _images(n: int, seed: int = 3) -> Split:
    gen = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, 1, 28, 28, generator=gen, dtype=torch.float64), torch.arange(n) % 2)


def test_the_masked_and_visible_error_needs_one_mask_per_image():
    model, a, b = _mae_pair()
    params, masks = lerp_params(a, b, 0.3), fixed_masks(5, MAE.patches, MAE.mask_ratio, seed=7)
    for n in (4, 6):
        with pytest.raises(ValueError, match=rf"^masks: 5 masks for {n} images$"):
            masked_visible_error(model, params, _images(n).x, masks)
    images = _images(5).x
    got = masked_visible_error(model, params, images, masks, batch_size=2)
    assert got["masked"] == pytest.approx(reconstruction_loss(model, params, images, masks), rel=1e-10)
    assert 0 < got["visible"] != got["masked"]


def test_the_encoder_features_refuse_an_unknown_pool():
    model, a, b = _mae_pair()
    train, test = _images(6), _images(4, seed=4)
    with pytest.raises(ValueError, match=r"^pool must be one of \['cls', 'mean'\], got 'max'$"):
        probe_curve(model, a, b, train, test, [0.3], pool="max", k=3)
    patches = torch.arange(MAE.patches).expand(4, -1)
    tokens = functional_method(model, a, "encode", test.x, patches)  # (4, 1 + patches, width)
    assert torch.allclose(encoder_features(model, a, test.x, pool="mean", batch_size=3), tokens[:, 1:].mean(1))
    assert torch.allclose(encoder_features(model, a, test.x, pool="cls"), tokens[:, 0])


def test_the_linear_probe_needs_at_least_one_step():
    model, a, b = _mae_pair()
    with pytest.raises(ValueError, match=r"^steps must be a positive integer, got 0$"):
        probe_curve(model, a, b, _images(6), _images(4, seed=4), [0.3], steps=0, k=3)
    # two classes far apart along the first feature: one L-BFGS iteration from zero separates them
    gen = torch.Generator().manual_seed(5)
    labels = torch.tensor([0, 1, 1, 0, 1, 0, 1, 1])
    features = torch.randn(8, 3, generator=gen) + 10.0 * labels[:, None] * torch.tensor([1.0, 0.0, 0.0])
    assert linear_probe_accuracy(features[:5], labels[:5], features[5:], labels[5:], steps=1) == 1.0


def test_compare_many_needs_as_many_names_as_models_and_at_least_two():
    spec, params, _ = planted(5, 2)
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=5)
    model, gen = build_model("mlp", config), torch.Generator().manual_seed(0)
    test = Split(torch.randn(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen))
    cases = [(params[:1], ["a"], "1, 1"), (params, ["a"], "2, 1"), (params, ["a", "b", "c"], "2, 3")]
    for models, names, counts in cases:
        message = rf"^params, names: expected as many names as models, at least 2; got {counts}$"
        with pytest.raises(OptionError, match=message):
            compare_many(model, spec, models, names, {"test": test}, methods={}, seed=0)
    found = compare_many(model, spec, params, ["a", "b"], {"test": test}, methods={}, seed=0)
    losses = {r["model"]: r["loss"] for r in found.evaluation}
    assert set(losses) == {"average", "a", "b", "ensemble"}
    assert losses["b"] == pytest.approx(evaluate(model, params[1], test).loss)
