"""Why a group takes no orthogonal map, or only a centred one: every reason the proof of
``lmclab.trace.rotations`` and ``lmclab.trace.kinds`` gives has a case here, the smallest model that reaches it.
Each case is checked for the group's kind and its whole reason in ``spec.kind_reasons`` (what ``lmclab trace``
prints and ``lmclab.align`` names when no group is orthogonal), and a negative control: once the gains are
folded, a random orthogonal map of that group (a general one for a centred group) changes the output, so the
reason is no false alarm. ``tests/meta/test_trace_catalogues.py`` fails when the source gains a reason with no
case here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.func import functional_call

from lmclab.archs import gpt
from lmclab.core.canonical import fold_gains
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec
from lmclab.trace.kinds import RUNS, WHOLE
from lmclab.trace.planes import PLANE


class Net(nn.Module):
    """Linears ``a``, ``b`` (4 → 6), ``head`` (6 → 3) and ``out`` (4 → 3), a gain ``g`` and bias ``beta`` (6),
    1×1 convolutions ``conv`` (3 → 4) and ``grouped`` (4 → 4 in 2 groups), an RMSNorm, a LayerNorm and a GELU,
    and a ``forward`` given as a function of the module and its input."""

    def __init__(self, forward: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 3)
        self.g, self.beta = nn.Parameter(torch.rand(6) + 0.5), nn.Parameter(torch.randn(6))
        self.conv, self.grouped = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1, groups=2)
        self.kernel = nn.Parameter(torch.randn(4, 2, 1, 1))
        self.rms, self.ln, self.gelu, self.out = nn.RMSNorm(6), nn.LayerNorm(6), nn.GELU(), nn.Linear(4, 3)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


class Tied(nn.Module):
    """An embedding tied to the head that reads a final RMSNorm: the norm's gain cannot fold into the head alone."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Embedding(7, 6), nn.RMSNorm(6), nn.Linear(6, 7, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)))


class WholeAttention(nn.Module):
    """An ``nn.MultiheadAttention`` (6 features in 2 heads) that ``torch.fx`` keeps whole, between two Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.attn, self.head = nn.Linear(4, 6), nn.MultiheadAttention(6, 2, batch_first=True), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.a(x)
        return self.head(s + self.attn(s, s, s, need_weights=False)[0])


class SlicedHeads(nn.Module):
    """Attention (6 features in 2 heads of 3) whose logits weigh the first two features of each head twice: the
    heads' features are read in place (sliced), so the heads move whole."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.head = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (f(x).view(2, 5, 2, 3).transpose(1, 2) for f in (self.q, self.k, self.v))
        logits = 2 * q[..., :2] @ k[..., :2].transpose(-1, -2) + q[..., 2:] @ k[..., 2:].transpose(-1, -2)
        return self.head((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 6))


class RowGain(nn.Module):
    """An RMSNorm by hand whose gain is stored as a (1, C) row, read by a Linear: no vector to fold."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.fc, self.head = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.g = nn.Parameter(torch.rand(1, 6) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.head(h + self.fc(self.g * (h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6))))


def _rotary_gpt(**options) -> tuple[nn.Module, torch.Tensor]:
    shapes = dict(width=8, depth=1, heads=2, position="rotary", norm="rmsnorm", tie_embeddings=False) | options
    model = gpt.Model(gpt.Config(input_shape=(4,), num_classes=11, **shapes))
    return model, torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(0))


def _vector() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


def _image() -> torch.Tensor:
    return torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(0))


def _over_itself(h: torch.Tensor) -> torch.Tensor:
    """``h / h``: one node as both operands of a quotient (not the square ``h * h``)."""
    return h / h


def _net(forward: Callable[..., torch.Tensor], x: Callable[[], torch.Tensor] = _vector):
    return lambda: (Net(forward), x())


class Case(NamedTuple):
    """``build()`` gives a model and its input; the group ``group``'s kind is ``kind`` for ``reason``."""

    build: Callable[[], tuple[nn.Module, torch.Tensor]]
    group: str
    kind: str  # "permutation", "centred" or "rotary"
    reason: str
    control: bool = True  # an orthogonal map of the group changes the output (not for a tied head's gain)


