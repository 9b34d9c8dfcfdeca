"""The permutation spec derived by tracing (lmclab.trace): equal to the hand-written specs, right by
invariance of the function in float64 on torchvision models, and a one-line refusal otherwise."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
import torchvision
from conftest import headed, partition
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.search.weight_matching import weight_matching
from lmclab.trace import TraceError, trace, trace_spec
from lmclab.trace.groups import FIXED, Groups, Seg

HAND = [
    ("mlp", {"hidden": 3, "width": 16}, (1, 28, 28)),
    ("vgg", {"width_multiplier": 0.125}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 1}, (3, 32, 32)),
    ("resnet50", {"width_multiplier": 0.25}, (3, 32, 32)),
    ("mixer", {"patch_size": 7, "hidden": 16, "token_mlp": 8, "channel_mlp": 24, "depth": 2}, (1, 28, 28)),
    ("vit", {"patch_size": 7, "width": 16, "depth": 2, "heads": 4}, (1, 28, 28)),
    ("vit", {"patch_size": 7, "width": 32, "depth": 2, "heads": 2, "pool": "mean", "position": "sincos"}, (1, 28, 28)),
    ("vit", {"patch_size": 7, "width": 16, "depth": 1, "heads": 3, "head_dim": 5}, (1, 28, 28)),
]
HAND_IDS = ["mlp", "vgg", "resnet20", "resnet50", "mixer", "vit-cls-learned", "vit-mean-sincos", "vit-head_dim"]
SUPPORTED = [
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "alexnet",
    "densenet121",
    "squeezenet1_0",
    "googlenet",
    "efficientnet_b0",
    "mnasnet0_5",
    "resnext50_32x4d",
    "regnet_y_400mf",
    "convnext_tiny",
    "shufflenet_v2_x0_5",
    "swin_t",
]


@pytest.mark.parametrize("arch,options,shape", HAND, ids=HAND_IDS)
def test_traced_spec_equals_the_hand_written_one(arch, options, shape):
    config = make_config(arch, input_shape=shape, num_classes=10, **options)
    traced = trace_spec(build_model(arch, config), torch.zeros(2, *shape))
    hand = get_arch(arch).permutation_spec(config)
    assert set(traced.axes) == set(hand.axes)
    assert partition(traced) == partition(hand) and traced.stats == hand.stats
    assert headed(traced) == headed(hand)


def permuted_copy(name: str, model: nn.Module, spec: PermutationSpec, seed: int) -> tuple[nn.Module, dict]:
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed))
    permuted = OrderedDict(apply_permutation(spec, perm, state))
    permuted._metadata = getattr(state, "_metadata", None)
    copy = getattr(torchvision.models, name)(weights=None, num_classes=10).double().eval()
    copy.load_state_dict(permuted)
    return copy, perm


def randomised(name: str, size: int = 64) -> nn.Module:
    """A float64 torchvision model in eval mode whose logits depend on the input (the coverage tool's
    randomisation: He-normal weights, BatchNorm statistics of a random batch, random norm affine terms,
    layer scales near 1)."""
    import trace_coverage

    return trace_coverage.randomised(getattr(torchvision.models, name)(weights=None, num_classes=10), (3, size, size))


def assert_invariant(name: str, size: int = 64) -> PermutationSpec:
    model, x = randomised(name, size), torch.randn(3, 3, size, size, dtype=torch.float64)
    spec = trace_spec(model, x)
    spec.check(model.state_dict())
    copy, perm = permuted_copy(name, model, spec, seed=1)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    with torch.no_grad():
        expected, got = model(x), copy(x)
    assert (expected[0] - expected[1]).abs().max() > 1e-3 * expected.abs().max()  # the logits depend on x
    assert (expected - got).abs().max() <= 1e-10 * expected.abs().max()  # float64 rounding only
    return spec


@pytest.mark.parametrize("name", SUPPORTED)
def test_random_permutations_of_the_traced_spec_leave_torchvision_models_unchanged(name):
    assert_invariant(name)


@pytest.mark.slow
@pytest.mark.parametrize("name,size", [("vgg11_bn", 64), ("inception_v3", 299)])
def test_large_torchvision_models_are_invariant_too(name, size):
    """VGG's classifier reads 512 channels × 7 × 7 (blocks of 49 features); Inception needs 299 pixels."""
    spec = assert_invariant(name, size)
    if name == "vgg11_bn":
        (segment,) = spec.axes["classifier.0.weight"][1]
        assert (
            segment.length == 512 * 49 and segment.block == 49 and segment.group == spec.axes["features.25.weight"][0]
        )


