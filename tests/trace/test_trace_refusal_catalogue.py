"""Every refusal of the tracer, reached: each reason a rule of ``src/lmclab/trace`` gives ``refuse`` (or
``refuse_packed``, or returns from ``heads_reason``, ``packed_reason`` and ``unknown``) has a case here, the
smallest model that reaches it. Each case is checked three ways:

- the whole one-line message, node, operation, module path and reason (a reader greps for it);
- with ``partial=True`` the trace goes through, the refused node's inputs are pinned with that reason, and
  random permutations of the spec keep the output in float64 (the partial spec is still exact);
- the list itself: a reason in the source with no case here fails the last test, so a new refusal comes
  with its case."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import lmclab.trace
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec

SOURCE = Path(lmclab.trace.__file__).parent
REASON_FUNCTIONS = ("heads_reason", "packed_reason", "unknown")  # functions returning a refusal's reason
REFUSING = ("refuse", "refuse_packed")


class Case(NamedTuple):
    """``build()`` gives the model and its example inputs; the refusal is of node ``node``, an ``op`` (the
    module's class or the function's name) in module path ``where``, for ``reason``. ``pins``: whether the
    refused node has permuted inputs, which ``partial=True`` then pins with the reason."""

    build: Callable[[], tuple[nn.Module, Any]]
    node: str
    op: str
    where: str
    reason: str
    pins: bool = True


class Net(nn.Module):
    """Parameters and layers a case's ``forward`` (a function of the module and its input) picks from."""

    def __init__(self, forward: Callable[..., torch.Tensor], **layers: nn.Module) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 6), nn.Linear(6, 3)
        for name, layer in layers.items():
            self.add_module(name, layer)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


def _flip(m: Net, x: torch.Tensor) -> torch.Tensor:
    return m.head(torch.relu(m.a(x)).flip(-1))


# --- cases for functional.py, graph.py, layers.py and shapes.py ---
F = nn.functional


def _mlp(forward: Callable[..., torch.Tensor]) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with ``c`` (5 → 2) and ``d`` (5 → 4) beside ``a`` and ``head``, on ``(2, 5)`` inputs."""
    return lambda: (Net(forward, c=nn.Linear(5, 2), d=nn.Linear(5, 4)), torch.randn(2, 5))


def _split(m: Net, x: torch.Tensor) -> torch.Tensor:
    """``q``'s 16 units as 4 heads of 4: ``(2, 9, 4, 4)``, the head axis beside the per-head features."""
    return m.q(x).reshape(2, 9, 4, 4)


def _headed(forward: Callable[..., torch.Tensor]) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with ``q`` (16 → 16) split into heads and ``mix`` (4 → 4), on ``(2, 9, 16)`` inputs."""
    return lambda: (Net(forward, q=nn.Linear(16, 16), mix=nn.Linear(4, 4)), torch.randn(2, 9, 16))


def _convs(forward: Callable[..., torch.Tensor], **layers: nn.Module) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with convs ``c1`` and ``c2`` (2 → 3 channels) and ``layers``, on ``(1, 2, 4, 4)`` inputs."""
    return lambda: (Net(forward, c1=nn.Conv2d(2, 3, 1), c2=nn.Conv2d(2, 3, 1), **layers), torch.randn(1, 2, 4, 4))


def _two_parts(m: Net, x: torch.Tensor) -> torch.Tensor:
    """Channels (axis 1) in two segments: ``c1``'s 3, then ``c2``'s 3."""
    return torch.cat([m.c1(x), m.c2(x)], 1)


