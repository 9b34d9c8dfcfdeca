"""Refusals of the tracer that the rest of the suite does not reach: a model that cannot be copied, one that
does not run on the example inputs, one that neither torch.fx nor torch.export can record (a function torch.fx
keeps whole among them), a layer used on inputs permuted in different ways, per-head features reaching a
layer's weight, one group split into two head counts, and one group read by grouped convolutions in runs of
two lengths. Each is one line, and the nearest model on the accepted side is traced."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from lmclab.core.spec import PermutationSpec, Segment, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec
from lmclab.trace.graph import GraphTracer
from lmclab.trace.groups import FIXED, Within


class Net(nn.Module):
    """Linears ``a`` (5 → 6), ``c`` (5 → 2), ``d`` (5 → 4), ``head`` (6 → 3), ``q``/``k``/``v`` (16 → 16) and
    ``mix`` (4 → 4), with a ``forward`` given as a function."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.a, self.c, self.d, self.head = nn.Linear(5, 6), nn.Linear(5, 2), nn.Linear(5, 4), nn.Linear(6, 3)
        self.q, self.k, self.v, self.mix = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(4, 4)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


def partial_spec(model: nn.Module, x: torch.Tensor, reason: str | None) -> PermutationSpec:
    """The spec ``partial=True`` gives: a pin for ``reason`` (None: the model's outputs hold the units, which no
    pin reports), and random permutations keep the output in float64."""
    model, x = model.double().eval(), x.double()
    spec = trace_spec(model, x, partial=True)
    assert reason is None or reason in [p.reason for p in spec.pinned]
    state = model.state_dict()
    with torch.no_grad():
        expected = model(x)
        for seed in range(3):
            perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
            model.load_state_dict(apply_permutation(spec, perm, state))
            out = model(x)
            for a, b in zip(
                out if isinstance(out, tuple) else (out,),
                expected if isinstance(out, tuple) else (expected,),
                strict=True,
            ):
                assert (a - b).abs().max() <= 1e-12 * b.abs().max()
    model.load_state_dict(state)
    return spec


def heads(x: torch.Tensor, count: int) -> torch.Tensor:
    """``(batch, tokens, E)`` → ``(batch, count, tokens, E / count)``."""
    return x.reshape(x.shape[0], x.shape[1], count, -1).transpose(1, 2)


def mlp(m: Net, x: torch.Tensor) -> torch.Tensor:
    return m.head(torch.relu(m.a(x)))


def test_a_model_that_does_not_run_on_the_example_inputs_is_refused_with_its_error():
    message = (
        r"^trace_spec: Net does not run on inputs of shape \[\(2, 4\)\]: "
        r"mat1 and mat2 shapes cannot be multiplied \(2x4 and 5x6\)$"
    )
    with pytest.raises(TraceError, match=message):
        trace_spec(Net(mlp), torch.randn(2, 4))
    spec = trace_spec(Net(mlp), torch.randn(2, 5))
    assert spec.axes["a.weight"] == ("P_0", None) and spec.axes["head.weight"] == (None, "P_0")


def test_a_model_neither_torch_fx_nor_torch_export_can_record_is_refused_with_both_errors():
    def refusing(m, x):
        raise ValueError("proxies refused" if isinstance(x, fx.Proxy) else "tensors refused")

    message = r"^trace_spec: neither torch.fx nor torch.export can trace Net: proxies refused; tensors refused$"
    with pytest.raises(TraceError, match=message):
        trace_spec(Net(refusing), torch.randn(2, 5))

    def branching(m, x):  # a branch on a proxy: torch.fx fails, torch.export records the branch taken
        return mlp(m, x) if x.shape[-1] == 5 else x

    assert trace_spec(Net(branching), torch.randn(2, 5)).axes["head.weight"] == (None, "P_0")


def refused_whole(x: torch.Tensor) -> torch.Tensor:
    """Kept whole by torch.fx (``torch.fx.wrap`` below); raises when torch.export runs it."""
    raise ValueError("tensors refused")


def doubled(x: torch.Tensor) -> torch.Tensor:
    """Kept whole by torch.fx (``torch.fx.wrap`` below); torch.export records its product."""
    return 2 * x


torch.fx.wrap("refused_whole")
torch.fx.wrap("doubled")


def test_a_function_torch_fx_keeps_whole_goes_to_torch_export_and_its_failure_names_the_function():
    message = (
        r"^trace_spec: neither torch.fx nor torch.export can trace Net: torch.fx keeps refused_whole whole; "
        r"tensors refused$"
    )
    with pytest.raises(TraceError, match=message):
        trace_spec(Net(lambda m, x: m.head(refused_whole(m.a(x)))), torch.randn(2, 5))
    spec = trace_spec(Net(lambda m, x: m.head(doubled(m.a(x)))), torch.randn(2, 5))  # export sees 2 * x
    assert spec.axes["a.weight"] == ("P_0", None) and spec.axes["head.weight"] == (None, "P_0")