def assert_recovered(name: str, dtype: torch.dtype) -> None:
    model, x = randomised(name), torch.randn(1, 3, 64, 64, dtype=torch.float64)
    spec = trace_spec(model, x)
    copy, _ = permuted_copy(name, model, spec, seed=3)
    params_a = {k: v.to(dtype) for k, v in model.state_dict().items()}
    params_b = {k: v.to(dtype) for k, v in copy.state_dict().items()}
    found = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    back = apply_permutation(spec, found.perm, params_b)
    assert all(torch.equal(back[k], v) for k, v in spec.matched(params_a).items())


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "resnet50",
        "mobilenet_v2",
        "densenet121",
        "googlenet",
        "regnet_x_400mf",
        "shufflenet_v2_x0_5",
        pytest.param("convnext_tiny", marks=pytest.mark.slow),  # ~21 s: past the fast tier's 20 s a test
    ],
)
def test_weight_matching_on_the_traced_spec_recovers_a_permuted_copy(name):
    """Distance 0 back to the model, through residual streams, depthwise and grouped convs, concatenations,
    channels-last blocks with layer scales.
    (Not on every model: on squeezenet1_0 coordinate descent from the identity stops in a local
    optimum — its 16-unit squeeze layers feed 64-unit expand layers whose terms drown the signal —
    a property of WM, not of the spec, which the invariance test proves.)"""
    assert_recovered(name, torch.float64)


def test_weight_matching_recovers_vgg11_bn_through_its_flatten_into_blocks():
    """vgg11_bn's classifier reads its 512 channels × 7 × 7 flattened, each channel a block of 49 features; its
    two 4096-wide hidden layers are narrowed to 64 here so that WM takes seconds, not 80 (the coverage table
    measures the stock model's recovery)."""
    import trace_coverage

    model = torchvision.models.vgg11_bn(weights=None, num_classes=10)
    model.classifier = nn.Sequential(
        nn.Linear(512 * 7 * 7, 64),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(64, 10),
    )
    model = trace_coverage.randomised(model, (3, 64, 64))
    spec = trace_spec(model, torch.randn(1, 3, 64, 64, dtype=torch.float64))
    (blocks,) = spec.axes["classifier.0.weight"][1]
    assert (blocks.group, blocks.length, blocks.block) == (spec.axes["features.25.weight"][0], 512 * 49, 49)
    params_a = {k: v.float() for k, v in model.state_dict().items()}
    params_b = apply_permutation(
        spec, random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3)), params_a
    )
    found = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    back = apply_permutation(spec, found.perm, params_b)
    assert all(torch.equal(back[k], v) for k, v in spec.matched(params_a).items())


def test_a_channel_shuffle_makes_the_runs_it_interleaves_one_group_in_blocks():
    """ShuffleNet V2: a stride-2 unit's two branches are interleaved by the shuffle (one group, their last
    convs alike); the next unit's ``chunk`` splits the shuffled channels into halves of whole blocks of 2."""
    spec = trace_spec(randomised("shufflenet_v2_x0_5"), torch.randn(2, 3, 64, 64, dtype=torch.float64))
    assert spec.axes["stage2.0.branch1.2.weight"][0] == spec.axes["stage2.0.branch2.5.weight"][0]
    (half,) = spec.axes["stage2.1.branch2.0.weight"][1]  # reads the second half of 48 shuffled channels
    assert (half.length, half.block) == (24, 2) and half.group != spec.axes["stage2.0.branch2.5.weight"][0]


def test_permuting_one_branch_of_a_shuffled_unit_alone_changes_the_logits():
    """The converse: the shuffle interleaves the branches, so each may not move by a permutation of its own."""
    model, x = randomised("shufflenet_v2_x0_5"), torch.randn(2, 3, 64, 64, dtype=torch.float64)
    state, swap = model.state_dict(), torch.tensor([1, 0, *range(2, 24)])
    one_side = {
        k: state[k][swap] for k in state if k.startswith("stage2.0.branch1.") and state[k].dim() and k[17] in "23"
    }
    copy = torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=10).double().eval()
    copy.load_state_dict(state | one_side)
    with torch.no_grad():
        expected = model(x)
        assert (expected - copy(x)).abs().max() > 1e-6 * expected.abs().max()


