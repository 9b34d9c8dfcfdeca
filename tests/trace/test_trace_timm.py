"""The tracer on timm's efficient nets and windowed attention (lmclab.trace.functional): functional
BatchNorm (BatchNormAct2d), squeeze-excitation gates, depthwise convs, timm's Linear (F.linear), Swin's
padding, rolled windows and patch merging; and on GroupNorm, whose runs of channels coarsen a group.
Each model: random permutations of every group leave it unchanged in float64, a permutation on one side
of a group changes it, weight matching brings a permuted copy back exactly; what moves a padded or rolled
axis, or splits a GroupNorm's runs, is refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.core.spec import PermutationSpec, Segment, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
timm = pytest.importorskip("timm")


def tool():
    """tools/trace_coverage.py (tools/ is on the tests' import path): one randomisation rule."""
    import trace_coverage

    return trace_coverage


inputs, logits, permuted, randomised, recovered = (
    getattr(tool(), f) for f in ("inputs", "logits", "permuted", "randomised", "recovered")
)

SMALL_SWIN = {"img_size": 48, "embed_dim": 16, "depths": (2, 2), "num_heads": (2, 4)}  # 12 × 12 tokens: padded
MODELS = {
    "mobilenetv3_small_100": ({}, (3, 32, 32)),
    "efficientnet_b0": ({}, (3, 32, 32)),
    "swin_tiny_patch4_window7_224": (SMALL_SWIN, (3, 48, 48)),
    "convnext_atto": ({}, (3, 32, 32)),
}


def model_and_spec(name: str) -> tuple[nn.Module, torch.Tensor, PermutationSpec]:
    kwargs, shape = MODELS[name]
    model = randomised(timm.create_model(name, pretrained=False, num_classes=10, **kwargs), shape)
    x = inputs(shape, 3, seed=1)
    return model, x, trace_spec(model, x)


def relative_change(y: torch.Tensor, z: torch.Tensor) -> float:
    return float((y - z).abs().max() / y.abs().max())


@pytest.mark.parametrize("name", list(MODELS))
def test_random_permutations_of_every_group_leave_timm_models_unchanged(name):
    model, x, spec = model_and_spec(name)
    spec.check(model.state_dict())
    y = logits(model, x)
    assert relative_change(y[:1], y[1:2]) > 1e-3  # the logits depend on the input
    for seed in (1, 2):
        assert relative_change(y, logits(permuted(model, spec, seed), x)) <= 1e-10


@pytest.mark.parametrize(
    "name",
    ["mobilenetv3_small_100", pytest.param("efficientnet_b0", marks=pytest.mark.slow), "swin_tiny_patch4_window7_224"],
)
def test_a_permutation_on_the_writing_side_of_a_group_only_changes_the_logits(name):
    """θ with one group's writers permuted and its readers not: the units arrive in another order."""
    model, x, spec = model_and_spec(name)
    state, y = model.state_dict(), logits(model, x)
    sizes = spec.group_sizes(state)
    for group in sorted(g for g in sizes if sizes[g] > 1 and g not in spec.heads):
        perm = random_permutation({group: sizes[group]}, torch.Generator().manual_seed(0))
        perm |= {g: torch.arange(n) for g, n in sizes.items() if g != group}
        one_side = dict(apply_permutation(spec, perm, state))
        one_side |= {key: state[key] for key, axis in spec.groups[group] if axis >= 1}  # readers as they were
        twin = permuted(model, spec, seed=0)
        twin.load_state_dict(one_side)
        assert relative_change(y, logits(twin, x)) > 1e-6, group


@pytest.mark.parametrize(
    "name",
    [
        "mobilenetv3_small_100",
        pytest.param("efficientnet_b0", marks=pytest.mark.slow),
        "swin_tiny_patch4_window7_224",
        "convnext_atto",
    ],
)
def test_weight_matching_brings_a_permuted_timm_model_back_exactly(name):
    model, x, spec = model_and_spec(name)
    assert recovered(model, permuted(model, spec, seed=3), spec, x)


def test_swin_keeps_its_stream_and_mlp_groups_and_pins_attention_its_bias_table_orders():
    """The relative position bias varies along the heads: the head order is pinned, and with it every headed
    group of the block (no spec permutes a parameter by a head order); the residual stream of each stage
    (one group through pad, windows, roll and back) and each MLP's hidden units stay permuted."""
    model, _, spec = model_and_spec("swin_tiny_patch4_window7_224")
    assert not spec.heads
    assert spec.axes["layers.0.blocks.0.attn.qkv.weight"][0] is None
    stream = spec.axes["layers.0.blocks.0.mlp.fc2.weight"][0]
    assert stream == spec.axes["layers.0.blocks.1.attn.proj.weight"][0] == spec.axes["patch_embed.proj.weight"][0]
    # patch merging: (2 × 2 × C) flattened, the stream's permutation on each of the four copies of the channels
    merged = spec.axes["layers.1.downsample.reduction.weight"][1]
    assert merged == (Segment(stream, 16),) * 4
    assert len(spec.groups) == 6  # two streams, four MLPs
    pinned = {(p.where, p.places[0]) for p in spec.pinned}  # said where and why: the bias added to the logits
    assert ("layers.0.blocks.0.attn", ("layers.0.blocks.0.attn.qkv.weight", 0)) in pinned and len(pinned) == 4
    assert not any(p.stream for p in spec.pinned)  # q/k written by two layers, per head: no residual stream


def test_convnext_keeps_every_stage_stream_through_its_reshaped_layer_scale():
    """timm's ConvNeXt multiplies by ``gamma.reshape(1, -1, 1, 1)``: the reshape keeps the channel axis, so the
    layer scale is permuted with its stage's stream (which was pinned, all four stages, before); permuting
    the layer scales alone changes the logits."""
    model, x, spec = model_and_spec("convnext_atto")
    state, y = model.state_dict(), logits(model, x)
    stream = spec.axes["stages.0.blocks.0.gamma"][0]
    assert spec.pinned == () and stream == spec.axes["stem.0.weight"][0] == spec.axes["stages.0.blocks.1.gamma"][0]
    assert sum(any(e is not None for e in axes) for axes in spec.axes.values()) == 127  # of 128 (the head's bias)
    gammas = {k: v.flip(0) for k, v in state.items() if k.endswith("gamma")}
    twin = permuted(model, spec, seed=0)
    twin.load_state_dict(state | gammas)
    assert relative_change(y, logits(twin, x)) > 1e-3


class Grouped(nn.Module):
    def __init__(self, groups: int, functional: bool) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 8, 3), nn.GroupNorm(groups, 8), nn.Linear(8, 5)
        self.functional = functional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if self.functional:
            h = nn.functional.group_norm(h, self.norm.num_groups, self.norm.weight, self.norm.bias)
        else:
            h = self.norm(h)
        return self.head(torch.relu(h).mean((2, 3)))


