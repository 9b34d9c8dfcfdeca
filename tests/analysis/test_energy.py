"""Input energy (Figures 4, 9), layer inputs via hooks (linear and conv) and Theorem 4.2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmclab.analysis.alignment import layer_matrix, layer_names, layer_svd
from lmclab.analysis.energy import (
    input_energy,
    input_patches,
    input_sizes,
    layer_inputs,
    product_layers,
    theorem42,
)
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split


def mlp(seed=0, hidden=2, width=6, input_shape=(1, 2, 3)):
    config = make_config("mlp", input_shape=input_shape, num_classes=4, hidden=hidden, width=width)
    model = build_model("mlp", config, seed=seed).double()
    return model, get_arch("mlp").permutation_spec(config), dict(model.state_dict())


def test_energy_of_an_input_along_one_right_singular_vector_is_concentrated_on_its_index():
    model, spec, params = mlp()
    v = layer_svd(params["layers.0.weight"]).Vh[0]  # (k, 6): rows are v_iᵀ
    coeff = torch.randn(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    split = Split((coeff[:, None] * v[3]).reshape(30, 1, 2, 3), torch.zeros(30, dtype=torch.long))
    s, energy = input_energy(model, params, split, ["layers.0.weight"], batch_size=7)["layers.0.weight"]
    assert torch.all(s[:-1] >= s[1:])
    assert energy[3] == pytest.approx(float((coeff**2).mean()))
    assert float(energy.sum() - energy[3]) < 1e-20


def test_energies_of_a_complete_basis_sum_to_the_input_second_moment():
    model, spec, params = mlp(width=8)  # layers.0 is 8 × 6: its 6 right singular vectors span the input
    g = torch.Generator().manual_seed(1)
    split = Split(torch.randn(25, 1, 2, 3, generator=g, dtype=torch.float64), torch.zeros(25, dtype=torch.long))
    result = input_energy(model, params, split, layer_names(spec, params))
    assert float(result["layers.0.weight"][1].sum()) == pytest.approx(float((split.x**2).sum() / 25))
    assert set(result) == {"layers.0.weight", "layers.1.weight", "out.weight"}


class TinyConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c0 = nn.Conv2d(2, 4, 3, padding=1)
        self.c1 = nn.Conv2d(4, 3, 3, stride=2, padding=1, bias=False)
        self.fc = nn.Linear(3 * 3 * 3, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.c1(torch.relu(self.c0(x)))).flatten(1))


def test_conv_patches_times_the_reshaped_kernel_reproduce_the_convolution():
    torch.manual_seed(0)
    net = TinyConvNet().double()
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    z = input_patches(net.c1, x)  # (2·3·3, 4·9)
    y = (z @ layer_matrix(net.c1.weight).T).reshape(2, 3, 3, 3).permute(0, 3, 1, 2)
    assert torch.allclose(y, net.c1(x))
    assert input_sizes(net, ["c0.weight", "c1.weight", "fc.weight"], (2, 6, 6)) == {
        "c0.weight": (6, 6),
        "c1.weight": (6, 6),
    }
    params = dict(net.state_dict())
    split = Split(torch.randn(3, 2, 6, 6, dtype=torch.float64), torch.zeros(3, dtype=torch.long))
    [(n, inputs)] = list(layer_inputs(net, params, split, ["c1.weight", "fc.weight"], batch_size=5))
    assert n == 3 and inputs["c1.weight"].shape == (27, 36) and inputs["fc.weight"].shape == (3, 27)
    assert not net.c1._forward_pre_hooks  # hooks are removed afterwards


def test_theorem42_bound_is_the_rms_of_the_pre_activation_gap_and_bounds_the_measured_gap():
    model, spec, params_a = mlp(0, width=7)
    _, _, params_b = mlp(1, width=7)
    split = Split(
        torch.randn(50, 1, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64),
        torch.zeros(50, dtype=torch.long),
    )
    layers = layer_names(spec, params_a)
    rows = {r["layer"]: r for r in theorem42(model, params_a, params_b, split, layers, batch_size=16)}
    z = split.x.flatten(1)  # the input of layers.0 in model a
    gap = z @ (params_a["layers.0.weight"] - params_b["layers.0.weight"]).T
    assert rows["layers.0.weight"]["bound"] == pytest.approx(float((gap**2).sum(1).mean().sqrt()))
    measured = (F.relu(z @ params_a["layers.0.weight"].T) - F.relu(z @ params_b["layers.0.weight"].T)).norm(dim=1)
    assert rows["layers.0.weight"]["measured"] == pytest.approx(float(measured.mean()))
    for r in rows.values():
        assert 0 < r["measured"] <= r["bound"] + 1e-12
    same = theorem42(model, params_a, params_a, split, layers)
    assert all(r["measured"] == 0 and r["bound"] < 1e-6 for r in same)


def test_a_layer_without_a_linear_or_conv_module_is_a_one_line_error():
    model, _, params = mlp()
    with pytest.raises(ValueError, match="layers.0.bias"):
        list(layer_inputs(model, params, Split(torch.zeros(1, 1, 2, 3), torch.zeros(1)), ["layers.0.bias"]))


def test_only_layers_that_multiply_an_input_take_energy_and_the_theorem42_bound():
    """A language model's token and position tables are layers for R and spectra, not for input energy:
    ``product_layers`` keeps the Linears (the head, tied to the token table, is one); an MLP keeps all."""
    config = make_config("gpt", input_shape=(8,), num_classes=11, width=8, depth=1, heads=2, mlp_ratio=2)
    model = build_model("gpt", config, seed=0)
    layers = layer_names(get_arch("gpt").permutation_spec(config), dict(model.state_dict()))
    assert {"embed.weight", "pos_embed.weight", "head.weight"} <= set(layers)
    kept = product_layers(model, layers)
    assert kept == [n for n in layers if n not in ("embed.weight", "pos_embed.weight")] and "head.weight" in kept
    tokens = Split(torch.randint(0, 11, (3, 8)), torch.randint(0, 11, (3, 8)))
    assert set(input_energy(model, dict(model.state_dict()), tokens, kept)) == set(kept)
    small, spec, params = mlp()
    assert product_layers(small, layer_names(spec, params)) == layer_names(spec, params)