# One case per reason; the key is the case's id. Cases are grouped by the module of src/lmclab/trace whose rule
# refuses (keep each group in its own block).
CASES: dict[str, Case] = {
    # --- state.py -----------------------------------------------------------------------------------------
    "unknown-operation": Case(
        lambda: (Net(_flip), torch.randn(2, 5)), "flip", "flip", "(top level)", "an operation the tracer does not know"
    ),
    # --- attention.py ------------------------------------------------------------------------------------
    # --- calls.py ----------------------------------------------------------------------------------------
    # --- packed.py ---------------------------------------------------------------------------------------
    # --- routing.py --------------------------------------------------------------------------------------
    #
    #
    #
    #
    # --- functional.py -----------------------------------------------------------------------------------
    "carry-changes-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: m.pool(m.a(x)), pool=nn.AdaptiveAvgPool2d(2)), torch.randn(2, 3, 4, 5)),
        "pool",
        "AdaptiveAvgPool2d",
        "pool",
        "it changes a permuted axis",
    ),
    "pooling-window-over-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: F.avg_pool2d(m.a(x), 3, stride=1, padding=1)), torch.randn(2, 3, 4, 5)),
        "avg_pool2d",
        "avg_pool2d",
        "(top level)",
        "a pooling window over a permuted axis",
    ),
    "functional-norm-scaled-by-a-permuted-tensor": Case(
        lambda: (Net(lambda m, x: F.layer_norm(x, (6,), m.w(x)[0]), w=nn.Linear(6, 6)), torch.randn(2, 6)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a norm whose statistics or scale are computed from a permuted tensor",
    ),
    "functional-layer-norm-over-two-axes": Case(
        lambda: (Net(lambda m, x: m.head(F.layer_norm(m.a(x), (3, 6)))), torch.randn(2, 3, 5)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a LayerNorm or RMSNorm over more than the permuted feature axis",
    ),
    "functional-group-norm-over-split-runs": Case(
        _mlp(lambda m, x: m.head(F.group_norm(torch.cat([m.c(x), m.d(x)], 1), 2))),
        "group_norm",
        "group_norm",
        "(top level)",
        "a group norm over runs of channels that segments of the axis split",
    ),
    "functional-norm-weight-not-of-the-model": Case(
        lambda: (Net(lambda m, x: m.head(F.layer_norm(m.a(x), (6,), torch.ones_like(m.a.bias)))), torch.randn(2, 5)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a norm whose weight is not a parameter or buffer of the model",
    ),
    "functional-linear-weight-not-of-the-model": Case(
        lambda: (Net(lambda m, x: F.linear(torch.relu(m.a(x)), 2 * m.head.weight)), torch.randn(2, 5)),
        "linear",
        "linear",
        "(top level)",
        "a linear whose weight or bias is not a parameter of the model",
    ),
    "pad-along-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: F.pad(m.a(x), (1, 1))), torch.randn(2, 3, 5)),
        "pad",
        "pad",
        "(top level)",
        "a pad along a permuted axis",
    ),
    "roll-along-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: m.head(m.a(x).roll(1, -1))), torch.randn(2, 5)),
        "roll",
        "roll",
        "(top level)",
        "a roll along a permuted axis",
    ),
    # --- graph.py ----------------------------------------------------------------------------------------
    "per-head-features-beside-two-head-axes": Case(
        _headed(lambda m, x: _split(m, x)[:, :, :, None] + _split(m, x)[:, :, None]),
        "add",
        "add",
        "(top level)",
        "per-head features beside no axis of their heads, or two",
    ),
    "module-over-per-head-features": Case(
        _headed(lambda m, x: m.mix(_split(m, x))),
        "mix",
        "Linear",
        "mix",
        "an operation over heads or per-head features it does not know",
    ),
    "conv-over-a-permuted-spatial-axis": Case(
        lambda: (Net(lambda m, x: m.conv(m.a(x)), conv=nn.Conv2d(3, 4, 1)), torch.randn(2, 3, 4, 5)),
        "conv",
        "Conv2d",
        "conv",
        "a convolution over a permuted axis that is not its channel axis",
    ),
    "unknown-module": Case(
        lambda: (Net(lambda m, x: m.head(m.act(m.a(x))), act=nn.SELU()), torch.randn(2, 5)),
        "act",
        "SELU",
        "act",
        "an operation the tracer does not know",
    ),
    "sum-of-operands-in-different-segments": Case(
        _mlp(lambda m, x: m.head(m.a(x) + torch.cat([m.c(x), m.d(x)], 1))),
        "add",
        "add",
        "(top level)",
        "its operands are permuted in blocks or segments that differ",
    ),
    "parameter-along-per-head-features": Case(
        _headed(lambda m, x: _split(m, x) + m.mix.bias),
        "add",
        "add",
        "(top level)",
        "a parameter varying along heads or per-head features",
    ),
    # --- layers.py ---------------------------------------------------------------------------------------
    "grouped-conv-over-segments-that-split-its-groups": Case(
        _convs(lambda m, x: m.g(_two_parts(m, x)), g=nn.Conv2d(6, 6, 1, groups=3)),
        "g",
        "Conv2d",
        "g",
        "a grouped convolution (3 groups of 2 channels) reading segments that do not hold whole groups",
    ),
    "layer-norm-module-over-two-axes": Case(
        lambda: (Net(lambda m, x: m.head(m.ln(m.a(x))), ln=nn.LayerNorm((3, 6))), torch.randn(2, 3, 5)),
        "ln",
        "LayerNorm",
        "ln",
        "a LayerNorm or RMSNorm over more than the permuted feature axis",
    ),
    "group-norm-module-over-split-runs": Case(
        _convs(lambda m, x: m.gn(_two_parts(m, x)), gn=nn.GroupNorm(3, 6)),
        "gn",
        "GroupNorm",
        "gn",
        "a group norm over runs of channels that segments of the axis split",
    ),
    # --- shapes.py ---------------------------------------------------------------------------------------
    "flatten-of-heads-with-another-axis": Case(
        _headed(lambda m, x: _split(m, x).flatten(1, 2)),
        "flatten",
        "flatten",
        "(top level)",
        "a flatten that does not join a head axis to the features of its heads",
    ),
    "flatten-of-two-permuted-axes": Case(
        lambda: (Net(lambda m, x: m.t(m.a(x).transpose(1, 2)).flatten(1), t=nn.Linear(3, 4)), torch.randn(2, 3, 5)),
        "flatten",
        "flatten",
        "(top level)",
        "a flatten of two permuted axes into one",
    ),
    "reshape-it-cannot-follow": Case(
        lambda: (Net(lambda m, x: m.a(x).reshape(3, 4)), torch.randn(2, 5)),
        "reshape",
        "reshape",
        "(top level)",
        "a reshape (2, 6) -> (3, 4) it cannot follow",
    ),
    "concatenation-of-a-permuted-and-a-computed-tensor": Case(
        lambda: (Net(lambda m, x: m.head(torch.cat([m.a(x), torch.ones(1, 6)]))), torch.randn(2, 5)),
        "cat",
        "cat",
        "(top level)",
        "a concatenation of tensors permuted on another axis, not alike",
    ),
    "index-by-a-list": Case(
        lambda: (Net(lambda m, x: m.head(m.a(x)[[0, 1]])), torch.randn(3, 5)),
        "getitem",
        "getitem",
        "(top level)",
        "an index by tensors",
    ),
    "index-of-one-unit": Case(
        lambda: (Net(lambda m, x: m.a(x)[:, 0]), torch.randn(2, 5)),
        "getitem",
        "getitem",
        "(top level)",
        "an index that picks units of a permuted axis",
    ),
}