@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
@pytest.mark.parametrize("groups,block", [(4, 2), (1, 1), (8, 1)])
def test_group_norm_permutes_whole_runs_of_channels_and_a_run_split_changes_it(groups, block, functional):
    """G runs of 8/G channels share their statistics: permuting whole runs keeps them (the group is
    coarsened to blocks of 8/G; one run or one channel per run: any permutation); moving one channel into
    another run changes them."""
    torch.manual_seed(0)
    model, x = randomised(Grouped(groups, functional), (3, 8, 8)), inputs((3, 8, 8), 3, seed=1)
    spec = trace_spec(model, x)
    entry = spec.axes["conv.weight"][0]
    assert entry == ((Segment(entry[0].group, 8, block),) if block > 1 else entry) and entry[0] is not None
    y = logits(model, x)
    assert all(relative_change(y, logits(permuted(model, spec, seed), x)) <= 1e-10 for seed in (1, 2))
    if groups == 4:  # channels 1 and 2 (of runs 0 and 1) swapped everywhere: the statistics change
        swap, state = torch.tensor([0, 2, 1, 3, 4, 5, 6, 7]), model.state_dict()
        wrong = {k: state[k][swap] for k in ("conv.weight", "conv.bias", "norm.weight", "norm.bias")}
        twin = permuted(model, spec, seed=0)
        twin.load_state_dict(state | wrong | {"head.weight": state["head.weight"][:, swap]})
        assert relative_change(y, logits(twin, x)) > 1e-6


