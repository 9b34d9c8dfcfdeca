"""The tracer's rules off their common path: functional convolutions, norms over more than one axis,
single-piece splits, flattens from the batch axis, batch axes of products, concatenations and group
norms that cut segments, grouped-query attention without rotary positions, the exported graph's slices
and constant arguments, and the union-find's choice of root. Each case is either traced and invariant
in float64 under random permutations of its spec, or refused in one line naming the node."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace, trace_spec
from lmclab.trace.export import exported, wrapped_calls
from lmclab.trace.groups import FIXED, Groups


class Net(nn.Module):
    """Linears ``a`` (5 → 6), ``c`` (5 → 2), ``d`` (5 → 4), conv kernels as parameters, a tensor ``scale`` that is
    neither parameter nor buffer, a ``forward`` given as a function."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.a, self.c, self.d, self.head = nn.Linear(5, 6), nn.Linear(5, 2), nn.Linear(5, 4), nn.Linear(6, 3)
        self.conv_a, self.conv_b, self.conv_c = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 1)
        self.kernel = nn.Parameter(torch.randn(6, 3, 1, 1))  # 6 outputs, 2 groups of 3 inputs
        self.bias = nn.Parameter(torch.randn(6))
        self.norm = nn.GroupNorm(2, 6)
        self.rms, self.rms_2d = nn.RMSNorm(6), nn.RMSNorm((3, 6))
        self.scale = torch.linspace(0.5, 1.5, 6)  # a plain tensor attribute: no entry of the state_dict
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


def invariant(model: nn.Module, x: torch.Tensor, seeds: int = 3) -> PermutationSpec:
    """The traced spec, after checking in float64 that random permutations of it keep the output."""
    model, x = model.double(), x.double()
    spec = trace_spec(model, x)
    state = model.state_dict()
    with torch.no_grad():
        expected = model(x)
        for seed in range(seeds):
            perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
            model.load_state_dict(apply_permutation(spec, perm, state))
            assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()
        model.load_state_dict(state)
    return spec


def image_input() -> torch.Tensor:
    return torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))


def grouped_conv(m: Net, x: torch.Tensor) -> torch.Tensor:
    """``F.conv2d`` of the model's kernel in 2 groups of 3 channels, reading ``conv_b``'s 4 and 2 more."""
    h = torch.relu(torch.cat([m.conv_b(x), m.conv_a(x)], 1))
    return F.conv2d(h, m.kernel, m.bias, groups=2).mean((2, 3))


