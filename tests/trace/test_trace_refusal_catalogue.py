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
    # --- graph.py ----------------------------------------------------------------------------------------
    # --- layers.py ---------------------------------------------------------------------------------------
    # --- shapes.py ---------------------------------------------------------------------------------------
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
