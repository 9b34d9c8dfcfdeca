"""What a trace leaves unpermuted, and why (src/lmclab/trace/pinned.py): ``spec.pinned`` names the graph node,
module path and reason of every pin and the tensor axes it leaves alone, survives an alignment file, and
``find_permutation`` warns in one line past a stream or the share of parameters; and the three rules that
keep streams a trace used to pin: a per-channel parameter reshaped before a product (ConvNeXt's layer
scale), a gain ``1 + w`` (Gemma's RMSNorm) and an ``nn.Embedding`` module (or ``F.embedding`` of a table of
the model) starting its group. Each rule: random permutations of every group keep the output in float64, one
that misses a weight changes it, and weight matching gives a planted permutation back."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import lmclab
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.core.spec_data import spec_from_data, spec_to_data
from lmclab.trace import PINNED_SHARE, PinnedWarning, pinned_message, trace_spec


class Flipped(nn.Module):
    """``a``'s units read by position (``flip``: refused, pinned under partial); a stream ``b + x + d`` that
    carries the input itself (pinned by the addition); ``c``'s hidden units free."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d, self.h = (nn.Linear(*io) for io in [(4, 8), (8, 4), (4, 8), (8, 4), (4, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(self.a(x).flip(-1)) + x
        return self.h(h + self.d(torch.relu(self.c(h))))


def test_each_pin_names_its_node_module_reason_and_the_axes_it_leaves_alone():
    spec = trace_spec(Flipped(), torch.zeros(2, 4), partial=True)
    flip, add = spec.pinned
    assert (flip.node, flip.where, flip.units, flip.stream) == ("flip", "(top level)", 8, False)
    assert "does not know" in flip.reason and set(flip.places) == {("a.weight", 0), ("a.bias", 0)}
    assert (add.node, add.units, add.stream) == ("add", 4, True) and "model's input" in add.reason
    assert set(add.places) == {("b.weight", 0), ("b.bias", 0), ("c.weight", 1), ("d.weight", 0), ("d.bias", 0)} | {
        ("h.weight", 1)
    }
    assert set(spec.groups) == {"P_0"}  # c's hidden units alone


class FlippedThenShuffled(nn.Module):
    """``a``'s units pinned by a flip, then two units of 2 channels shuffled (``view``, ``transpose``, ``view``) and
    chunked: the chunk splits the shuffled group into halves of whole blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(4, 8), nn.Linear(8, 4), nn.Linear(4, 2), nn.Linear(4, 2)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.b(self.a(x).flip(-1))
        t = torch.cat([self.c(x), self.d(x)], -1).view(-1, 2, 2).transpose(1, 2).reshape(-1, 4)
        first, second = t.chunk(2, dim=-1)
        return self.head(torch.cat([p, first, second], -1))


def test_a_pin_made_before_a_shuffled_group_is_split_is_still_listed():
    spec = trace_spec(FlippedThenShuffled(), torch.zeros(2, 4), partial=True)
    (flip,) = spec.pinned
    assert (flip.node, flip.units, flip.stream) == ("flip", 8, False)
    assert set(flip.places) == {("a.weight", 0), ("a.bias", 0)} and spec.axes["a.weight"] == (None, None)
    assert len(spec.groups) == 3  # b's units and the two halves of the shuffled channels


class Shared(nn.Module):
    """One Linear ``shared`` used twice: on ``a``'s units and on the model's input, which is never permuted."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.shared, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.shared(torch.relu(self.a(x))))) + self.head(torch.relu(self.shared(x)))


def test_a_layer_also_used_unpermuted_pins_the_units_it_reads_and_says_why():
    spec = trace_spec(Shared(), torch.zeros(2, 4))
    (pin,) = spec.pinned
    assert (pin.node, pin.where, pin.reason) == (
        "shared_1",
        "shared",
        "'shared.weight' is also used unpermuted along it",
    )
    assert set(pin.places) == {("a.weight", 0), ("a.bias", 0), ("shared.weight", 1)} and pin.units == 4
    assert spec.axes["shared.weight"][1] is None and spec.axes["shared.weight"][0] is not None