REFUSED = {
    "functional-conv-over-width": (
        lambda m, x: F.conv2d(m.a(x.reshape(2, 1, 3, 5)).expand(-1, 3, -1, -1), m.kernel),
        r"node 'conv2d': conv2d in \(top level\) .*\(a convolution over a permuted axis that is not its channel",
    ),
    "functional-grouped-conv-splitting-segments": (
        grouped_conv,
        r"node 'conv2d'.*\(a grouped convolution \(2 groups\) reading segments that split them\)",
    ),
    "functional-grouped-conv-of-the-input": (
        lambda m, x: F.conv2d(x, m.kernel, m.bias, groups=2).mean((2, 3)),
        r"node 'conv2d'.*\(a grouped convolution \(2 groups\) reading segments that split them\)",
    ),
    "layer-norm-over-two-axes": (
        lambda m, x: m.head(F.layer_norm(m.a(x), (3, 6)).mean(1)),
        r"node 'layer_norm'.*\(a LayerNorm or RMSNorm over more than the permuted feature axis\)",
    ),
    "layer-norm-of-a-plain-tensor-attribute": (  # torch.fx makes it a buffer of its graph module, not of the model
        lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.scale)),
        r"node 'layer_norm'.*\(a norm whose weight is not a parameter or buffer of the model\)",
    ),
    "rms-norm-over-two-axes": (
        lambda m, x: m.head(F.rms_norm(m.a(x), (3, 6)).mean(1)),
        r"node 'rms_norm'.*\(a LayerNorm or RMSNorm over more than the permuted feature axis\)",
    ),
    "rms-norm-module-over-two-axes": (
        lambda m, x: m.head(m.rms_2d(m.a(x)).mean(1)),
        r"node 'rms_2d': RMSNorm in rms_2d .*\(a LayerNorm or RMSNorm over more than the permuted feature axis\)",
    ),
    "group-norm-splitting-segments": (
        lambda m, x: m.norm(torch.cat([m.conv_a(x), m.conv_b(x)], 1)).mean((2, 3)),
        r"node 'norm': GroupNorm in norm .*\(a group norm over runs of channels that segments of the axis split\)",
    ),
    "concatenation-not-alike": (  # axis 2: one group of 6 beside two groups of 2 and 4
        lambda m, x: torch.cat([m.a(x), torch.cat([m.c(x), m.d(x)], -1)], 1),
        r"node 'cat_1'.*\(a concatenation of tensors permuted on another axis, not alike\)",
    ),
}
INPUTS = {
    "functional-grouped-conv-splitting-segments": image_input,
    "functional-grouped-conv-of-the-input": lambda: torch.randn(2, 6, 4, 4),
    "group-norm-splitting-segments": image_input,
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_rules_cannot_prove_is_refused_in_one_line(name):
    forward, message = REFUSED[name]
    x = INPUTS.get(name, lambda: torch.randn(2, 3, 5))()
    Net(forward)(x)  # it runs
    with pytest.raises(TraceError, match=message) as err:
        trace_spec(Net(forward), x)
    assert "\n" not in str(err.value)


def test_a_grouped_functional_conv_of_the_models_kernel_moves_whole_groups():
    """``F.conv2d(h, kernel, bias, groups=2)`` after a conv of 6 channels: the conv's group moves in runs of
    3 (one conv group), the kernel's outputs in runs of 3 alike, and the kernel's input axis stays put."""

    def grouped(m, x):
        return m.head(F.conv2d(torch.relu(m.conv_c(x)), m.kernel, m.bias, groups=2).mean((2, 3)))

    spec = invariant(Net(grouped), image_input())
    (c_out,), (k_out,) = spec.axes["conv_c.weight"][0], spec.axes["kernel"][0]
    assert (c_out.length, c_out.block, k_out.length, k_out.block) == (6, 3, 6, 3) and c_out.group == k_out.group
    assert spec.axes["kernel"][1] is None and spec.axes["bias"] == (spec.axes["kernel"][0],)


@pytest.mark.parametrize(
    "norm", [lambda m, h: m.rms(h), lambda m, h: F.rms_norm(h, (6,), m.rms.weight)], ids=["module", "function"]
)
def test_an_rms_norm_over_the_last_axis_takes_its_groups_layout_and_is_its_activation_point(norm):
    model = Net(lambda m, x: m.head(torch.relu(norm(m, m.a(x)))))
    with torch.no_grad():
        model.rms.weight.uniform_(0.5, 1.5)  # its scale must be permuted with the units
    spec = invariant(model, torch.randn(2, 3, 5))
    group = spec.axes["a.weight"][0]
    assert group is not None and spec.axes["rms.weight"] == (group,) and spec.axes["head.weight"] == (None, group)
    assert trace(Net(lambda m, x: m.head(torch.relu(m.rms(m.a(x))))), torch.randn(2, 3, 5)).points[group] == ["rms@-1"]


@pytest.mark.parametrize("method", ["add", "sub", "mul", "div", "add_", "mul_"])
def test_a_method_combining_two_tensors_of_the_same_units_keeps_their_group(method):
    """``h.div(g)`` and the like, as torch.fx records a method of a tensor: unit by unit, so one group."""
    model = Net(lambda m, x: m.head(getattr(torch.relu(m.a(x)), method)(torch.sigmoid(m.a(x)) + 1)))
    spec = invariant(model, torch.randn(2, 3, 5))
    assert spec.axes["a.weight"][0] is not None and spec.axes["head.weight"] == (None, spec.axes["a.weight"][0])


def test_a_split_into_one_piece_keeps_the_group():
    spec = invariant(Net(lambda m, x: m.head(torch.relu(torch.chunk(m.a(x), 1, dim=-1)[0]))), torch.randn(2, 3, 5))
    assert spec.axes["a.weight"][0] is not None and spec.axes["head.weight"] == (None, spec.axes["a.weight"][0])


def test_a_chunk_cutting_the_runs_of_a_group_norm_leaves_their_group_unpermuted():
    """``group_norm`` without affine parameters in 3 runs of 2 of conv_c's 6 channels (a coarse group held on no
    axis of its own), then ``chunk(2)``: a run straddles the halves, so the group is left unpermuted there."""

    def cut(m, x):
        a, b = F.group_norm(m.conv_c(x), 3).chunk(2, 1)
        return m.head(torch.cat([b, a], 1).mean((2, 3)))

    spec = invariant(Net(cut), image_input())
    assert spec.axes["conv_c.weight"][0] is None and spec.axes["head.weight"] == (None, None)
    assert [p.node for p in spec.pinned] == ["chunk"]


@pytest.mark.parametrize("flatten", [lambda h: torch.flatten(h), lambda h: h.flatten()], ids=["function", "method"])
def test_a_flatten_from_the_first_axis_keeps_the_permuted_last_one(flatten):
    """One sample ``(1, 6)`` flattened whole (``start_dim`` left at 0) is its 6 units in their order."""
    model = Net(lambda m, x: m.head(flatten(torch.relu(m.a(x)))))
    spec = invariant(model, torch.randn(1, 5))
    assert spec.axes["head.weight"] == (None, spec.axes["a.weight"][0]) and spec.axes["a.weight"][0] is not None


def test_a_batch_axis_pairing_permuted_units_with_an_unpermuted_operand_pins_them():
    """``(a's 6 units, 3, 5) @ (6 rows of the input, 5, 4)`` pairs unit ``i`` with row ``i``: summed over that
    axis afterwards, a permutation of the units changes the result, so their group is pinned."""

    def paired(m, x):  # x: (6, 3, 5)
        h = torch.relu(m.a(x)).permute(2, 1, 0)[:, :, :5]  # (6 units, 3, 5)
        return (h @ x.transpose(1, 2)[:, :5, :]).sum(0)

    model = Net(paired)
    spec = invariant(model, torch.randn(6, 3, 5))
    assert spec.axes["a.weight"] == (None, None)


def test_a_product_of_permuted_units_with_a_matrix_not_of_the_model_pins_them():
    """``relu(a(x)) @ ones(6, 4)`` sums a's units with weights that never move with them: their group is pinned
    (traced, not refused), and the product's columns are the constant's, unpermuted."""
    spec = invariant(Net(lambda m, x: torch.relu(m.a(x)) @ torch.ones(6, 4, dtype=x.dtype)), torch.randn(2, 3, 5))
    assert spec.axes["a.weight"] == (None, None) and spec.groups == {}


def test_a_product_keeps_the_rows_of_its_first_operand_permuted():
    """``(hᵀ @ M)ᵀ`` mixes the tokens of ``h`` by an unpermuted ``M`` (the input's own attention weights): each row of
    ``hᵀ`` is one of a's units, and stays that unit in the product, which ``head`` then reads."""

    def mixed(m, x):
        weights = torch.softmax(x @ x.transpose(-1, -2), -1)  # (2, 3, 3): of the input alone
        return m.head((torch.relu(m.a(x)).transpose(-1, -2) @ weights).transpose(-1, -2))

    spec = invariant(Net(mixed), torch.randn(2, 3, 5))
    group = spec.axes["a.weight"][0]
    assert group is not None and spec.axes["head.weight"] == (None, group)


def test_a_class_token_of_fewer_axes_expanded_before_a_concatenation_moves_with_the_units():
    """``bias`` (6,) expanded to (2, 1, 6) and put before a's tokens: its one axis is the concatenation's last."""
    model = Net(lambda m, x: m.head(torch.relu(torch.cat([m.bias.expand(x.shape[0], 1, 6), m.a(x)], 1))))
    spec = invariant(model, torch.randn(2, 3, 5))
    group = spec.axes["a.weight"][0]
    assert group is not None and spec.axes["bias"] == (group,) and spec.axes["head.weight"] == (None, group)


class GroupedQuery(nn.Module):
    """Attention with 4 query heads and 2 key/value heads of 4 features (each shared by 2 query heads, as
    ``repeat_kv``), learned positions and no rotary embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 8), nn.Linear(16, 16)
        self.position = nn.Parameter(torch.randn(9, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, 9, 16)
        b, t, _ = x.shape
        x = x + self.position
        q = self.q(x).reshape(b, t, 4, 4).transpose(1, 2)
        k, v = (p(x).reshape(b, t, 2, 4).transpose(1, 2) for p in (self.k, self.v))
        k, v = (y[:, :, None].expand(b, 2, 2, t, 4).reshape(b, 4, t, 4) for y in (k, v))
        o = torch.softmax(q @ k.transpose(-2, -1) / 2, dim=-1) @ v
        return self.out(o.transpose(1, 2).reshape(b, t, 16)) + x


def test_grouped_query_attention_without_rotary_positions_moves_whole_key_value_heads():
    """Query heads of 4 and key heads of 2 contract their features: no τ is shared by heads of different
    counts, so the per-head features stay in place; each key/value head moves whole, with its two query
    heads (a block of 8) and its two slices of ``out``'s input, all by one head order."""
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1))
    spec = invariant(GroupedQuery(), x)
    (q,), (k,), (v,), (o,) = (spec.axes[f"{p}.weight"][i] for p, i in (("q", 0), ("k", 0), ("v", 0), ("out", 1)))
    assert (q.length, q.block, k.length, k.block, v.block, o.block) == (16, 8, 8, 4, 4, 8) and o.group == v.group
    assert len({spec.heads[s.group].tie for s in (q, k, v)}) == 1 and spec.group_sizes(GroupedQuery().state_dict()) == {
        q.group: 2,
        k.group: 2,
        v.group: 2,
    }