class Uncopyable(nn.Module):
    """A module whose copy raises, with a message over several lines and longer than the refusal keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 6)

    def __deepcopy__(self, memo: dict) -> Uncopyable:
        raise RuntimeError("held by\n   another thread " + "x" * 200)


def test_a_model_that_cannot_be_copied_is_refused_with_the_first_120_characters_of_its_error_on_one_line():
    kept = ("held by another thread " + "x" * 200)[:120]
    with pytest.raises(TraceError) as refused:
        trace_spec(Uncopyable(), torch.randn(2, 5))
    assert str(refused.value) == f"trace_spec: Uncopyable cannot be copied to trace it (RuntimeError: {kept})"


def test_a_layer_used_on_inputs_permuted_in_different_ways_is_refused():
    """``head`` reads ``a``'s 6 units and the 2 + 4 of ``c`` and ``d`` side by side: no one permutation of its
    input axis is both."""

    def two_layouts(m, x):
        return m.head(m.a(x)) + m.head(torch.cat([m.c(x), m.d(x)], -1))

    with pytest.raises(TraceError, match=r"^trace_spec: 'head.weight' is used on inputs permuted in different ways$"):
        trace_spec(Net(two_layouts), torch.randn(2, 3, 5))
    partial_spec(Net(two_layouts), torch.randn(2, 3, 5), "'head.weight' is used on inputs permuted in different ways")

    def one_layout(m, x):  # the same layer twice on one group's units: one permutation
        return m.head(m.a(x)) + m.head(torch.relu(m.a(x)))

    spec = trace_spec(Net(one_layout), torch.randn(2, 3, 5))
    assert spec.axes["head.weight"] == (None, "P_0") and spec.axes["a.weight"] == ("P_0", None)


def test_per_head_features_of_a_pinned_group_reach_a_layer_as_unpermuted_features():
    """``q`` split into 4 heads, then pinned (added to the unpermuted input): ``mix`` over its per-head
    features reads an unpermuted axis, the same spec as when the pin comes before the split."""

    def split_then_pinned(m, x):
        q = m.q(x)
        h = heads(q, 4)
        pinned = (q + x).sum()
        return m.mix(h).sum() + pinned

    def pinned_then_split(m, x):
        q = m.q(x)
        pinned = (q + x).sum()
        return m.mix(heads(q, 4)).sum() + pinned

    spec = trace_spec(Net(split_then_pinned), torch.randn(2, 9, 16))
    assert spec.axes == trace_spec(Net(pinned_then_split), torch.randn(2, 9, 16)).axes
    assert spec.axes["mix.weight"] == ("P_0", None) and spec.axes["q.weight"] == (None, None) and not spec.heads


def test_a_parameter_along_per_head_features_of_a_permuted_group_is_refused_where_it_is_recorded():
    """The rules refuse a layer over per-head features first; the record keeps the guarantee on its own."""
    tracer = GraphTracer(fx.symbolic_trace(nn.Linear(4, 4)), partial=False)
    gid = tracer.groups.new()
    tracer.groups.headed(gid, 2, 2)
    message = r"^trace_spec: 'mix.weight' would be permuted along a head axis, which no spec can say$"
    with pytest.raises(TraceError, match=message):
        tracer.record("mix.weight", [None, (Within(gid, 2),)])
    tracer.pin([gid])  # unpermuted: recorded as it is
    tracer.record("mix.weight", [None, (Within(gid, 2),)])
    assert tracer.axes["mix.weight"] == [None, (Within(gid, 2),)]
    tracer = GraphTracer(fx.symbolic_trace(nn.Linear(4, 4)), partial=True)  # partial: pinned, the reason logged
    gid = tracer.groups.new()
    tracer.groups.headed(gid, 2, 2)
    tracer.record("mix.weight", [None, (Within(gid, 2),)])
    assert tracer.groups.find(gid) == FIXED and tracer.axes["mix.weight"] == [None, (Within(gid, 2),)]


def test_one_group_split_into_two_head_counts_is_refused():
    """``q`` split into 4 heads of 4, then packed with ``k`` and ``v`` as 3 × 2 heads of 8."""

    def packed(count):
        def forward(m, x):
            q = m.q(x)
            h = heads(q, count)
            return h, torch.cat([q, m.k(x), m.v(x)], -1).reshape(2, 9, 3, 2, 8)

        return forward

    with pytest.raises(TraceError, match=r"^trace_spec: one group is split into 4 and into 2 heads$"):
        trace_spec(Net(packed(4)), torch.randn(2, 9, 16))
    spec = partial_spec(Net(packed(4)), torch.randn(2, 9, 16), None)
    assert spec.axes["q.weight"] == (None, None) and not spec.heads
    spec = trace_spec(Net(packed(2)), torch.randn(2, 9, 16))  # 2 heads both times: one head count
    assert spec.axes["q.weight"] == (None, None)  # returned: the model's outputs are never permuted


@pytest.mark.parametrize(
    "split",
    [lambda t: torch.chunk(t, 2), lambda t: t.split(2), lambda t: torch.split(t, 2)],
    ids=["chunk", "split-method", "split-function"],
)
def test_a_split_of_per_head_features_along_the_default_first_axis_is_refused_as_packed_head_by_head(split):
    """``(d, batch, tokens, heads)`` split without ``dim``: along torch's default, axis 0, each head's features."""

    def forward(m: Net, x: torch.Tensor) -> torch.Tensor:
        return split(heads(m.q(x), 4).permute(3, 0, 1, 2))[0]

    reason = "a split of each head's features into q, k, v packed head by head: their rows interleave per head"
    with pytest.raises(TraceError, match=rf"^trace_spec: node '\w+': \w+ in \(top level\) .*\({reason}, "):
        trace_spec(Net(forward), torch.randn(2, 9, 16))


def test_a_pooling_window_over_the_second_to_last_axis_is_refused_when_that_axis_is_permuted():
    """A 2-D pooling window spans the last two axes: one of them permuted mixes units of a group (the window
    keeps the shape, so only the pooling rule can see it); the channel axis before them is carried."""
    pool = torch.nn.functional.avg_pool2d

    def over_units(m, x):  # (2, 3, 4, 6) → (2, 3, 6, 4): the units on the second-to-last axis
        return m.head(pool(m.a(x).transpose(-1, -2), 3, stride=1, padding=1).transpose(-1, -2))

    message = r"^trace_spec: node 'avg_pool2d': .*\(a pooling window over a permuted axis\)"
    with pytest.raises(TraceError, match=message):
        trace_spec(Net(over_units), torch.randn(2, 3, 4, 5))

    def over_space(m, x):  # (2, 3, 4, 6) → (2, 6, 3, 4): the units are channels, the window is spatial
        return m.head(pool(m.a(x).permute(0, 3, 1, 2), 3, stride=1, padding=1).permute(0, 2, 3, 1))

    spec = trace_spec(Net(over_space), torch.randn(2, 3, 4, 5))
    assert spec.axes["a.weight"] == ("P_0", None) and spec.axes["head.weight"] == (None, "P_0")


class Shifted(nn.Module):
    """``a`` (5 → 6) read by ``head`` after a roll along the batch: by 1, or by a shift that ``width`` (5 → 1)
    reads off the first input."""

    def __init__(self, learned: bool) -> None:
        super().__init__()
        self.a, self.width, self.head = nn.Linear(5, 6), nn.Linear(5, 1), nn.Linear(6, 3)
        self.learned = learned

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = torch.relu(self.width(x[:1])).to(torch.long)[0] if self.learned else 1  # (1,): width's unit
        return self.head(torch.roll(torch.relu(self.a(x)), shifts=(shift,), dims=(0,)))


def test_a_roll_by_a_shift_a_layer_computes_is_refused_and_a_constant_shift_carried():
    """A shift read off a layer's output is an argument on that layer's permuted axis (of one unit: a shift is
    one number), which the rule does not follow; the roll along the batch by a constant keeps ``a``'s units."""
    message = r"^trace_spec: node 'roll': roll in \(top level\) cannot .*\(a roll along a permuted axis\)"
    with pytest.raises(TraceError, match=message):
        trace_spec(Shifted(learned=True), torch.randn(4, 5))
    spec = trace_spec(Shifted(learned=False), torch.randn(4, 5))
    group = spec.axes["a.weight"][0]
    assert group is not None and spec.axes["head.weight"] == (None, group)


