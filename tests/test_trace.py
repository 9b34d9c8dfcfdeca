"""The permutation spec derived by tracing (lmclab.trace): equal to the hand-written specs, right by
invariance of the function in float64 on torchvision models, and a one-line refusal otherwise."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torchvision
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.search.weight_matching import weight_matching
from lmclab.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec

HAND = [("mlp", {"hidden": 3, "width": 16}, (1, 28, 28)), ("vgg", {"width_multiplier": 0.125}, (3, 32, 32)),
        ("resnet20", {"width_multiplier": 1}, (3, 32, 32)), ("resnet50", {"width_multiplier": 0.25}, (3, 32, 32))]
SUPPORTED = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small"]
REFUSED = {"vgg11_bn": "block of 49 features", "densenet121": "'cat'", "efficientnet_b0": "stochastic_depth",
           "regnet_x_400mf": "grouped convolution", "convnext_tiny": "'permute'"}


def partition(spec: PermutationSpec) -> set[frozenset]:
    """The groups as sets of (parameter, axis): equal specs up to renaming of groups."""
    return {frozenset(places) for places in spec.groups.values()}


@pytest.mark.parametrize("arch,options,shape", HAND, ids=[h[0] for h in HAND])
def test_traced_spec_equals_the_hand_written_one(arch, options, shape):
    config = make_config(arch, input_shape=shape, num_classes=10, **options)
    traced = trace_spec(build_model(arch, config), torch.zeros(2, *shape))
    hand = get_arch(arch).permutation_spec(config)
    assert set(traced.axes) == set(hand.axes)
    assert partition(traced) == partition(hand) and traced.stats == hand.stats


def permuted_copy(name: str, model: nn.Module, spec: PermutationSpec, seed: int) -> tuple[nn.Module, dict]:
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed))
    permuted = OrderedDict(apply_permutation(spec, perm, state))
    permuted._metadata = getattr(state, "_metadata", None)
    copy = getattr(torchvision.models, name)(weights=None, num_classes=10).double().eval()
    copy.load_state_dict(permuted)
    return copy, perm


def randomised(name: str) -> nn.Module:
    """A float64 torchvision model in eval mode with random BatchNorm statistics and affine terms."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, num_classes=10).double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("name", SUPPORTED)
def test_random_permutations_of_the_traced_spec_leave_torchvision_models_unchanged(name):
    model, x = randomised(name), torch.randn(3, 3, 64, 64, dtype=torch.float64)
    spec = trace_spec(model, x)
    spec.check(model.state_dict())
    copy, perm = permuted_copy(name, model, spec, seed=1)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    with torch.no_grad():
        expected, got = model(x), copy(x)
    assert torch.allclose(expected, got, rtol=1e-10, atol=1e-12 * float(expected.abs().max()))


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_weight_matching_on_the_traced_spec_recovers_a_permuted_copy(name):
    """Distance 0 back to the model (MobileNets: coordinate descent stops in a local optimum on
    random weights, at 167 of 195 on mobilenet_v2 — a property of WM, not of the spec, which the
    invariance test proves)."""
    model, x = randomised(name), torch.randn(1, 3, 64, 64, dtype=torch.float64)
    spec = trace_spec(model, x)
    copy, _ = permuted_copy(name, model, spec, seed=3)
    found = weight_matching(spec, model.state_dict(), copy.state_dict(), generator=torch.Generator().manual_seed(0))
    back = apply_permutation(spec, found.perm, copy.state_dict())
    assert all(torch.equal(back[k], v) for k, v in spec.matched(model.state_dict()).items())


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_models_it_cannot_prove_are_refused_in_one_line(name):
    model = getattr(torchvision.models, name)(weights=None, num_classes=10).eval()
    with pytest.raises(TraceError, match=REFUSED[name]) as err:
        trace_spec(model, torch.zeros(1, 3, 64, 64))
    assert "\n" not in str(err.value) and "node " in str(err.value) and "partial=True" in str(err.value)


def test_partial_spec_leaves_what_it_cannot_prove_unpermuted_and_stays_invariant():
    model = randomised("vgg11_bn")
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    spec = trace_spec(model, x, partial=True)
    assert spec.axes["classifier.0.weight"][1] is None  # the flatten into 7 × 7 blocks: not permuted
    assert spec.axes["features.25.weight"][0] is None  # so neither is the last conv feeding it
    assert len(spec.groups) == 7 + 2  # 8 convs but the last, and the two hidden classifier layers
    copy, _ = permuted_copy("vgg11_bn", model, spec, seed=2)
    with torch.no_grad():
        assert torch.allclose(model(x), copy(x), rtol=1e-10, atol=1e-14)


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cumsum(self.inner(x), dim=1))  # cumsum mixes units in order


class InputResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.head(x + self.b(h))  # the stream holds the input itself


def test_an_unsupported_op_names_the_node_op_and_module_path():
    with pytest.raises(TraceError, match=r"node 'cumsum': cumsum in \(top level\)"):
        trace_spec(Unsupported(), torch.zeros(2, 4))


def test_a_residual_stream_carrying_the_input_is_never_permuted():
    spec = trace_spec(InputResidual(), torch.zeros(2, 4))
    assert spec.axes["b.weight"] == (None, "P_0") and spec.axes["a.weight"] == ("P_0", None)
    assert spec.axes["head.weight"] == (None, None) and list(spec.groups) == ["P_0"]
