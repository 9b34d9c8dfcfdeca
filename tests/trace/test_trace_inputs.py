"""The inputs a trace runs on and the model it leaves as it was (src/lmclab/trace/inputs.py, trace/__init__.py):
a model of two inputs traced on a tuple or a mapping of keyword inputs, by ``trace_spec`` and by
``find_permutation`` and ``merge_many``; a missing or unknown input named in one line; and after a trace,
traced or refused, every submodule's attributes, parameters, buffers and training flags are the caller's."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import lmclab
from lmclab.trace import TraceError, trace_spec


class TwoInputs(nn.Module):
    """``head(relu(a(x) * gate(mask)))``: the gate's units and ``a``'s are one group (a product)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.head = nn.Linear(4, 8), nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0, shift: float = 0.0):
        return self.head(torch.relu(self.a(x) * self.gate(mask))) * scale + shift


X, MASK = torch.randn(2, 4), torch.randn(2, 3)


@pytest.mark.parametrize("inputs", [(X, MASK), [X, MASK], {"x": X, "mask": MASK}, {"mask": MASK, "x": X}])
def test_a_model_of_two_inputs_traces_on_a_sequence_or_a_mapping(inputs):
    spec = trace_spec(TwoInputs(), inputs)
    assert spec.groups == {
        "P_0": [("a.weight", 0), ("a.bias", 0), ("gate.weight", 0), ("gate.bias", 0), ("head.weight", 1)]
    }


@pytest.mark.parametrize("inputs", [(X, MASK), {"x": X, "mask": MASK}])
def test_find_permutation_and_merge_many_take_a_sequence_or_a_mapping_of_inputs(inputs):
    a, b = TwoInputs(), TwoInputs()
    res = lmclab.find_permutation(a, b, method="wm", example_inputs=inputs)
    assert set(res.perm) == {"P_0"}
    merged = lmclab.merge_many([a, b], method="merge_many", example_inputs=inputs)
    assert set(merged.merged) == set(a.state_dict())


def test_keyword_inputs_after_a_default_take_the_defaults_between():
    """``shift`` given by name: ``scale`` between takes its default (1.0); ``mask`` left out takes None, on
    which the gate does not run."""
    assert set(trace_spec(TwoInputs(), {"x": X, "mask": MASK, "shift": 0.5}).groups) == {"P_0"}
    with pytest.raises(TraceError, match="does not run on inputs"):
        trace_spec(TwoInputs(), {"x": X, "scale": 2.0})


@pytest.mark.parametrize(
    "inputs,message",
    [
        ({"mask": MASK}, "TwoInputs.forward needs its input 'x'"),
        ({"x": X, "masks": MASK}, "TwoInputs.forward takes no input 'masks'"),
        ({0: X}, "a mapping of keyword inputs needs names"),
        ("x", "expected a tensor, a sequence of inputs or a mapping"),
    ],
)
def test_a_missing_unknown_or_unnamed_input_is_one_line_naming_example_inputs(inputs, message):
    with pytest.raises(TypeError, match=f"^example_inputs: .*{message}") as err:
        trace_spec(TwoInputs(), inputs)
    assert "\n" not in str(err.value)


def test_find_permutation_and_merge_many_refuse_a_string_of_inputs_as_trace_spec_does():
    """A str is a sequence (of characters), yet no inputs: it is refused whole, not read as one input per letter."""
    expected = (
        "example_inputs: expected a tensor, a sequence of inputs or a mapping of keyword inputs for TwoInputs, got str"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.find_permutation(TwoInputs(), TwoInputs(), method="wm", example_inputs="xm")
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.merge_many([TwoInputs(), TwoInputs()], example_inputs="xm")


class Cached(nn.Module):
    """A module that writes to itself in ``forward`` (timm's LeViT caches its attention biases per device),
    with a child in another training mode than its parent; ``refused`` reads its units by position."""

    def __init__(self, refused: bool) -> None:
        super().__init__()
        self.a, self.inner, self.head = (
            nn.Linear(4, 8),
            nn.Sequential(nn.Dropout(0.1), nn.Linear(8, 8)),
            nn.Linear(8, 2),
        )
        self.register_buffer("seen", torch.zeros(()))
        self.cache: dict = {}
        self.refused = refused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache["bias"] = self.a.bias * 2  # a proxy under torch.fx
        self.last = x
        h = self.inner(self.a(x) + self.cache["bias"])
        return self.head(h.flip(-1) if self.refused else h)


def snapshot(model: nn.Module) -> dict:
    """Per submodule: every attribute that is not a parameter, buffer or child (dicts copied one level),
    each parameter and buffer (object and value), and the training flag."""
    out = {}
    for name, m in model.named_modules():
        plain = {k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(m).items() if not k.startswith("_")}
        tensors = {k: (v, v.detach().clone()) for k, v in [*m._parameters.items(), *m._buffers.items()]}
        out[name] = (plain, tensors, dict(m._modules), m.training)
    return out


def same(before: dict, after: dict) -> bool:
    if before.keys() != after.keys():
        return False
    for name, (plain, tensors, children, training) in before.items():
        plain2, tensors2, children2, training2 = after[name]
        if plain.keys() != plain2.keys() or any(plain2[k] is not v and plain2[k] != v for k, v in plain.items()):
            return False
        if tensors.keys() != tensors2.keys() or any(
            tensors2[k][0] is not obj or not torch.equal(tensors2[k][0], value) for k, (obj, value) in tensors.items()
        ):
            return False
        if children != children2 or training != training2:
            return False
    return True


@pytest.mark.parametrize("refused", [False, True])
def test_a_trace_traced_or_refused_leaves_every_submodule_as_it_was(refused):
    model = Cached(refused).train()
    model.inner.eval()  # a child in another mode than its parent
    before = snapshot(model)
    if refused:
        with pytest.raises(TraceError, match="'flip'"):
            trace_spec(model, torch.randn(2, 4))
    else:
        trace_spec(model, torch.randn(2, 4))
    assert same(before, snapshot(model)) and model.cache == {} and not hasattr(model, "last")
    assert model.training and not model.inner.training


def test_the_snapshot_sees_a_changed_attribute_flag_cache_or_buffer():
    """The comparison above is not blind: each kind of change it guards is seen."""
    changes = [
        lambda m: m.cache.update(bias=1),
        lambda m: setattr(m, "refused", True),
        lambda m: m.inner.train(),
        lambda m: m.seen.add_(1),
        lambda m: setattr(m.a, "bias", nn.Parameter(m.a.bias.detach().clone())),
    ]
    for change in changes:
        model = Cached(False)
        model.inner.eval()
        before = snapshot(model)
        change(model)
        assert not same(before, snapshot(model))


def test_the_shapes_in_a_message_are_a_list_a_mapping_or_both():
    from lmclab.trace.inputs import shapes

    assert shapes((), {"input_ids": torch.zeros(2, 8, dtype=torch.long)}) == "{'input_ids': (2, 8)}"
    assert shapes((X,), {"mask": MASK, "scale": 2.0}) == "[(2, 4)] and {'mask': (2, 3), 'scale': 'float'}"
    assert shapes((X, None), {}) == "[(2, 4), 'NoneType']"