class Shuffled(nn.Module):
    """A channel shuffle of one convolution's channels: its runs are no segments of their own (the view into
    ``(2, 4)`` reads as two heads of 4, which the shuffle's transpose does not join back)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        h = h.view(h.shape[0], 2, 4, *h.shape[2:]).transpose(1, 2).reshape(h.shape)
        return self.head(torch.relu(self.b(h)).mean((2, 3)))


def test_partial_spec_leaves_what_it_cannot_prove_unpermuted_and_stays_invariant():
    torch.manual_seed(0)
    model, x = Shuffled().double().eval(), torch.randn(2, 3, 6, 6, dtype=torch.float64)
    with pytest.raises(TraceError, match=r"node 'reshape': .*a flatten that does not join a head axis"):
        trace_spec(model, x)
    spec = trace_spec(model, x, partial=True)
    assert spec.axes["a.weight"][0] is None and spec.axes["b.weight"] == ("P_0", None, None, None)
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(x)
        model.load_state_dict(apply_permutation(spec, perm, model.state_dict()))
        assert torch.allclose(expected, model(x), rtol=1e-10, atol=1e-12 * float(expected.abs().max()))


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


def test_activation_points_hold_exactly_the_units_of_their_group():
    """A norm over a concatenation (DenseNet) holds many groups: the point is the layer writing one."""
    model, x = randomised("densenet121"), torch.randn(1, 3, 64, 64, dtype=torch.float64)
    traced = trace(model, x)
    sizes, widths = traced.spec.group_sizes(model.state_dict()), {}

    def width_of(name: str):
        def hook(module: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
            widths[name] = out.shape[1]

        return hook

    hooks = [model.get_submodule(m).register_forward_hook(width_of(m)) for ms in traced.points.values() for m in ms]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    assert set(traced.points) == set(sizes)
    assert all(widths[m] == sizes[g] for g, ms in traced.points.items() for m in ms)
    assert traced.points[traced.spec.axes["features.denseblock1.denselayer1.conv2.weight"][0]] == [
        "features.denseblock1.denselayer1.conv2"
    ]


class Grouped(nn.Module):
    """A grouped conv with 2 input and 3 output channels per group, fed by a concatenation."""

    def __init__(self, widths: tuple[int, int] = (2, 6)) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, widths[0], 3), nn.Conv2d(3, widths[1], 3)
        self.grouped = nn.Conv2d(sum(widths), 12, 3, groups=4)
        self.head = nn.Linear(12 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.cat([self.a(x), self.b(x)], 1))
        return self.head(torch.flatten(torch.relu(self.grouped(h)), 1))


def test_a_grouped_conv_permutes_whole_groups_alike_on_its_input_and_output():
    torch.manual_seed(0)
    model, x = Grouped().double(), torch.randn(4, 3, 6, 6, dtype=torch.float64)
    spec = trace_spec(model, x)
    (a_out,), (b_out,) = spec.axes["a.weight"][0], spec.axes["b.weight"][0]
    assert (a_out.length, a_out.block) == (2, 2) and (b_out.length, b_out.block) == (6, 2)  # whole groups of 2
    assert [(s.group, s.length, s.block) for s in spec.axes["grouped.weight"][0]] == [
        (a_out.group, 3, 3),
        (b_out.group, 9, 3),
    ]  # … move whole groups of 3 outputs alike
    assert spec.axes["grouped.weight"][1] is None  # no permutation inside a group is a symmetry
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(0))
    permuted = apply_permutation(spec, perm, model.state_dict())
    assert not torch.equal(permuted["grouped.weight"], model.state_dict()["grouped.weight"])
    with torch.no_grad():
        expected = model(x)
        model.load_state_dict(permuted)
        assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()


def test_a_grouped_conv_across_segment_boundaries_is_refused():
    with pytest.raises(
        TraceError,
        match=r"node 'grouped': Conv2d in grouped .*a grouped convolution \(4 groups "
        r"of 2 channels\) reading segments that do not hold whole groups",
    ):
        trace_spec(Grouped((3, 5)), torch.zeros(1, 3, 6, 6))


class CoarsenedThenMerged(nn.Module):
    """A group coarsened by a grouped conv, then added to an older group: both move in whole groups."""

    def __init__(self) -> None:
        super().__init__()
        self.b, self.a = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1)
        self.grouped = nn.Conv2d(4, 4, 3, groups=2)
        self.head, self.side = nn.Linear(4 * 4 * 4, 5), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_b = self.b(x)  # created first: the older group becomes the union's root
        h_a = torch.relu(self.a(x))
        out = self.head(torch.flatten(torch.relu(self.grouped(h_a)), 1))
        return out + self.side(torch.flatten(h_a + h_b, 1))


def test_a_coarsened_group_merged_later_keeps_its_runs():
    torch.manual_seed(0)
    model, x = CoarsenedThenMerged().double(), torch.randn(4, 3, 6, 6, dtype=torch.float64)
    spec = trace_spec(model, x)
    assert spec.axes["b.weight"][0] == spec.axes["a.weight"][0] == spec.axes["grouped.weight"][0]
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
        model.load_state_dict(apply_permutation(spec, perm, model.state_dict()))
        assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()


def test_union_find_keeps_coarsening_through_merges_and_pins():
    groups = Groups()
    b, a = groups.new(), groups.new()
    coarse = groups.coarsen(a, 4)
    groups.union(a, b)  # b is the older root: a's runs of 4 move over to it
    assert groups.resolve(Seg(b, 8)) == Seg(groups.find(coarse), 8, 4)
    with pytest.raises(TraceError, match="runs of 4 and of 2 channels"):
        groups.coarsen(b, 2)
    groups.union(b, FIXED)
    assert groups.find(coarse) == FIXED  # pinning a group pins its coarse group


class TwoAxes(nn.Module):
    """Tensors permuted on two axes at once (the Mixer's pattern, with swapaxes, a scale parameter and
    a reshape of the unpermuted axis): Linear ``a`` permutes the features, ``b`` mixes the 4 unpermuted
    positions into 3 hidden units that ride along with ``a``'s permutation on another axis."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.e, self.head = nn.Linear(5, 6), nn.Linear(4, 3), nn.Linear(3, 4), nn.Linear(6, 2)
        self.scale = nn.Parameter(torch.rand(3) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 4, 5)
        h = torch.relu(self.a(x))  # (N, 4, 6): a's group on axis 2
        t = torch.relu(self.b(h.swapaxes(1, 2))) * self.scale  # (N, 6, 3): a's on axis 1, b's on axis 2
        h = h + self.e(t).swapaxes(1, 2)  # e's output meets the unpermuted positions: pinned
        return self.head(h.reshape(-1, 2, 2, 6).mean((1, 2)))