def overridable(module: str):
    """A library's function of ``module`` that tensors may override, as torch's own are: torch.fx records a call
    to it (keeps it whole) instead of tracing into it."""

    def op(x: torch.Tensor) -> torch.Tensor:
        if torch.overrides.has_torch_function_unary(x):
            return torch.overrides.handle_torch_function(op, (x,), x)
        return 2 * x

    op.__module__ = module
    return op


@pytest.mark.parametrize(
    "forward,message",
    [
        (lambda m, x: m.a(x) @ torch.ones(6), r"node 'matmul'.*\(a product with a vector\)"),
        (  # a torch function outside the tracer's tables: unknown, not a library's function kept whole
            lambda m, x: m.head(torch.nn.functional.softsign(m.a(x))),
            r"node 'softsign'.*\(an operation the tracer does not know\)",
        ),
        (  # the exponent broadcasts a batch axis in front: the units no longer sit on the axis they had
            lambda m, x: m.head(m.a(x).pow(torch.ones(2, 6, 6))),
            r"node 'pow\w*'.*\(it changes a permuted axis\)",
        ),
        (  # indices computed from a's units: which rows are read depends on their order
            lambda m, x: torch.nn.functional.embedding(m.a(x).sigmoid().to(torch.long), m.head.weight),
            r"node 'embedding'.*\(an embedding of permuted indices, or of a table not of the model\)",
        ),
        (
            lambda m, x: m.head(overridable("mylib.ops")(m.a(x))),
            r"node 'op'.*\(a function of mylib\.ops that torch\.fx keeps whole: the graph does not show its inside\)",
        ),
        (  # a function naming no module: no library to name
            lambda m, x: m.head(overridable("")(m.a(x))),
            r"node 'op'.*\(an operation the tracer does not know\)",
        ),
    ],
    ids=[
        "product-with-a-vector",
        "unknown-torch-function",
        "broadcast-to-more-axes",
        "embedding-of-permuted-indices",
        "library-function-kept-whole",
        "function-of-no-module",
    ],
)
def test_what_the_rules_cannot_follow_is_refused_with_its_reason(forward, message):
    with pytest.raises(TraceError, match=rf"^trace_spec: {message}"):
        trace_spec(Net(forward), torch.randn(6, 5))


