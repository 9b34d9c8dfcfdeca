"""Models of different widths (lmclab.core.widths, lmclab.trace.widths): the narrower model embedded in the wider
one's widths computes its own function exactly where the tracer leaves the width free, and the trace fixes it
where an empty unit would count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.archs import build_model, make_config
from lmclab.core.spec import Segment, apply_permutation, build_spec, random_permutation
from lmclab.core.widths import check_free, narrower_groups, plain_sizes, widened
from lmclab.trace import trace

# (arch, wide options, narrow options, input shape): every group of the narrow one has fewer units
PAIRS = [
    ("mlp", {"width": 12}, {"width": 7}, (1, 6, 6)),
    ("vgg", {"layers": [8, "M", 16, "M"]}, {"layers": [5, "M", 9, "M"]}, (3, 32, 32)),
    ("resnet20", {"width_multiplier": 2}, {"width_multiplier": 1}, (3, 32, 32)),
]


def build(arch, options, shape, seed):
    config = make_config(arch, input_shape=list(shape), num_classes=10, **options)
    return build_model(arch, config, seed=seed).double().eval()


@pytest.mark.parametrize("arch,wide,narrow,shape", PAIRS, ids=[p[0] for p in PAIRS])
def test_the_embedded_narrow_model_computes_its_function_under_random_permutations(arch, wide, narrow, shape):
    big, small = build(arch, wide, shape, 0), build(arch, narrow, shape, 1)
    for module in small.modules():  # running statistics off their defaults: the embedding carries them too
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1), module.running_var.uniform_(0.5, 2)
    traced = trace(big, torch.zeros(2, *shape, dtype=torch.float64))
    spec, x = traced.spec, torch.randn(4, *shape, dtype=torch.float64)
    sizes, own = spec.group_sizes(big.state_dict()), plain_sizes(spec, small.state_dict())
    assert narrower_groups(sizes, own) == own and not traced.fixed  # every group narrower, none fixed
    perm = random_permutation(sizes, torch.Generator().manual_seed(2))
    big.load_state_dict(apply_permutation(spec, perm, widened(spec, small.state_dict(), sizes, own)))
    with torch.no_grad():
        assert torch.allclose(big(x), small(x), rtol=1e-10, atol=1e-12)


def test_gpt_mlp_units_may_differ_and_its_stream_and_heads_may_not():
    options = {"width": 16, "heads": 2, "depth": 2}
    config = make_config("gpt", input_shape=[8], num_classes=40, **options, mlp_ratio=4)
    small_config = make_config("gpt", input_shape=[8], num_classes=40, **options, mlp_ratio=2)
    big, small = (build_model("gpt", c, seed=s).double().eval() for c, s in ((config, 0), (small_config, 1)))
    traced = trace(big, torch.zeros(2, 8, dtype=torch.long))
    spec, tokens = traced.spec, torch.randint(0, 40, (3, 8))
    sizes, own = spec.group_sizes(big.state_dict()), plain_sizes(spec, small.state_dict())
    narrower = narrower_groups(sizes, own)
    assert sorted(narrower.values()) == [32, 32] and not set(narrower) & set(traced.fixed)
    stream = max(spec.groups, key=lambda g: len(spec.groups[g]))
    assert "LayerNorm" in traced.fixed[stream]
    assert set(spec.heads) <= set(traced.fixed)  # heads' features: their scale reads the width
    big.load_state_dict(widened(spec, small.state_dict(), sizes, own))
    with torch.no_grad():
        assert torch.allclose(big(tokens), small(tokens), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=f"model_b: group '{stream}' differs in width.*LayerNorm"):
        check_free({stream: 8}, traced.fixed)


class Gated(nn.Module):
    """A hidden group read by whatever ``read`` does to it, then by a linear layer."""

    def __init__(self, hidden: int, read) -> None:
        super().__init__()
        self.up, self.down, self.read = nn.Linear(3, hidden), nn.Linear(hidden, 2), read

    def forward(self, x):
        return self.down(self.read(self.up(x)))


@pytest.mark.parametrize(
    "read,reason",
    [
        (lambda h: torch.softmax(h, -1), "softmax"),
        (lambda h: h - h.mean(-1, keepdim=True), "a mean or sum over the units"),
        (lambda h: h / (h + 2), "a quotient by the units"),
        (lambda h: (h * h + 1).rsqrt(), "an operation that reads the units together"),
        (nn.LayerNorm(6), "LayerNorm"),
        (lambda h: h.pow(-1.0), "a power not finite at 0"),
    ],
    ids=["softmax", "mean", "quotient", "unknown", "layernorm", "power"],
)
def test_whatever_would_count_an_empty_unit_fixes_the_width(read, reason):
    traced = trace(Gated(6, read), torch.zeros(2, 3))
    assert len(traced.fixed) == 1 and reason in next(iter(traced.fixed.values()))


@pytest.mark.parametrize(
    "read",
    [torch.relu, lambda h: h * torch.sigmoid(h), lambda h: h.pow(3) + 2.0 * h, nn.GELU(), lambda h: h.sum(0)],
    ids=["relu", "silu", "power", "gelu", "sum-over-batch"],
)
def test_unit_by_unit_reads_leave_the_width_free_and_the_graph_numbers_are_recorded(read):
    traced = trace(Gated(6, read), torch.zeros(2, 3))
    assert traced.fixed == {}
    net = Gated(6, lambda h: h * 0.25)
    assert ("mul", 0.25) in trace(net, torch.zeros(2, 3)).scalars


def test_composite_axes_widen_segment_by_segment_and_sizes_are_solved_from_them():
    cat = (Segment("P", 6, 2), Segment(None, 3), Segment("Q", 4, 2))  # the wide model's: 3 and 2 units of 2
    spec = build_spec({"w": ("P", None), "v": ("Q", None), "cat": (None, cat)})
    small = {"w": torch.ones(2, 1), "v": 2 * torch.ones(1, 1), "cat": torch.arange(3 * 9.0).reshape(3, 9)}
    assert plain_sizes(spec, small) == {"P": 2, "Q": 1}
    wide = widened(spec, small, {"P": 3, "Q": 2}, {"P": 2, "Q": 1})
    assert wide["cat"].shape == (3, 13)  # P: 3 units of 2, 3 unpermuted, Q: 2 units of 2
    assert torch.equal(wide["cat"][:, :4], small["cat"][:, :4]) and wide["cat"][:, 4:6].abs().sum() == 0
    assert torch.equal(wide["cat"][:, 6:11], small["cat"][:, 4:9]) and wide["cat"][:, 11:].abs().sum() == 0
    only_cat = build_spec({"cat": (None, (Segment("P", 6, 2), Segment("Q", 4, 2))), "w": ("Q",)})
    assert plain_sizes(only_cat, {"cat": torch.zeros(1, 10), "w": torch.zeros(2)}) == {"Q": 2, "P": 3}


def test_refusals_name_the_group():
    with pytest.raises(ValueError, match="group 'P' has 5 units, more than the reference model's 4"):
        narrower_groups({"P": 4, "Q": 2}, {"P": 5, "Q": 2})
    with pytest.raises(ValueError, match=r"groups \['R'\] are not in both"):
        narrower_groups({"P": 4}, {"P": 4, "R": 1})
    assert narrower_groups({"P": 4, "Q": 3}, {"P": 4, "Q": 2}) == {"Q": 2}
    spec = build_spec({"a": ("P",), "b": ("P",)})
    with pytest.raises(ValueError, match="group 'P' has 3 units on axis 0 of 'b', 2 elsewhere"):
        plain_sizes(spec, {"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="axis 0 of 'a' has 2 entries, its groups' widths say 3"):
        widened(spec, {"a": torch.zeros(2), "b": torch.zeros(2)}, {"P": 4}, {"P": 3})