class Sliced(nn.Module):
    """Slices with a start, a step and a negative start, slices past an end of the axis (empty, or the whole
    axis as Python reads them), a select, an unsqueeze and a squeeze, a constant made with keyword arguments
    (its dtype) and a constant ``use_cache`` argument it never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, use_cache: bool | None = None) -> torch.Tensor:
        h = self.a(x)  # (N, 5, 8)
        s = h[:, 1:4, 2:8:2].unsqueeze(1).squeeze(1)
        last, first = torch.cat([h[:, 5:], h[:, -2:]], 1), torch.cat([h[:, :-7], h[:, :1]], 1)  # rows 3, 4; row 0
        ends = last.mean(1, True) + 2 * first.mean(1, True) + 4 * h[:, -7:].mean(1, True)  # rows 0 to 4
        shift = torch.full((2,), 0.1, dtype=x.dtype)  # in float32 0.1 would be another number
        return self.b(s) + h[:, -3:, :][..., 0].unsqueeze(-1) + ends[..., :2] + shift


def test_the_exported_graph_computes_the_model_and_drops_constant_arguments():
    model, x = Sliced().double(), torch.randn(2, 5, 6, dtype=torch.float64)
    gm = exported(model, (x,), {})
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    (out,) = gm(x)
    assert torch.equal(out, model(x))


class Strided(nn.Module):
    """Every other unit of ``a`` read by ``b``; a branch on the input's shape that torch.fx cannot record, so
    the tracer reads the graph torch.export records."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 6:
            return x
        return self.b(self.a(x)[..., ::2])  # (N, 5, 8) → (N, 5, 4)


def test_a_strided_slice_of_the_whole_axis_is_read_with_its_step_by_the_export_path():
    """``h[..., ::2]`` starts at 0 and ends at the axis' length, yet keeps half of it: the exported graph
    computes the model, and the slice of a permuted axis is refused as picking units, not carried as ``:``."""
    model, x = Strided().double(), torch.randn(2, 5, 6, dtype=torch.float64)
    (out,) = exported(model, (x,))(x)
    assert torch.equal(out, model(x))
    message = r"^trace_spec: node 'slice_1': getitem .*\(an index that picks units of a permuted axis\)"
    with pytest.raises(TraceError, match=message):
        trace_spec(model, x)


@pytest.mark.parametrize("method", ["view_as", "reshape_as"])
def test_a_view_as_or_reshape_as_another_tensors_shape_keeps_the_permuted_axis(method):
    """``h.view_as(y)`` is ``h.view(y.shape)``: merging the batch axes keeps ``a``'s units on the last axis."""

    def forward(m, x):
        h = torch.relu(m.a(x))
        return m.head(getattr(h, method)(h.flatten(0, 1)))

    spec = invariant(Net(forward), torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)))
    assert spec.axes["a.weight"] == ("P_0", None) and spec.axes["head.weight"] == (None, "P_0")


