"""Two models of different widths for :func:`lmclab.align`: the narrower θb embedded in θa's widths
(:mod:`lmclab.core.widths`) once the tracer proves, on both models, that the embedding keeps its function.

Both models are traced (:mod:`lmclab.trace.widths`): they must be one architecture at two widths — the same spec
but for its lengths, the same numbers in their graphs (a scale computed from a width in ``forward`` differs) —
and every group where θb is narrower must be one whose empty units nothing but linear layers and unit-by-unit
operations read. The search then runs on θa and ``ι(θb)``; its element ``π`` of θa's group, taken after ``ι``, is
the semi-permutation (a map with orthonormal columns for an orthogonal group) that the :class:`Alignment` applies
to θb (:attr:`Alignment.widths` keeps θb's widths).

>>> import torch, lmclab
>>> from torch import nn
>>> def mlp(hidden, seed):
...     torch.manual_seed(seed)
...     return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))
>>> wide, narrow = mlp(8, 0), mlp(5, 1)
>>> res = lmclab.align(wide, narrow, example_inputs=torch.zeros(2, 4))
>>> res.widths, res.apply(narrow)["0.weight"].shape
({'P_0': 5}, torch.Size([8, 4]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.api.inputs import on_device, traced_inputs
from lmclab.api.weights import check_same_shapes
from lmclab.core.spec import Params, PermutationSpec
from lmclab.core.widths import check_free, narrower_groups, plain_sizes, widened
from lmclab.trace.state import Traced


def twin_trace(twin: nn.Module, inputs: Any, symmetry: str) -> Traced:
    """The trace of θb's module ``twin`` on the CPU, on the ``inputs`` θa's was traced on (in θb's dtype)."""
    from lmclab.trace import trace

    twin = on_device(twin, torch.device("cpu"))
    return trace(twin, traced_inputs(inputs, dict(twin.state_dict())), symmetry=symmetry)


def embedded_all(
    problem: Any, modules: Sequence[nn.Module | None], params: Sequence[Params], names: Sequence[str], symmetry: str
) -> tuple[list[Params], list[dict[str, int]]]:
    """Every model of ``params`` of other widths than the first (the reference: the widest in every group)
    embedded in its widths once its module (``modules``) is proved one architecture with it and narrower only where
    the widths are free (:func:`narrowed`); the models as embedded, and each one's widths ({}: the reference's)."""
    sizes, out, widths = problem.spec.group_sizes(params[0]), [params[0]], [{}]
    for p, module, name in zip(params[1:], modules[1:], names[1:], strict=True):
        found = {}
        if differ([params[0], p]):
            if module is None:
                shapes_refused(params[0], p, name, names[0])
            traced = twin_trace(module, problem.inputs, symmetry)
            check_same_architecture(problem.traced, traced, name, names[0])
            reference = problem.traced._replace(spec=problem.spec, fixed={**traced.fixed, **problem.traced.fixed})
            found = narrowed(reference, params[0], p, name)
            check_same_numbers(problem.traced, traced, name, names[0])
        out.append(embedded(problem.spec, p, sizes, found, name) if found else p)
        widths.append(found)
    return out, widths


def shapes_refused(reference: Params, params: Params, what: str, reference_what: str) -> None:
    """The one line naming ``what``'s first tensor of another shape than ``reference``'s, saying how a model of
    other widths is aligned: through its module, whose forward is traced."""
    try:
        check_same_shapes(reference, params, what, reference_what)
    except ValueError as err:
        raise ValueError(f"{err} (a model of other widths: pass its module, whose forward is traced)") from None


def differ(params: Sequence[Mapping[str, Tensor]]) -> bool:
    """True when a tensor of a later model has another shape than the first model's."""
    return any(tuple(p[k].shape) != tuple(v.shape) for p in params[1:] for k, v in params[0].items() if k in p)


def check_same_architecture(a: Traced, b: Traced, what: str = "model_b", reference: str = "model_a") -> None:
    """One line naming ``what`` unless its trace ``b`` has ``a``'s groups: the same spec but for its composite
    axes' lengths."""
    if _shapeless(a.spec) != _shapeless(b.spec):
        raise ValueError(f"{what}: its symmetry groups are not {reference}'s: not one architecture at two widths")


def check_same_numbers(a: Traced, b: Traced, what: str = "model_b", reference: str = "model_a") -> None:
    """One line naming ``what`` unless the numbers of its graph ``b`` are those of ``a`` (module docstring)."""
    for (node, value), (_, theirs) in zip(a.scalars, b.scalars, strict=False):
        if value != theirs:
            raise ValueError(
                f"{what}: node {node!r} computes with {theirs:g}, {reference}'s with {value:g}: a number that depends "
                "on the width, so the narrower model in the wider one's graph would compute another function"
            )
    if len(a.scalars) != len(b.scalars):
        raise ValueError(f"{what}: its graph has other numbers than {reference}'s: not one architecture at two widths")


def narrowed(
    traced: Traced, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], what: str = "model_b"
) -> dict[str, int]:
    """θb's units of each group where it is narrower than θa, checked to be groups whose width the trace leaves
    free (:func:`lmclab.core.widths.check_free`); one line unless θb is nowhere wider."""
    sizes_a = traced.spec.group_sizes(params_a)
    narrower = narrower_groups(sizes_a, plain_sizes(traced.spec, params_b, what), what)
    check_free(narrower, traced.fixed, what)
    return narrower


def embedded(
    spec: PermutationSpec,
    params_b: Mapping[str, Tensor],
    sizes: Mapping[str, int],
    widths: Mapping[str, int],
    what: str = "model_b",
) -> dict[str, Tensor]:
    """``ι(θb)`` at ``sizes`` (θa's units per group) from θb's ``widths`` where they differ; one line naming θb
    unless its groups have exactly those units."""
    own = {**sizes, **widths}
    found = plain_sizes(spec, params_b, what)
    if found != own:
        wrong = next(g for g in own if found.get(g) != own[g])
        raise ValueError(f"{what}: group {wrong!r} has {found.get(wrong)} units, the alignment's θb {own[wrong]}")
    return widened(spec, params_b, sizes, own)


def _shapeless(spec: PermutationSpec) -> tuple:
    """``spec`` without the lengths a width sets: each composite axis's segments without their ``length`` (an
    unpermuted stretch keeps it), and the reports left out."""

    def strip(entry):
        if entry is None or isinstance(entry, str):
            return entry
        return tuple(s._replace(length=0) if s.group is not None else s for s in entry)

    axes = tuple(sorted((k, tuple(strip(e) for e in v)) for k, v in spec.axes.items()))
    return axes, spec.stats, dict(spec.heads), dict(spec.kinds), dict(spec.gains), dict(spec.gain_biases)