def test_the_models_output_and_input_are_never_listed():
    """The logits are never permuted and not listed, also those of a head tied to the embedding table (BERT's,
    whose tie pins them before the output does: tests/trace/test_trace_transformers.py)."""
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    assert trace_spec(net, torch.zeros(2, 4)).pinned == ()
    tied = Embedded()
    tied.head = nn.Linear(8, 20)
    tied.head.weight = tied.embed.weight  # the head's rows: the table's rows, the logits
    spec = trace_spec(tied, torch.zeros(2, 6, dtype=torch.long))
    assert spec.pinned == () and spec.axes["head.weight"][1] == spec.axes["embed.weight"][1] is not None


def test_pinned_survives_an_alignment_file_and_does_not_make_two_specs_differ(tmp_path):
    spec = trace_spec(Flipped(), torch.zeros(2, 4), partial=True)
    back = spec_from_data(spec_to_data(spec))
    assert back.pinned == spec.pinned and back == PermutationSpec(spec.axes, spec.stats, spec.heads)
    net = Flipped()
    with pytest.warns(PinnedWarning):
        res = lmclab.find_permutation(net, net, example_inputs=torch.zeros(2, 4), partial=True)
    res.save(tmp_path / "perm.pt")
    assert lmclab.load_alignment(tmp_path / "perm.pt").spec.pinned == spec.pinned


def test_find_permutation_warns_in_one_line_when_a_stream_is_pinned_and_not_otherwise():
    net = Flipped()
    with pytest.warns(PinnedWarning) as caught:
        lmclab.find_permutation(net, net, example_inputs=torch.zeros(2, 4), partial=True)
    (warned,) = [w for w in caught if w.category is PinnedWarning]
    inside = Path(warned.filename).resolve().is_relative_to(Path(lmclab.__file__).resolve().parent)
    assert not inside and (warned.filename == __file__ or "mutmut" in warned.filename)  # (mutmut's trampoline)
    message = str(warned.message)
    assert "\n" not in message and "residual streams" in message and "node 'flip'" not in message
    assert "first by node 'add' in (top level)" in message
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PinnedWarning)
        lmclab.find_permutation(mlp, mlp, example_inputs=torch.zeros(2, 4))


def test_the_share_of_parameters_on_a_pinned_axis_is_a_boundary():
    """Without a stream, the message comes past the share alone: just below the fraction it says, and not at it."""
    spec = trace_spec(Flipped(), torch.zeros(2, 4), partial=True)
    spec = PermutationSpec(spec.axes, spec.stats, spec.heads, spec.pinned[:1])  # the flip's pin: no stream
    state = Flipped().state_dict()
    fraction = (state["a.weight"].numel() + state["a.bias"].numel()) / sum(v.numel() for v in state.values())
    assert pinned_message(spec, state, share=fraction) is None
    assert f"({fraction:.0%} of the parameters" in pinned_message(spec, state, share=fraction - 1e-9)
    assert 0 < PINNED_SHARE < fraction  # the default: the flip's 40 of 155 values warn


# ---- the three rules: a reshaped layer scale, a gain 1 + w, nn.Embedding ----------------------------------


class LayerScaled(nn.Module):
    """A conv stream with ConvNeXt's layer scale ``x + conv(x) * gamma.reshape(1, -1, 1, 1)``, its last axis
    added by ``unsqueeze``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv, self.head = nn.Conv2d(3, 6, 3), nn.Conv2d(6, 6, 1), nn.Linear(6, 4)
        self.gamma = nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + torch.relu(self.conv(h)).mul(self.gamma.reshape(1, -1, 1).unsqueeze(-1))
        return self.head(h.mean((2, 3)))


class CastLayerScaled(LayerScaled):
    """The same layer scale stored as (1, C) and cast to the input's dtype (``type_as``) before its reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(1, 6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + torch.relu(self.conv(h)).mul(self.gamma.type_as(x).reshape(1, -1, 1, 1))
        return self.head(h.mean((2, 3)))