def test_a_tensor_permuted_on_two_axes_keeps_both_through_swaps_scales_and_means():
    torch.manual_seed(0)
    model, x = TwoAxes().double(), torch.randn(5, 4, 5, dtype=torch.float64)
    spec = trace_spec(model, x)
    (p_a, _), (p_b, _) = spec.axes["a.weight"], spec.axes["b.weight"]
    assert spec.axes["head.weight"] == (None, p_a) and spec.axes["scale"] == (p_b,) and {p_a, p_b} == set(spec.groups)
    assert spec.axes["b.weight"][1] is None and spec.axes["e.weight"] == (None, p_b) and spec.axes["e.bias"] == (None,)
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
        model.load_state_dict(apply_permutation(spec, perm, model.state_dict()))
        assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()


class Forward(nn.Module):
    """Linears ``a`` (5 → 6 on the last axis) and ``b`` (4 → 3), a 1×1 conv, and a forward given as a function."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.a, self.b, self.conv, self.f = nn.Linear(5, 6), nn.Linear(4, 3), nn.Conv2d(3, 2, 1), forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


@pytest.mark.parametrize(
    "forward,message",
    [
        (
            lambda m, x: m.b(m.a(x).swapaxes(1, 2)).flatten(1),
            r"node 'flatten'.*\(a flatten of two permuted axes into one\)",
        ),
        (lambda m, x: m.a(x)[:, :, 0], r"node 'getitem'.*an index that picks units of a permuted axis"),
        (
            lambda m, x: m.conv(m.a(x.reshape(-1, 1, 4, 5).expand(-1, 3, -1, -1))),
            r"node 'conv': Conv2d in conv .*a convolution over a permuted axis that is not its channel axis",
        ),
    ],
    ids=["flatten-two-permuted-axes", "index-a-unit", "conv-over-permuted-width"],
)
def test_what_mixes_a_permuted_axis_with_others_is_refused(forward, message):
    with pytest.raises(TraceError, match=message):
        trace_spec(Forward(forward), torch.zeros(2, 4, 5))


def test_a_mean_over_a_whole_permuted_axis_is_the_same_in_any_order():
    """RMSNorm: ``x · rsqrt(mean(x², -1))`` times a weight; the mean reduces the hidden axis, so it stays
    permuted (one group through the norm, the weight permuted with it); the weight alone permuted changes it."""

    def rms(m, x):
        h = m.a(x)
        return m.b(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * m.scale)

    torch.manual_seed(0)
    model = Forward(rms)
    model.b, model.scale = nn.Linear(6, 4), nn.Parameter(torch.rand(6) + 0.5)
    model = model.double()
    x = torch.randn(2, 4, 5, dtype=torch.float64)
    spec = trace_spec(model, x)
    assert spec.axes["scale"] == spec.axes["a.bias"] == (spec.axes["b.weight"][1],) != (None,)
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1))
    twin, wrong = copy.deepcopy(model), copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    wrong.load_state_dict(state | {"scale": state["scale"][perm[spec.axes["scale"][0]]]})
    assert torch.allclose(model(x), twin(x), rtol=1e-12, atol=1e-15) and not torch.allclose(model(x), wrong(x))


def test_convnext_keeps_every_symmetry_through_its_channels_last_blocks_and_layer_scales():
    """4 stages' streams and 18 blocks' hidden units; a layer scale moves with its block's stream."""
    spec = trace_spec(torchvision.models.convnext_tiny(weights=None, num_classes=10).eval(), torch.zeros(1, 3, 64, 64))
    assert len(spec.groups) == 4 + 18
    assert spec.axes["features.1.0.layer_scale"] == (spec.axes["features.1.0.block.0.weight"][0], None, None)
    assert spec.axes["features.1.0.block.3.weight"][1] == spec.axes["features.1.2.block.5.weight"][0]
    assert spec.axes["classifier.0.weight"] == (spec.axes["features.7.2.block.5.weight"][0],)  # LayerNorm2d