class Normed(nn.Module):
    """A conv, ``nn.BatchNorm2d`` and a head, with a branch on the input's shape that torch.fx cannot record (the
    export path, where the norm is ``aten.batch_norm``), and ``nn.Embedding`` ids read the same way."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 6, 1), nn.BatchNorm2d(6), nn.Linear(6, 2)
        self.embed = nn.Embedding(10, 6)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 4:
            return x
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3))) + self.head(torch.relu(self.embed(ids)))


def test_the_export_path_reads_batch_norm_with_its_statistics_and_embedding_as_an_activation_point():
    torch.manual_seed(0)
    model = Normed().double().eval()
    with torch.no_grad():  # statistics and affine terms away from their defaults, so that their order counts
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.normal_()
    x, ids = image_input().double(), torch.randint(0, 10, (2,), generator=torch.Generator().manual_seed(1))
    (out,) = exported(model, (x, ids))(x, ids)
    assert torch.equal(out, model(x, ids))
    traced = trace(model, {"x": x, "ids": ids})
    group = traced.spec.axes["conv.weight"][0]
    assert group == traced.spec.axes["embed.weight"][1] == traced.spec.axes["head.weight"][1] is not None
    for key in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"):
        assert traced.spec.axes[key] == (group,)
    assert traced.points[group] == ["conv", "embed@-1"]


def test_a_union_roots_at_the_older_group_and_the_pinned_one_and_keeps_the_heads():
    groups = Groups()
    old, new, other = groups.new(), groups.new(), groups.new()
    assert groups.union(old, new) == old and groups.union(other, old) == old
    headed = groups.new()
    tie = groups.headed(headed, 4, 2)
    younger = groups.new()
    groups.union(younger, headed)  # the heads stay with the root
    assert groups.tie_of(younger) == tie and groups.heads[groups.find(younger)] == (4, tie)
    plain, headed_young = groups.new(), groups.new()
    tie2 = groups.headed(headed_young, 2, 3)
    groups.union(headed_young, plain)  # the older root takes the child's heads
    assert groups.find(headed_young) == plain and groups.heads[plain] == (2, tie2)
    assert groups.union(new, FIXED) == FIXED and groups.union(FIXED, other) == FIXED
    lone = groups.new()  # a head order joins no group, a group of 4 heads none of 2; an element joins itself
    assert not groups.joinable(tie, lone) and not groups.joinable(younger, plain) and groups.joinable(tie, tie)
    assert groups.joinable(headed, younger) and groups.joinable(lone, FIXED)
    groups.make_rigid(plain)  # the heads taken over keep their size: moved whole, in runs of 3 features
    assert groups.coarse[plain][1] == 3 and groups.heads[groups.find(groups.coarse[plain][0])] == (2, tie2)


class CrossAttention(nn.Module):
    """``nn.MultiheadAttention`` with options (``kdim``/``vdim``: keys and values of their own widths, separate
    q/k/v projections; ``add_bias_kv``, ``add_zero_attn``: extra keys), on one Linear's units."""

    def __init__(self, **options) -> None:
        super().__init__()
        self.proj, self.attn = nn.Linear(16, 16), nn.MultiheadAttention(16, 4, batch_first=True, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        kv = x[..., :8] if self.attn.kdim == 8 else h
        return self.attn(h, kv, kv)[0]


@pytest.mark.parametrize(
    "options",
    [{"kdim": 8, "vdim": 8}, {"add_bias_kv": True}, {"add_zero_attn": True}],
    ids=["separate-projections", "bias-kv", "zero-attn"],
)
def test_multihead_attention_with_separate_projections_or_extra_keys_is_refused_naming_the_module(options):
    with pytest.raises(
        TraceError,
        match=r"^trace_spec: node 'attn': MultiheadAttention in attn cannot be proved permutation-equivariant "
        r"\(a MultiheadAttention with separate q/k/v projections or extra keys\); pass",
    ):
        trace_spec(CrossAttention(**options), torch.zeros(2, 9, 16))


def test_the_tracer_loads_no_torchvision_and_still_carries_its_stochastic_depth():
    """torchvision costs every `lmclab` command about 2 s to import: the tracer knows its stochastic depth (whole
    samples dropped, never channels) only once a model has loaded it, and a model that calls it has."""
    import subprocess
    import sys

    code = "import sys, lmclab.trace, lmclab.cli; print('torchvision' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"
    from torchvision.ops import StochasticDepth  # calls stochastic_depth, a leaf of torch.fx (torch.fx.wrap)

    class Dropped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.drop, self.head = nn.Linear(4, 6), StochasticDepth(0.5, "row"), nn.Linear(6, 2)

        def forward(self, x):
            return self.head(self.drop(torch.relu(self.inner(x))))

    spec = trace_spec(Dropped().eval(), torch.zeros(2, 4))
    assert spec.axes["inner.weight"][0] is not None and spec.axes["head.weight"][1] == spec.axes["inner.weight"][0]


class TwoInputs(nn.Module):
    """Two inputs with an argument of default ``None`` between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, 6), nn.Linear(3, 6), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None, y: torch.Tensor | None = None):
        h = torch.relu(self.a(x)) + self.b(y)
        return self.head(h if scale is None else h * scale)


def test_inputs_given_as_a_dict_are_forwards_arguments_by_name():
    """torch.fx takes them in signature order, the defaults between filled in: ``b``'s output joins ``a``'s."""
    torch.manual_seed(0)
    model = TwoInputs().double()
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    spec = trace_spec(model, {"y": y, "x": x})  # torch.fx's own check of the default is no hidden function
    assert wrapped_calls(torch.fx.symbolic_trace(model, concrete_args={"scale": None})) == []
    assert spec.axes["a.weight"] == spec.axes["b.weight"] == ("P_0", None) and spec.axes["head.weight"][1] == "P_0"
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x, y=y)
        model.load_state_dict(apply_permutation(spec, perm, model.state_dict()))
        assert (model(x, y=y) - expected).abs().max() <= 1e-12 * expected.abs().max()


class InputConv1D(nn.Module):
    """GPT-2's ``Conv1D`` (weight stored ``(in, out)``, ``torch.addmm``) reading the model's own input, with a
    branch on the input's shape that torch.fx cannot record: the exported graph's ``aten.addmm``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(5, 6)), nn.Parameter(torch.randn(6))
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 5:
            return x
        return self.head(torch.relu(torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)))


def test_an_addmm_of_the_models_unpermuted_input_writes_a_new_group():
    """The input is never permuted: the Conv1D's output units are a new group, its rows left alone."""
    spec = invariant(InputConv1D(), torch.randn(4, 5, generator=torch.Generator().manual_seed(0)))
    assert spec.axes["weight"] == (None, "P_0") and spec.axes["bias"] == ("P_0",)
    assert spec.axes["head.weight"] == (None, "P_0")


class Forms(Net):
    """:class:`Net` with the layers the call-form families read: a Linear of 12 (a flatten of two samples of 6),
    of 96 (6 channels of 4 × 4), a conv of 3 channels (the kernel's input), a LayerNorm and a BatchNorm of 6, a
    packed ``qkv`` (2 heads of 4) with its output projection, and a MultiheadAttention of 8 on a Linear's units."""

    def __init__(self, forward) -> None:
        super().__init__(forward)
        self.flat, self.img, self.conv_3 = nn.Linear(12, 3), nn.Linear(96, 3), nn.Conv2d(3, 3, 1)
        self.ln, self.bn = nn.LayerNorm(6), nn.BatchNorm2d(6).eval()
        self.qkv, self.out, self.inp = nn.Linear(8, 24), nn.Linear(8, 8), nn.Linear(8, 8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.full((3, 3), -1e9), 1), persistent=False)  # along no head
        vectors = [
            self.ln.weight,
            self.ln.bias,
            self.bn.weight,
            self.bn.bias,
            self.bn.running_mean,
            self.bn.running_var,
        ]
        with torch.no_grad():
            for p in [*vectors, self.rms.weight, self.norm.weight, self.norm.bias]:
                p.uniform_(0.5, 1.5)  # vectors that must move with the units: not ones, not zeros