class Spatial(nn.Module):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.conv, self.head, self.op = nn.Conv2d(3, 4, 1), nn.Linear(4, 2), op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        h = {
            "roll-spatial": lambda: torch.roll(h, (1, 2), (2, 3)),
            "pad-spatial": lambda: nn.functional.pad(h, (1, 1, 2, 0)),
            "roll-channels": lambda: torch.roll(h, 1, 1),
            "roll-all": lambda: torch.roll(h, 1),
            "pad-channels": lambda: nn.functional.pad(h, (0, 0, 0, 0, 1, -1)),  # one channel in, one out
        }[self.op]()
        return self.head(h.mean((2, 3)))


@pytest.mark.parametrize("op", ["roll-spatial", "pad-spatial"])
def test_pad_and_roll_of_unpermuted_axes_carry_the_channels(op):
    model, x = randomised(Spatial(op), (3, 6, 6)), inputs((3, 6, 6), 3, seed=1)
    spec = trace_spec(model, x)
    assert spec.axes["conv.weight"][0] == spec.axes["head.weight"][1] is not None
    assert relative_change(logits(model, x), logits(permuted(model, spec, 1), x)) <= 1e-10


@pytest.mark.parametrize("op", ["roll-channels", "roll-all", "pad-channels"])
def test_pad_and_roll_of_a_permuted_axis_are_refused_in_one_line(op):
    with pytest.raises(
        TraceError, match=r"node '(roll|pad)': (roll|pad) in \(top level\) .* along a permuted axis"
    ) as e:
        trace_spec(Spatial(op).eval(), torch.zeros(2, 3, 6, 6))
    assert "\n" not in str(e.value)


def test_torchvision_swin_is_traced_through_export_past_the_function_torch_fx_keeps_whole():
    """torchvision's ``shifted_window_attention`` is wrapped (``torch.fx.wrap``): one node of the fx graph, no
    inside to follow; the trace falls back to ``torch.export``, which records its operations. Its relative
    position bias pins each block's head order (so its q/k/v groups); the stream and MLP groups are permuted."""
    torchvision = pytest.importorskip("torchvision")
    from lmclab.trace.export import wrapped_calls

    model = torchvision.models.swin_t(weights=None, num_classes=10).eval()
    assert "shifted_window_attention" in wrapped_calls(torch.fx.symbolic_trace(model))
    spec = trace_spec(model, torch.zeros(1, 3, 32, 32))
    stream = spec.axes["features.1.0.norm1.weight"][0]
    assert stream is not None and spec.axes["features.1.0.attn.qkv.weight"] == (None, stream) and not spec.heads
    assert spec.axes["features.1.0.mlp.0.weight"][1] == stream != spec.axes["features.1.0.mlp.0.weight"][0]


def test_a_trace_leaves_levits_attention_bias_cache_as_it_was():
    """timm's LeViT caches its attention biases per device in eval mode: ``torch.fx`` left proxies there, and
    every later trace of the same model failed on them. The trace runs on a copy: twice the same outcome."""
    model = timm.create_model("levit_128s", pretrained=False, num_classes=10, img_size=64).eval()
    x = torch.randn(2, 3, 64, 64)
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(sorted(trace_spec(model, x).groups))
        except TraceError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1] and "does not run on inputs" not in str(outcomes[1])
    caches = [m.attention_bias_cache for m in model.modules() if hasattr(m, "attention_bias_cache")]
    assert caches and all(cache == {} for cache in caches)
    assert model(x).shape == (2, 10)