FIXED_READOUT = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))  # a tensor outside the model


class ConstantReadout(nn.Module):
    """``a``'s units read by a global tensor: torch.fx copies it into the graph as ``_tensor_constant0``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.relu(self.a(x)), FIXED_READOUT)


def test_a_tensor_from_outside_the_model_is_no_parameter_the_spec_may_permute():
    """The constant cannot be permuted with ``a``'s units (it is no entry of the state dict): the linear is
    refused, and with ``partial=True`` ``a``'s units stay unpermuted, so every spec keeps the function."""
    model, x = ConstantReadout().eval(), torch.randn(5, 4)
    message = r"^trace_spec: node 'linear': linear in \(top level\) cannot be proved permutation-equivariant "
    with pytest.raises(
        TraceError, match=message + r"\(a linear whose weight or bias is not a parameter of the model\)"
    ):
        trace_spec(model, x)
    spec = trace_spec(model, x, partial=True)
    assert spec.axes["a.weight"] == (None, None) and spec.pinned[0].reason.startswith("a linear whose weight")


class GroupedConvs(nn.Module):
    """Convs ``c``, ``c1``, ``c2`` (2 → 6 channels); ``g1`` reads ``c1`` in 3 groups of 2 channels, ``g2`` reads
    ``c2`` in ``groups`` groups; ``c``'s channels twice side by side are added to ``c1``'s then ``c2``'s."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.c, self.c1, self.c2 = nn.Conv2d(2, 6, 1), nn.Conv2d(2, 6, 1), nn.Conv2d(2, 6, 1)
        self.g1, self.g2 = nn.Conv2d(6, 6, 1, groups=3), nn.Conv2d(6, 6, 1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, h1, h2 = self.c(x), self.c1(x), self.c2(x)
        read = self.g1(h1).sum() + self.g2(h2).sum()
        return read + (torch.cat([h, h], 1) + torch.cat([h1, h2], 1)).sum()


def test_one_group_read_by_grouped_convolutions_in_runs_of_two_lengths_is_refused():
    """``c``'s group moves with ``c1``'s in runs of 2 (``g1``'s groups) and with ``c2``'s in runs of 3 (``g2``
    of 2 groups): the sum cannot be both; with ``g2`` of 3 groups every conv moves in runs of 2, as one group."""
    message = r"^trace_spec: one group is read by grouped convolutions in runs of 2 and of 3 channels$"
    with pytest.raises(TraceError, match=message):
        trace_spec(GroupedConvs(2), torch.randn(1, 2, 3, 3))
    reason = "one group is read by grouped convolutions in runs of 2 and of 3 channels"
    spec = partial_spec(GroupedConvs(2), torch.randn(1, 2, 3, 3), reason)
    assert spec.axes["c.weight"][0] is None and spec.axes["c2.weight"][0] is None
    spec = trace_spec(GroupedConvs(3), torch.randn(1, 2, 3, 3))
    runs = (Segment("P_0", 6, 2),)
    assert spec.axes["c.weight"][0] == spec.axes["c1.weight"][0] == spec.axes["c2.weight"][0] == runs