def swapped(pieces: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The two halves of the units, the second first."""
    return torch.cat([pieces[1], pieces[0]], -1)


def added(pieces: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The two pieces summed (``sum`` of the tuple would iterate what torch.fx records as one value)."""
    return pieces[0] + pieces[1]


def qkv_parts(m: Forms, x: torch.Tensor) -> torch.Tensor:
    """``(3, B, H, T, d)``: the packed projection's parts, heads and tokens."""
    return m.qkv(x).reshape(2, 3, 3, 2, 4).permute(2, 0, 3, 1, 4)


def merged_heads(o: torch.Tensor) -> torch.Tensor:
    return o.transpose(1, 2).flatten(2)


def attend(m: Forms, x: torch.Tensor, sdpa, unbind=lambda p: p.unbind(0)) -> torch.Tensor:
    """``sdpa(q, k, v)`` of the packed parts (``unbind``), merged back and projected."""
    q, k, v = unbind(qkv_parts(m, x))
    return m.out(merged_heads(sdpa(q, k, v)))


def unfused(m: Forms, x: torch.Tensor, softmax) -> torch.Tensor:
    q, k, v = qkv_parts(m, x).unbind(0)
    return m.out(merged_heads(softmax(q @ k.transpose(-2, -1)) @ v))


def square_norm(m: Forms, x: torch.Tensor, square, mean) -> torch.Tensor:
    """RMSNorm written out, without gain: ``h · rsqrt(mean(h², units) + ε)``."""
    h = m.a(x)
    return m.head(h * torch.rsqrt(mean(square(h)) + 1e-6))


SDPA = F.scaled_dot_product_attention
SEQ, FLAT, TOKENS = (lambda: torch.randn(2, 3, 5)), (lambda: torch.randn(2, 5)), (lambda: torch.randn(2, 3, 8))
# each family: its input and the forms of one call (positional, keyword, method, default, negative dims)
FORMS = {
    "flatten-from-the-channels": (
        image_input,
        [
            lambda m, x: m.img(torch.flatten(torch.relu(m.conv_c(x)), 1)),
            lambda m, x: m.img(torch.flatten(torch.relu(m.conv_c(x)), start_dim=1)),
            lambda m, x: m.img(torch.relu(m.conv_c(x)).flatten(1)),
            lambda m, x: m.img(torch.relu(m.conv_c(x)).flatten(start_dim=-3)),
            lambda m, x: m.img(torch.flatten(torch.relu(m.conv_c(x)), 1, -1)),
            lambda m, x: m.img(torch.flatten(torch.relu(m.conv_c(x)), 1, end_dim=3)),
            lambda m, x: m.img(torch.relu(m.conv_c(x)).flatten(-3, -1)),
        ],
    ),
    "flatten-whole": (
        FLAT,
        [
            lambda m, x: m.flat(torch.flatten(torch.relu(m.a(x)))),
            lambda m, x: m.flat(torch.flatten(torch.relu(m.a(x)), 0)),
            lambda m, x: m.flat(torch.relu(m.a(x)).flatten()),
            lambda m, x: m.flat(torch.relu(m.a(x)).flatten(end_dim=-1)),
            lambda m, x: m.flat(torch.relu(m.a(x)).flatten(-2, 1)),
            lambda m, x: m.flat(torch.flatten(torch.relu(m.a(x)), start_dim=0, end_dim=1)),
        ],
    ),
    "flatten-before-the-units": (
        SEQ,
        [
            lambda m, x: m.head(torch.flatten(torch.relu(m.a(x)), 0, 1)),
            lambda m, x: m.head(torch.relu(m.a(x)).flatten(end_dim=1)),
            lambda m, x: m.head(torch.relu(m.a(x)).flatten(0, -2)),
            lambda m, x: m.head(torch.flatten(torch.relu(m.a(x)), end_dim=-2)),
            lambda m, x: m.head(torch.relu(m.a(x)).flatten(start_dim=-3, end_dim=-2)),
        ],
    ),
    "cat-of-the-units": (
        SEQ,
        [
            lambda m, x: m.head(torch.relu(torch.cat([m.c(x), m.d(x)], 2))),
            lambda m, x: m.head(torch.relu(torch.cat([m.c(x), m.d(x)], dim=-1))),
            lambda m, x: m.head(torch.relu(torch.concat((m.c(x), m.d(x)), -1))),
            lambda m, x: m.head(torch.relu(torch.concatenate([m.c(x), m.d(x)], axis=2))),
            lambda m, x: m.head(torch.relu(torch.cat([m.c(x), m.d(x)], axis=-1))),
        ],
    ),
    "cat-of-the-samples": (
        FLAT,
        [
            lambda m, x: m.head(torch.relu(torch.cat([m.a(x), m.a(2 * x)]))),
            lambda m, x: m.head(torch.relu(torch.cat([m.a(x), m.a(2 * x)], 0))),
            lambda m, x: m.head(torch.relu(torch.cat([m.a(x), m.a(2 * x)], dim=-2))),
            lambda m, x: m.head(torch.relu(torch.concatenate([m.a(x), m.a(2 * x)]))),
        ],
    ),
    "split-of-the-units": (
        SEQ,
        [
            lambda m, x: m.head(swapped(torch.split(torch.relu(m.a(x)), 3, 2))),
            lambda m, x: m.head(swapped(torch.split(torch.relu(m.a(x)), 3, dim=-1))),
            lambda m, x: m.head(swapped(torch.relu(m.a(x)).split(3, -1))),
            lambda m, x: m.head(swapped(torch.relu(m.a(x)).split([3, 3], dim=2))),
            lambda m, x: m.head(swapped(torch.chunk(torch.relu(m.a(x)), 2, -1))),
            lambda m, x: m.head(swapped(torch.relu(m.a(x)).chunk(2, dim=2))),
            lambda m, x: m.head(swapped(torch.split(torch.relu(m.a(x)), split_size_or_sections=3, dim=2))),
            lambda m, x: m.head(swapped(torch.relu(m.a(x)).split(split_size=3, dim=-1))),
            lambda m, x: m.head(swapped(torch.relu(m.a(x)).chunk(chunks=2, dim=-1))),
        ],
    ),
    "split-of-the-samples": (
        FLAT,
        [
            lambda m, x: m.head(torch.relu(added(torch.split(m.a(x), 1)))),
            lambda m, x: m.head(torch.relu(added(torch.split(m.a(x), 1, 0)))),
            lambda m, x: m.head(torch.relu(added(m.a(x).split(1, dim=-2)))),
            lambda m, x: m.head(torch.relu(added(m.a(x).chunk(2)))),
            lambda m, x: m.head(torch.relu(added(torch.chunk(m.a(x), 2, dim=0)))),
        ],
    ),
    "move-of-the-units": (
        SEQ,
        [
            lambda m, x: m.head(torch.relu(m.a(x)).transpose(1, 2).mean(-1)),
            lambda m, x: m.head(torch.relu(m.a(x)).transpose(-1, -2).mean(-1)),
            lambda m, x: m.head(torch.transpose(torch.relu(m.a(x)), dim0=2, dim1=1).mean(-1)),
            lambda m, x: m.head(torch.relu(m.a(x)).transpose(dim0=1, dim1=2).mean(-1)),
            lambda m, x: m.head(torch.swapaxes(torch.relu(m.a(x)), axis0=1, axis1=-1).mean(-1)),
            lambda m, x: m.head(torch.relu(m.a(x)).permute(0, 2, 1).mean(-1)),
            lambda m, x: m.head(torch.relu(m.a(x)).permute(dims=(0, -1, 1)).mean(-1)),
            lambda m, x: m.head(torch.permute(torch.relu(m.a(x)), dims=[0, 2, 1]).mean(-1)),
        ],
    ),
    "mean-over-the-pixels": (
        image_input,
        [
            lambda m, x: m.head(m.conv_c(x).mean((2, 3))),
            lambda m, x: m.head(m.conv_c(x).mean((-1, -2))),
            lambda m, x: m.head(m.conv_c(x).mean(dim=(2, 3))),
            lambda m, x: m.head(torch.mean(m.conv_c(x), (2, -1))),
            lambda m, x: m.head(torch.mean(m.conv_c(x), dim=[-2, -1])),
            lambda m, x: m.head(torch.mean(m.conv_c(x), dim=(2, 3), keepdim=False)),
            lambda m, x: m.head(m.conv_c(x).mean(axis=(2, 3))),
        ],
    ),
    "sum-of-everything": (
        FLAT,
        [
            lambda m, x: m.a(x).sum(),
            lambda m, x: torch.sum(m.a(x)),
            lambda m, x: m.a(x).sum((0, 1)),
            lambda m, x: torch.sum(m.a(x), dim=(0, -1)),
            lambda m, x: m.a(x).sum(axis=(-2, 1)),
        ],
    ),
    "mean-of-a-gain-over-the-tokens": (
        SEQ,
        [
            lambda m, x: m.head(m.rms(m.a(x)).mean(1)),
            lambda m, x: m.head(m.rms(m.a(x)).mean(dim=1)),
            lambda m, x: m.head(m.rms(m.a(x)).mean(-2)),
            lambda m, x: m.head(torch.mean(m.rms(m.a(x)), 1)),
            lambda m, x: m.head(torch.mean(m.rms(m.a(x)), dim=(-2,))),
            lambda m, x: m.head(m.rms(m.a(x)).mean(axis=1)),
        ],
    ),
    "mean-of-a-square": (
        SEQ,
        [
            lambda m, x: square_norm(m, x, lambda h: h.pow(2), lambda s: s.mean(-1, keepdim=True)),
            lambda m, x: square_norm(m, x, lambda h: h**2, lambda s: s.mean(2, True)),
            lambda m, x: square_norm(m, x, lambda h: h * h, lambda s: s.mean(dim=-1, keepdim=True)),
            lambda m, x: square_norm(m, x, lambda h: torch.pow(h, 2), lambda s: torch.mean(s, -1, keepdim=True)),
            lambda m, x: square_norm(m, x, lambda h: h.pow(exponent=2), lambda s: torch.mean(s, (2,), True)),
            lambda m, x: square_norm(m, x, lambda h: torch.pow(h, exponent=2), lambda s: s.mean((-1,), True)),
        ],
    ),
    "functional-linear": (
        SEQ,
        [
            lambda m, x: m.head(torch.relu(F.linear(x, m.a.weight, m.a.bias))),
            lambda m, x: m.head(torch.relu(F.linear(x, m.a.weight, bias=m.a.bias))),
            lambda m, x: m.head(torch.relu(F.linear(x, weight=m.a.weight, bias=m.a.bias))),
            lambda m, x: m.head(torch.relu(F.linear(input=x, weight=m.a.weight, bias=m.a.bias))),
        ],
    ),
    "layer-norm": (
        SEQ,
        [
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight, m.ln.bias)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight, bias=m.ln.bias)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), weight=m.ln.weight, bias=m.ln.bias)),
            lambda m, x: m.head(F.layer_norm(m.a(x), normalized_shape=[6], weight=m.ln.weight, bias=m.ln.bias)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight, m.ln.bias, 1e-5)),
        ],
    ),
    "layer-norm-without-bias": (
        SEQ,
        [
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), weight=m.ln.weight)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight, None)),
            lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.ln.weight, bias=None, eps=1e-5)),
        ],
    ),
    "rms-norm": (
        SEQ,
        [
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), m.rms.weight)),
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), weight=m.rms.weight)),
            lambda m, x: m.head(F.rms_norm(m.a(x), normalized_shape=[6], weight=m.rms.weight, eps=1e-6)),
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), m.rms.weight, 1e-6)),
        ],
    ),
    "rms-norm-without-gain": (
        SEQ,
        [
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,))),
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), None)),
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), weight=None)),
            lambda m, x: m.head(F.rms_norm(m.a(x), (6,), None, 1e-6)),
        ],
    ),
    "batch-norm": (
        image_input,
        [
            lambda m, x: m.head(
                F.batch_norm(m.conv_c(x), m.bn.running_mean, m.bn.running_var, m.bn.weight, m.bn.bias).mean((2, 3))
            ),
            lambda m, x: m.head(
                F.batch_norm(m.conv_c(x), m.bn.running_mean, m.bn.running_var, weight=m.bn.weight, bias=m.bn.bias).mean(
                    (2, 3)
                )
            ),
            lambda m, x: m.head(
                F.batch_norm(
                    m.conv_c(x),
                    running_mean=m.bn.running_mean,
                    running_var=m.bn.running_var,
                    weight=m.bn.weight,
                    bias=m.bn.bias,
                    training=False,
                ).mean((2, 3))
            ),
        ],
    ),
    "group-norm": (
        image_input,
        [
            lambda m, x: m.head(F.group_norm(m.conv_c(x), 2, m.norm.weight, m.norm.bias).mean((2, 3))),
            lambda m, x: m.head(F.group_norm(m.conv_c(x), 2, weight=m.norm.weight, bias=m.norm.bias).mean((2, 3))),
            lambda m, x: m.head(
                F.group_norm(m.conv_c(x), num_groups=2, weight=m.norm.weight, bias=m.norm.bias).mean((2, 3))
            ),
        ],
    ),
    "grouped-conv": (
        image_input,
        [
            lambda m, x: m.head(F.conv2d(m.conv_c(x), m.kernel, m.bias, groups=2).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_c(x), m.kernel, m.bias, 1, 0, 1, 2).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_c(x), m.kernel, bias=m.bias, stride=1, groups=2).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_c(x), weight=m.kernel, bias=m.bias, groups=2).mean((2, 3))),
        ],
    ),
    "conv-of-one-group": (
        image_input,
        [
            lambda m, x: m.head(F.conv2d(m.conv_3(x), m.kernel, m.bias).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_3(x), m.kernel, m.bias, groups=1).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_3(x), m.kernel, m.bias, 1, 0, 1, 1).mean((2, 3))),
            lambda m, x: m.head(F.conv2d(m.conv_3(x), m.kernel, bias=m.bias, padding=0).mean((2, 3))),
        ],
    ),
    "roll-of-the-samples": (
        SEQ,
        [
            lambda m, x: m.head(torch.roll(torch.relu(m.a(x)), 1, 0)),
            lambda m, x: m.head(torch.relu(m.a(x)).roll(1, 0)),
            lambda m, x: m.head(torch.roll(torch.relu(m.a(x)), shifts=1, dims=0)),
            lambda m, x: m.head(torch.relu(m.a(x)).roll(1, dims=-3)),
            lambda m, x: m.head(torch.roll(torch.relu(m.a(x)), (1, 1), (0, -2))),
        ],
    ),
    "pad-of-the-pixels": (
        image_input,
        [
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), (1, 1)).mean((2, 3))),
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), pad=(1, 1)).mean((2, 3))),
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), [1, 1, 0, 0], "constant", 0.0).mean((2, 3))),
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), (1, 1), mode="constant").mean((2, 3))),
        ],
    ),
    "unbind-of-the-parts": (
        TOKENS,
        [
            lambda m, x: attend(m, x, SDPA, lambda p: p.unbind(0)),
            lambda m, x: attend(m, x, SDPA, lambda p: p.unbind()),
            lambda m, x: attend(m, x, SDPA, lambda p: torch.unbind(p)),
            lambda m, x: attend(m, x, SDPA, lambda p: torch.unbind(p, dim=0)),
            lambda m, x: attend(m, x, SDPA, lambda p: p.unbind(dim=-5)),
            lambda m, x: attend(m, x, SDPA, lambda p: torch.unbind(p, axis=0)),
        ],
    ),
    "fused-attention": (
        TOKENS,
        [
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, value=v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(query=q, key=k, value=v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, None, 0.0, True)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, is_causal=True)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, m.mask)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, attn_mask=m.mask, scale=0.5)),
        ],
    ),
    "softmax-over-the-keys": (
        TOKENS,
        [
            lambda m, x: unfused(m, x, lambda s: s.softmax(-1)),
            lambda m, x: unfused(m, x, lambda s: s.softmax(dim=3)),
            lambda m, x: unfused(m, x, lambda s: torch.softmax(s, -1)),
            lambda m, x: unfused(m, x, lambda s: torch.softmax(s, dim=-1)),
            lambda m, x: unfused(m, x, lambda s: F.softmax(s, 3)),
            lambda m, x: unfused(m, x, lambda s: F.softmax(s, dim=-1)),
            lambda m, x: unfused(m, x, lambda s: torch.softmax(s, axis=-1)),
        ],
    ),
    "multihead-attention": (
        TOKENS,
        [
            lambda m, x: m.out(torch.relu(m.mha(torch.relu(m.inp(x)), torch.relu(m.inp(x)), torch.relu(m.inp(x)))[0])),
            lambda m, x: m.out(torch.relu(m.mha(*[torch.relu(m.inp(x))] * 2, value=torch.relu(m.inp(x)))[0])),
            lambda m, x: m.out(torch.relu(m.mha(torch.relu(m.inp(x)), key=(h := torch.relu(m.inp(x))), value=h)[0])),
            lambda m, x: m.out(torch.relu(m.mha(query=(h := torch.relu(m.inp(x))), key=h, value=h)[0])),
            lambda m, x: m.out(torch.relu(m.mha(*[torch.relu(m.inp(x))] * 3, need_weights=False)[0])),
        ],
    ),
}
# each family: its input, the forms of one call the rules refuse, and the reason they give
REFUSED_FORMS = {
    "roll-of-the-units": (
        SEQ,
        [
            lambda m, x: m.head(torch.roll(torch.relu(m.a(x)), 1, -1)),
            lambda m, x: m.head(torch.relu(m.a(x)).roll(1, 2)),
            lambda m, x: m.head(torch.roll(torch.relu(m.a(x)), shifts=1, dims=2)),
            lambda m, x: m.head(torch.relu(m.a(x)).roll(1)),  # no dims: every axis, flattened
        ],
        "a roll along a permuted axis",
    ),
    "pad-of-the-channels": (
        image_input,
        [
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), (0, 0, 0, 0, 1, 0))[:, 1:].mean((2, 3))),
            lambda m, x: m.head(F.pad(torch.relu(m.conv_c(x)), pad=[0, 0, 0, 0, 1, 0])[:, 1:].mean((2, 3))),
        ],
        "a pad along a permuted axis",
    ),
    "softmax-over-the-heads-of-per-head-features": (
        TOKENS,
        [
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q.softmax(1), k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q.softmax(dim=-3), k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(torch.softmax(q, -3), k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(F.softmax(q, dim=1), k, v)),
        ],
        "a softmax across heads whose features are permuted per head",
    ),
    "unbind-of-the-heads": (
        TOKENS,
        [
            lambda m, x: m.out(merged_heads(torch.stack(qkv_parts(m, x).unbind(2), 2)[0])),
            lambda m, x: m.out(merged_heads(torch.stack(qkv_parts(m, x).unbind(dim=-3), 2)[0])),
            lambda m, x: m.out(merged_heads(torch.stack(torch.unbind(qkv_parts(m, x), 2), 2)[0])),
            lambda m, x: m.out(merged_heads(torch.stack(torch.unbind(qkv_parts(m, x), axis=2), 2)[0])),
        ],
        "an unbind along an axis that is not the packed part axis",
    ),
    "grouped-query-attention": (
        TOKENS,
        [lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, enable_gqa=True))],  # a keyword only
        "grouped-query attention (keys shared by several query heads)",
    ),
    "split-of-per-head-features": (
        TOKENS,
        [
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(torch.cat(q.split(2, -1), -1), k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(torch.cat(torch.split(q, 2, dim=3), -1), k, v)),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(torch.cat(q.chunk(2, dim=-1), -1), k, v)),
        ],
        "a split of each head's features into q, k, v packed head by head: their rows interleave per head, which no "
        "headed group (one run of heads × features) can hold",
    ),
    "permuted-attention-mask": (
        TOKENS,
        [
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, q @ k.transpose(-2, -1))),
            lambda m, x: attend(m, x, lambda q, k, v: SDPA(q, k, v, attn_mask=q @ k.transpose(-2, -1))),
        ],
        "an attention mask that is permuted",
    ),
}


