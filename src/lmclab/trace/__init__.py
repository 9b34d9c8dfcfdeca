"""The permutation spec of any ``nn.Module`` that ``torch.fx`` can trace.

:func:`trace_spec` follows channel groups through the traced graph, with shapes from one forward
pass on ``example_inputs`` (``torch.fx`` ShapeProp; one tensor, a tuple of ``forward``'s positional
arguments, or a dict of its arguments by name, T5's ``input_ids`` and ``decoder_input_ids``). A model
``torch.fx`` cannot trace, or whose graph calls a function registered with ``torch.fx.wrap`` that no rule
knows (torchvision's ``shifted_window_attention``: one node, its inside unseen), is recorded by
``torch.export`` instead (:mod:`lmclab.trace.export`), which runs such functions and records their operations:

- a ``Linear`` or ``Conv2d`` output starts a group (its weight's axis 0, its bias); the layer's input
  axis takes the layout of the tensor it reads; a grouped conv (depthwise: one channel per group) ties
  its output to its input instead: it permutes whole conv groups alike on both sides, so the group it
  reads is coarsened to runs of whole conv groups (a permutation inside a conv group is no symmetry of
  the kernel's shared input axis);
- ``BatchNorm`` (module or ``F.batch_norm``: timm's ``BatchNormAct2d``), ``LayerNorm`` and ``RMSNorm`` over
  the feature axis (module or ``F.layer_norm``, ``F.rms_norm``), elementwise activations, dropout, stochastic
  depth, pooling and identity-like ops carry the layout of their input (norm parameters and running statistics join it);
  ``GroupNorm`` (module or ``F.group_norm``) shares statistics within runs of ``C/G`` channels, so its
  group is coarsened to whole runs (:mod:`lmclab.trace.functional`); ``F.linear`` with the model's
  parameters (timm's ``Linear``) is an ``nn.Linear``;
- ``F.pad`` and ``torch.roll`` over axes that are not permuted (Swin's windows) carry the layout; a
  squeeze-excitation gate ``x * sigmoid(fc(mean(x)))`` is a product: the gate's group and the channels' are one;
- a tensor may be permuted on several axes at once, each by its own groups (an MLP-Mixer's token MLP
  output: the stream's channels on axis 1, the token-hidden units on axis 2): ``transpose``/``permute``
  move them, a ``Linear`` over another axis keeps them, a mean over unpermuted axes keeps them;
- an addition or product of two tensors merges their groups axis by axis (union-find): every layer
  writing into one residual stream shares one permutation; a parameter combined with it (a layer
  scale) is permuted alike; a tensor combined with an unpermuted one (the model's input) cannot be
  permuted;
- ``flatten`` (or the equal ``reshape``) of ``C × H × W`` maps each channel onto a block of ``H·W``
  features (a composite axis, :class:`lmclab.core.spec.Segment`); unpermuted axes flattened before the
  channels repeat their layout (Swin's patch merging, ``2 × 2 × C``: four copies side by side); ``cat``
  along the channel axis joins the groups side by side (one segment each);
- multi-head attention (:mod:`lmclab.trace.attention`): a reshape of one group's units into
  ``(heads, d)`` makes the group headed (``PermutationSpec.heads``); ``q @ kᵀ`` makes the query and key
  groups one, ``softmax(…) @ v`` ties the value group's head order to theirs; ``nn.MultiheadAttention``
  is a leaf whose ``in_proj_weight`` rows are three segments (Q, K: one headed group; V: another, tied);
  a packed projection (timm's ``qkv``) reshaped into ``(3, heads, d)`` is refined into three groups side
  by side, its part axis followed through ``permute``, ``unbind`` and ``qkv[i]``;
  ``F.scaled_dot_product_attention`` is its two products (:mod:`lmclab.trace.packed`);
- an index by ints and full slices (``x[:, 0]``) keeps the axes it does not pick from; a class token
  (a parameter, ``expand``-ed) concatenated to the tokens is permuted as they are;
- a channel shuffle (ShuffleNet V2's ``view (B, g, C/g, H, W)``, ``transpose(1, 2)``, ``view`` back) is a
  fixed permutation of the channels; it commutes with one that moves each of its ``g`` runs alike, so the
  groups of the runs become one, in blocks of ``g`` after it; a ``chunk`` of such blocks refines their
  group into whole blocks per piece; ``where(cond, x, y)`` merges as ``x + y``; a tensor made from another's
  shape (``new_zeros``, ``zeros_like``) is not permuted (:mod:`lmclab.trace.routing`);
- an attention mask or bias varying along the head axis (Swin's and T5's position biases) fixes the head
  order, as a tensor not of the model's parameters does (below);
- the model's inputs and outputs are never permuted; nor is a head order that a tensor not of the model's
  parameters varies along (Swin's relative position bias, a table indexed by a buffer): every headed
  group it orders is then left unpermuted.

Anything else that touches a permuted tensor — an unknown op, a reshape it cannot follow (a channel shuffle of
one group's channels), q, k and v packed head by head (GPT-NeoX, Bloom, LeViT: their rows interleave per head,
which no headed group can hold), a pad or roll along a permuted axis, a GroupNorm whose runs segments split, a
grouped conv reading segments that split its groups, a flatten or mean over a permuted axis mixed with others,
an op over heads it cannot prove (a Linear across heads, a mean over them, heads of different counts) — is
refused with one line naming the graph node, its op and the module path; with ``partial=True`` the groups
reaching it are left unpermuted instead.
Nothing is guessed: the tests check the result by invariance of the function in float64.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from collections.abc import Mapping, Sequence

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from lmclab.core.spec import PermutationSpec
from lmclab.trace.export import exported, wrapped_calls
from lmclab.trace.graph import GraphTracer, Traced
from lmclab.trace.groups import TraceError

__all__ = ["TraceError", "Traced", "trace", "trace_spec"]


Inputs = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]


def trace_spec(model: nn.Module, example_inputs: Inputs, *, partial: bool = False) -> PermutationSpec:
    """The :class:`PermutationSpec` of ``model`` (module docstring); ``example_inputs`` give the
    shapes: one tensor, a tuple of ``forward``'s positional arguments, or a dict of its keyword arguments
    (T5's ``{"input_ids": …, "decoder_input_ids": …}``). One-line :class:`TraceError` for a graph it
    cannot follow, unless ``partial``."""
    return trace(model, example_inputs, partial=partial).spec


def trace(model: nn.Module, example_inputs: Inputs, *, partial: bool = False) -> Traced:
    """:func:`trace_spec` with the activation points of every group (:class:`Traced`)."""
    inputs = _positional(model, example_inputs)
    kwargs = dict(example_inputs) if isinstance(example_inputs, Mapping) else {}
    try:
        gm = fx.symbolic_trace(model, concrete_args=_absent(model, kwargs))
        if hidden := wrapped_calls(gm):  # torch.fx.wrap keeps them whole: export records their inside
            raise TraceError(f"torch.fx keeps {hidden[0]} whole")
    except Exception as exc:  # torch.fx raises many types for untraceable Python: export runs it instead
        gm = _exported(model, inputs, exc, kwargs)  # with the shapes it ran on
    else:
        _propagate(gm, model, inputs)
    tracer = GraphTracer(gm, partial)
    tracer.run()
    return tracer.result(model)


def _propagate(gm: fx.GraphModule, model: nn.Module, inputs: tuple) -> None:
    """The shape of every node, from one forward pass in eval mode (``torch.fx`` ShapeProp)."""
    was_training = model.training
    gm.eval()
    try:  # ShapeProp prints a traceback of its own before raising: the one line below says it all
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
            ShapeProp(gm).propagate(*inputs)
    except Exception as exc:  # any error of the model's own forward
        cause = exc.__cause__ or exc
        raise TraceError(
            f"trace_spec: {type(model).__name__} does not run on inputs of shape "
            f"{[tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)]}: {' '.join(str(cause).split())[:200]}"
        ) from None
    finally:
        gm.train(was_training)


def _positional(model: nn.Module, example_inputs: Inputs) -> tuple:
    """``example_inputs`` as ``forward``'s positional arguments (a dict: in signature order, defaults between)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, Mapping):
        return tuple(example_inputs)
    params = list(inspect.signature(model.forward).parameters.values())
    if unknown := set(example_inputs) - {p.name for p in params}:
        raise TraceError(f"example_inputs: {type(model).__name__}.forward takes no argument {sorted(unknown)[0]!r}")
    last = max(i for i, p in enumerate(params) if p.name in example_inputs)
    return tuple(example_inputs.get(p.name, p.default) for p in params[: last + 1])


def _absent(model: nn.Module, kwargs: dict[str, torch.Tensor]) -> dict | None:
    """The arguments of ``forward`` a dict of inputs leaves out, at their defaults (``torch.fx`` then follows
    the branch taken on them, as the forward pass does): None for positional inputs."""
    params = inspect.signature(model.forward).parameters.values()
    return {p.name: p.default for p in params if p.name not in kwargs and p.default is not p.empty} if kwargs else None


def _exported(model: nn.Module, inputs: tuple, fx_error: Exception, kwargs: dict[str, torch.Tensor]) -> fx.GraphModule:
    """The graph ``torch.export`` records (:mod:`lmclab.trace.export`), in eval mode; one line when it cannot."""
    was_training = model.training
    model.eval()
    try:
        return exported(model, () if kwargs else inputs, kwargs)
    except Exception as exc:  # export raises many types for what it cannot run
        raise TraceError(
            f"trace_spec: neither torch.fx nor torch.export can trace {type(model).__name__}: "
            f"{' '.join(str(fx_error).split())[:120]}; {' '.join(str(exc).split())[:160]}"
        ) from None
    finally:
        model.train(was_training)