class Gained(nn.Module):
    """A token stream with Gemma's RMSNorm gain ``(1.0 + w)`` (cast first, as Gemma does)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.up, self.down, self.head = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 5)
        self.weight = nn.Parameter(torch.randn(8) * 0.5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.down(torch.relu(self.up(h)))
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.head(normed * (1.0 + self.weight.double()))


class Embedded(nn.Module):
    """An ``nn.Embedding`` module writing a residual stream, as a user's net traced by torch.fx has it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.a, self.b, self.norm = nn.Embedding(20, 8), nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.b(torch.relu(self.a(h)))
        return self.head(self.norm(h))


class Looked(Embedded):
    """The same net calling ``F.embedding`` on a table of its own, which torch.fx records with every option
    of the call (``padding_idx``, ``max_norm``, …) as a keyword."""

    def __init__(self) -> None:
        super().__init__()
        del self.embed
        self.table = nn.Parameter(torch.randn(20, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = nn.functional.embedding(ids, self.table)
        h = h + self.b(torch.relu(self.a(h)))
        return self.head(self.norm(h))


CASES = {
    "layer scale": (LayerScaled, lambda g: torch.randn(3, 3, 6, 6, generator=g, dtype=torch.float64), "gamma"),
    "cast layer scale of (1, C)": (
        CastLayerScaled,
        lambda g: torch.randn(3, 3, 6, 6, generator=g, dtype=torch.float64),
        "gamma",
    ),
    "gain 1 + w": (Gained, lambda g: torch.randint(0, 20, (3, 6), generator=g), "weight"),
    "nn.Embedding": (Embedded, lambda g: torch.randint(0, 20, (3, 6), generator=g), "embed.weight"),
    "F.embedding": (Looked, lambda g: torch.randint(0, 20, (3, 6), generator=g), "table"),
}


def case(name: str) -> tuple[nn.Module, torch.Tensor, PermutationSpec]:
    build, inputs, _ = CASES[name]
    torch.manual_seed(0)
    model = build().double().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5) if hasattr(model, "norm") else None
    x = inputs(torch.Generator().manual_seed(1))
    return model, x, trace_spec(model, x)


def run(model: nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,))


@pytest.mark.parametrize("name", list(CASES))
def test_the_stream_is_one_group_and_nothing_is_pinned(name):
    model, x, spec = case(name)
    key = CASES[name][2]
    stream = [e for e in spec.axes[key] if e is not None]
    assert spec.pinned == () and len(stream) == 1
    assert ("head.weight", 1) in spec.groups[stream[0]]


@pytest.mark.parametrize("name", list(CASES))
def test_random_permutations_of_every_group_keep_the_output(name):
    model, x, spec = case(name)
    state = model.state_dict()
    y = run(model, state, x)
    assert float((y[0] - y[1]).abs().max()) > 1e-3
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed))
        z = run(model, apply_permutation(spec, perm, state), x)
        assert float((y - z).abs().max() / y.abs().max()) <= 1e-12


@pytest.mark.parametrize("name", list(CASES))
def test_permuting_the_parameter_alone_changes_the_output(name):
    """The layer scale, the gain or the table permuted, the rest of its stream not: another function."""
    model, x, spec = case(name)
    state, key = model.state_dict(), CASES[name][2]
    y = run(model, state, x)
    axis = next(a for a, e in enumerate(spec.axes[key]) if e is not None)
    alone = dict(state) | {key: state[key].flip(axis)}
    assert float((y - run(model, alone, x)).abs().max() / y.abs().max()) > 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_weight_matching_gives_the_planted_permutation_back(name):
    model, x, spec = case(name)
    state = model.state_dict()
    planted = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(3))
    found = lmclab.find_permutation(state, apply_permutation(spec, planted, state), model=model, example_inputs=x)
    assert {g: p.tolist() for g, p in found.perm.items()} == {g: torch.argsort(p).tolist() for g, p in planted.items()}