def traced_forms(model: nn.Module, x: torch.Tensor) -> tuple[PermutationSpec, dict[str, str]]:
    """The spec for orthogonal maps (the permutation spec's axes, with kinds and gains) and its kind reasons with
    the node names left out (a method and its function, or the exported graph, may name them apart)."""
    ortho = trace_spec(model, x, symmetry="orthogonal")
    return ortho, {g: re.sub(r"node '\w+'", "node", r) for g, r in ortho.kind_reasons.items()}


@pytest.mark.parametrize("family", sorted(FORMS))
def test_every_call_form_of_an_operation_gives_one_spec(family):
    """Positional, keyword, method, default and negative-index forms of one call: the rules read each of
    them alike (one spec for orthogonal maps, so one spec, one kind reason per group), a spec that permutes
    some group and keeps the function."""
    inputs, forms = FORMS[family]
    x = inputs()
    first = None
    for i, forward in enumerate(forms):
        torch.manual_seed(0)
        model = Forms(forward).double()
        traced = traced_forms(model, x.double())
        if first is None:
            first = traced
            assert invariant(model, x).group_sizes(model.state_dict())
        assert traced == first, f"form {i} of {family}"


@pytest.mark.parametrize("family", sorted(REFUSED_FORMS))
def test_every_call_form_of_an_operation_the_rules_refuse_is_refused_for_one_reason(family):
    """Each form runs, and is refused in one line for the family's reason."""
    inputs, forms, reason = REFUSED_FORMS[family]
    x = inputs()
    for i, forward in enumerate(forms):
        Forms(forward)(x)  # it runs
        with pytest.raises(TraceError) as err:
            trace_spec(Forms(forward), x)
        found = re.search(r"equivariant \((.*)\); pass", str(err.value))
        assert found and found.group(1) == reason and "\n" not in str(err.value), f"form {i} of {family}"