def _message(case: Case) -> str:
    return (
        f"trace_spec: node {case.node!r}: {case.op} in {case.where} cannot be proved permutation-equivariant "
        f"({case.reason}); pass partial=True to leave its channels unpermuted"
    )


@pytest.mark.parametrize("key", CASES)
def test_every_refusal_gives_its_whole_message(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    with pytest.raises(TraceError) as refused:
        trace_spec(model, x)
    assert str(refused.value) == _message(case)


def _invariant(model: nn.Module, x: Any, spec: PermutationSpec) -> None:
    model = model.double().eval()
    x = x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    state = model.state_dict()
    with torch.no_grad():
        expected = model(x)
        for seed in range(2):
            perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
            model.load_state_dict(apply_permutation(spec, perm, state))
            assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()
        model.load_state_dict(state)


@pytest.mark.parametrize("key", CASES)
def test_under_partial_every_refusal_pins_its_inputs_with_the_reason_and_keeps_the_function(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    spec = trace_spec(model, x, partial=True)
    pins = [p for p in spec.pinned if p.node == case.node]
    if case.pins:
        assert pins and all(p.reason == case.reason and p.where == case.where for p in pins)
    _invariant(model, x, spec)


def _template(node: ast.expr) -> str | None:
    """A reason's text as a regular expression (an f-string's fields match anything), None for a name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in node.values)
    return None


def reasons_in_source() -> dict[str, str]:
    """Every literal reason the tracer's rules refuse with: ``file:line`` → its regular expression."""
    found = {}
    for path in sorted(SOURCE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            texts: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in REFUSING and len(node.args) > 1:
                texts = [node.args[1]]
            elif isinstance(node, ast.FunctionDef) and node.name in REASON_FUNCTIONS:
                texts = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
            for text in texts:
                if (pattern := _template(text)) is not None:
                    found[f"{path.name}:{text.lineno}"] = pattern
    return found


def test_every_reason_the_tracer_refuses_with_has_a_case() -> None:
    reasons = reasons_in_source()
    assert len(reasons) > 40  # the walk finds the rules' reasons
    missing = [where for where, pattern in reasons.items() if not any(re.fullmatch(pattern, c.reason) for c in CASES.values())]
    assert not missing, f"reasons with no case: {missing}"
    stale = [key for key, c in CASES.items() if not any(re.fullmatch(p, c.reason) for p in reasons.values())]
    assert not stale, f"cases whose reason the tracer no longer gives: {stale}"