class PinnedWidth(nn.Module):
    """A Linear over the width whose output meets the input (so its group is pinned), then a conv (whose
    narrower output must not keep the pinned width's layout), a Linear over the new width added back, a pool."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.conv, self.b, self.head = nn.Linear(5, 5), nn.Conv2d(3, 4, 3), nn.Linear(3, 3), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 3, 4, 5)
        h = torch.relu(self.conv(self.a(x) + x))  # (N, 4, 2, 3)
        h = h + self.b(h)  # b's group meets h's unpermuted width: pinned
        return self.head(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


def test_an_axis_whose_groups_are_pinned_no_longer_blocks_convs_and_pools():
    spec = trace_spec(PinnedWidth(), torch.zeros(2, 3, 4, 5))
    assert spec.axes["a.weight"] == spec.axes["b.weight"] == (None, None)
    assert spec.axes["conv.weight"] == ("P_0", None, None, None)
    assert spec.axes["head.weight"] == (None, "P_0") and list(spec.groups) == ["P_0"]


class PinnedWidthPooled(nn.Module):
    """A pinned width (a Linear over it added to the input), halved by a pool, then a Linear over the
    pooled width added back: the pool's output must not keep the old width's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 4), nn.Linear(2, 2), nn.Linear(3 * 2 * 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 3, 4, 4)
        h = torch.nn.functional.max_pool2d(self.a(x) + x, 2)  # (N, 3, 2, 2): the pinned width shrinks
        return self.head((h + self.b(h)).flatten(1))


def test_a_pool_drops_the_layout_of_a_pinned_axis_it_shrinks():
    spec = trace_spec(PinnedWidthPooled(), torch.zeros(2, 3, 4, 4))
    assert spec.axes["a.weight"] == spec.axes["b.weight"] == (None, None) and not spec.groups