class Exported(Forms):
    """A branch on the input's shape that torch.fx cannot record: the tracer reads the graph of torch.export, whose
    functional norms and convolutions carry every argument by position."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return x
        return self.f(self, x)


@pytest.mark.parametrize("family", ["layer-norm", "rms-norm", "grouped-conv"])
def test_the_exported_graphs_positional_arguments_give_the_spec_of_torch_fx(family):
    """torch.fx passes a functional norm's weight and bias by keyword; the exported graph by position."""
    inputs, forms = FORMS[family]
    x = inputs().double()
    torch.manual_seed(0)
    model = Forms(forms[-1]).double()  # the last: an rms_norm's eps by position, which is no bias
    exported_model = Exported(forms[-1]).double()
    exported_model.load_state_dict(model.state_dict())
    assert traced_forms(exported_model, x) == traced_forms(model, x)


class _CastScale(nn.Module):
    """A stored scale cast to its activation's dtype (``g.type_as(h)``) before it multiplies the activation."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.a, self.head, self.g = nn.Linear(4, 6), nn.Linear(6, 3), nn.Parameter(torch.rand(shape) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.head(h * self.g.type_as(h))


@pytest.mark.parametrize("shape", [(6,), (1, 6)])
def test_a_scale_cast_to_a_permuted_activation_s_dtype_is_the_scale_and_moves_with_the_units(shape) -> None:
    """``g.type_as(h)`` holds ``g``'s values (``h`` gives only the dtype): ``g`` is recorded on ``h``'s group, and
    a random permutation keeps the outputs (as a vector or a (1, C) row)."""
    model, x = _CastScale(shape).double(), torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator())
    spec, state = trace_spec(model, x), model.state_dict()
    group = spec.axes["a.weight"][0]
    assert spec.axes["g"] == (group,) if len(shape) == 1 else spec.axes["g"] == (None, group)
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(0), spec.heads)
    with torch.no_grad():
        moved = torch.func.functional_call(model, apply_permutation(spec, perm, state), (x,))
        torch.testing.assert_close(moved, model(x), rtol=1e-12, atol=1e-12)