NOT_ROTATION = "does not commute with rotations of its units"
CASES: dict[str, Case] = {
    "module-nonlinearity": Case(
        _net(lambda m, x: m.head(m.gelu(m.a(x)))), "P_0", "permutation", f"node 'gelu': GELU {NOT_ROTATION}"
    ),
    "function-nonlinearity": Case(
        _net(lambda m, x: m.head(torch.sigmoid(m.a(x)))),
        "P_0",
        "permutation",
        f"node 'sigmoid': an operation that {NOT_ROTATION}",
    ),
    "grouped-convolution-module": Case(
        _net(lambda m, x: m.out(m.grouped(m.conv(x)).mean((2, 3))), _image),
        "P_0",
        "permutation",
        "node 'grouped': a grouped convolution",
    ),
    "grouped-convolution-function": Case(
        _net(lambda m, x: m.out(F.conv2d(m.conv(x), m.kernel, groups=2).mean((2, 3))), _image),
        "P_0",
        "permutation",
        "node 'conv2d': a grouped convolution",
    ),
    "layernorm-module": Case(
        _net(lambda m, x: m.head(m.ln(m.a(x)))), "P_0", "centred", "node 'ln': LayerNorm's centring"
    ),
    "layernorm-function": Case(
        _net(lambda m, x: m.head(F.layer_norm(m.a(x), (6,), m.g, m.beta))),
        "P_0",
        "centred",
        "node 'layer_norm': LayerNorm's centring",
    ),
    "mean-over-the-units": Case(
        _net(lambda m, x: m.head(m.a(x) - m.a(x).mean(-1, keepdim=True))),
        "P_0",
        "centred",
        "node 'mean': a sum over the units",
    ),
    "product-of-two-tensors-of-the-group": Case(
        _net(lambda m, x: m.head(m.a(x) * m.b(x))),
        "P_0",
        "permutation",
        "node 'mul': a product of two tensors of the group",
    ),
    "quotient-by-the-units": Case(
        _net(lambda m, x: m.head(torch.div(x.sum(-1, keepdim=True), m.a(x)))),
        "P_0",
        "permutation",
        "node 'div': a quotient by the units",
    ),
    "quotient-of-the-units-by-themselves": Case(
        _net(lambda m, x: m.head(_over_itself(m.a(x)))),
        "P_0",
        "permutation",
        "node 'truediv': a quotient by the units",
        control=False,  # h / h is 1 whatever the map: the proof reads the operation, named as it is, not values
    ),
    "computed-per-channel-gain": Case(
        _net(lambda m, x: m.head(m.a(x) * (2 * m.g))),
        "P_0",
        "permutation",
        "node 'mul_1': a per-channel gain computed from a parameter (only a stored gain, or c + w, is folded)",
    ),
    "constant-added": Case(
        _net(lambda m, x: m.head(m.a(x) + 1.0)), "P_0", "centred", "node 'add': a constant added to the units"
    ),
    "centred-then-bent": Case(
        _net(lambda m, x: m.head(m.gelu(m.a(x) + 1.0))), "P_0", "permutation", f"node 'gelu': GELU {NOT_ROTATION}"
    ),
    "tensor-constant-along-the-units-added": Case(
        _net(lambda m, x: m.head(m.a(x) + x.mean(-1, keepdim=True))),
        "P_0",
        "centred",
        "node 'add': a tensor constant along the units added to them",
    ),
    "gain-in-place": Case(
        _net(lambda m, x: m.head(torch.relu(m.rms(m.a(x))))),
        "P_0",
        "permutation",
        "node 'rms': the gain 'rms.weight' in place (its output is read by more than linear layers)",
    ),
    "square-not-summed": Case(
        _net(lambda m, x: m.head(m.a(x).pow(2) + m.a(x))),
        "P_0",
        "permutation",
        "node 'pow_1': a square of the units read otherwise than summed",
    ),
    "gain-read-by-a-tied-head": Case(
        lambda: (Tied(), torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(0))),
        "P_0",
        "permutation",
        "gain 'norm.weight' is read by 'head.weight', one tensor with another entry",
        control=False,  # untied by lmclab.canonicalize, the stream is orthogonal
    ),
    "planes-under-rotary-positions": Case(_rotary_gpt, "P_1", "rotary", f"node 'mul': {PLANE}"),
    "planes-under-rotary-positions-and-grouped-queries": Case(
        lambda: _rotary_gpt(heads=4, kv_heads=2), "P_1", "rotary", f"node 'mul_2': {PLANE}"
    ),
    "heads-read-in-place": Case(
        lambda: (SlicedHeads(), torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))),
        "P_1",
        "permutation",
        RUNS,
        control=False,  # a headed group: random_permutation keeps its heads whole
    ),
    "gain-stored-as-a-row": Case(
        lambda: (RowGain(), _vector()),
        "P_0",
        "permutation",
        "gain 'g' stays in place: only a vector of the units folds",
    ),
    "heads-of-a-whole-multihead-attention": Case(
        lambda: (WholeAttention(), torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))),
        "P_1",
        "permutation",
        WHOLE,
        control=False,  # inside its heads an orthogonal map is a symmetry: the trace only cannot see it
    ),
}

# Reached by no trace: the permutation rules refuse a norm whose weight or bias is no parameter before the
# proof runs, and pin its input (the group then has no name, so no kind and no reason).
UNREACHED = ("a norm's gain", "a LayerNorm's bias that is no parameter")


@pytest.mark.parametrize("key", CASES)
def test_every_narrower_kind_is_traced_with_its_whole_reason(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    spec = trace_spec(model, x, symmetry="orthogonal")
    assert spec.kinds.get(case.group, "permutation") == case.kind
    assert spec.kind_reasons[case.group] == case.reason
    assert trace_spec(model, x).kind_reasons == {}  # traced for permutations: no kinds, no reasons


@pytest.mark.parametrize("key", [key for key, case in CASES.items() if case.control])
def test_an_orthogonal_map_of_the_group_its_reason_names_changes_the_output(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    model = model.double().eval()
    x = x.double() if x.is_floating_point() else x
    spec = trace_spec(model, x, symmetry="orthogonal")
    state = fold_gains(spec, model.state_dict())
    with torch.no_grad():
        reference = functional_call(model, state, (x,))
        forced = dataclasses.replace(spec, kinds={**spec.kinds, case.group: "orthogonal"})
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads, forced.kinds)
        moved = functional_call(model, apply_permutation(forced, perm, state), (x,))
    assert (moved - reference).abs().max() > 1e-6 * reference.abs().max()


@pytest.mark.parametrize("weight, bias", [("m.g * 2", "m.beta"), ("m.g", "m.beta * 2")])
def test_a_norm_whose_gain_or_bias_is_computed_is_refused_before_the_proof_and_pinned_under_partial(weight, bias):
    net = Net(eval(f"lambda m, x: m.head(F.layer_norm(m.a(x), (6,), {weight}, {bias}))"))
    which = "weight" if "2" in weight else "bias"
    with pytest.raises(TraceError, match=f"a norm whose {which} is not a parameter or buffer of the model"):
        trace_spec(net, _vector(), symmetry="orthogonal")
    spec = trace_spec(net, _vector(), symmetry="orthogonal", partial=True)
    assert spec.axes["a.weight"] == (None, None) and spec.kind_reasons == {}
