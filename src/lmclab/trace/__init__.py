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
  scale) is permuted alike, also reshaped by adding or dropping axes of length 1 (``gamma.reshape(1, -1,
  1, 1)``) or computed from it elementwise with constants (a gain ``1 + w``); a tensor combined with an
  unpermuted one (the model's input) cannot be permuted;
- ``nn.Embedding`` (module, or ``F.embedding``) starts a group on its output's last axis, its weight's axis 1;
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
reaching it are left unpermuted instead. What is left unpermuted, where and why, is the spec's
``pinned`` (:mod:`lmclab.trace.pinned`). ``example_inputs`` may be one tensor, a sequence of positional
inputs or a mapping of keyword inputs (:mod:`lmclab.trace.inputs`); the trace runs on a copy of the model,
so the caller's module is never changed (``torch.fx`` runs ``forward`` on proxies, which a module may keep).
Nothing is guessed: the tests check the result by invariance of the function in float64.
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from lmclab.core.orthogonal import SYMMETRIES
from lmclab.core.spec import PermutationSpec
from lmclab.trace.export import exported, wrapped_calls
from lmclab.trace.graph import GraphTracer, Traced
from lmclab.trace.groups import TraceError
from lmclab.trace.inputs import Inputs, absent, positional, shapes, split_inputs
from lmclab.trace.pinned import PINNED_SHARE, PinnedWarning, pinned_message, warn_pinned

__all__ = [
    "PINNED_SHARE",
    "PinnedWarning",
    "TraceError",
    "Traced",
    "pinned_message",
    "trace",
    "trace_spec",
    "warn_pinned",
]


def trace_spec(
    model: nn.Module, example_inputs: Inputs, *, partial: bool = False, symmetry: str = "permutation"
) -> PermutationSpec:
    """The :class:`PermutationSpec` of ``model`` (module docstring); ``example_inputs`` (a tensor, a sequence
    of positional inputs or a mapping of keyword inputs, :mod:`lmclab.trace.inputs`) give the shapes.
    One-line :class:`TraceError` for a graph it cannot follow, unless ``partial``. ``symmetry="orthogonal"``:
    the groups on which orthogonal maps are symmetries too get that kind (:mod:`lmclab.trace.rotations`; the
    queries and keys of rotary heads, turned per plane: ``rotary``, :mod:`lmclab.trace.planes`)."""
    return trace(model, example_inputs, partial=partial, symmetry=symmetry).spec


def trace(model: nn.Module, example_inputs: Inputs, *, partial: bool = False, symmetry: str = "permutation") -> Traced:
    """:func:`trace_spec` with the activation points of every group (:class:`Traced`)."""
    if symmetry not in SYMMETRIES:
        raise ValueError(f"symmetry: expected one of {SYMMETRIES}, got {symmetry!r}")
    model = _copy(model)  # tracing may write to the module (a cache of proxies): the caller's stays as it was
    args, kwargs = split_inputs(model, example_inputs)
    inputs = positional(model, args, kwargs)  # one line naming example_inputs before any work
    try:
        gm = fx.symbolic_trace(model, concrete_args=absent(model, kwargs))
        if hidden := wrapped_calls(gm):  # torch.fx.wrap keeps them whole: export records their inside
            raise TraceError(f"torch.fx keeps {hidden[0]} whole")
    except Exception as exc:  # torch.fx raises many types for untraceable Python: export runs it instead
        gm = _exported(model, args, kwargs, exc)  # with the shapes it ran on
    else:
        _propagate(gm, model, inputs)
    tracer = GraphTracer(gm, partial, symmetry, state_keys=set(model.state_dict()))
    tracer.run()
    return tracer.result(model)


def _copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` to trace: ``torch.fx`` runs ``forward`` on proxies, which a module may keep (timm's
    LeViT caches its attention biases per device), and the passes set training flags."""
    try:
        return copy.deepcopy(model)
    except Exception as exc:  # deepcopy raises what the module's attributes raise
        raise TraceError(
            f"trace_spec: {type(model).__name__} cannot be copied to trace it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:120]})"
        ) from None


def _propagate(gm: fx.GraphModule, model: nn.Module, inputs: tuple[Any, ...]) -> None:
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
            f"{shapes(inputs, {})}: {' '.join(str(cause).split())[:200]}"
        ) from None
    finally:
        gm.train(was_training)


def _exported(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], fx_error: Exception) -> fx.GraphModule:
    """The graph ``torch.export`` records (:mod:`lmclab.trace.export`), in eval mode; one line when it cannot."""
    was_training = model.training
    model.eval()
    try:
        return exported(model, args, kwargs)
    except Exception as exc:  # export raises many types for what it cannot run
        raise TraceError(
            f"trace_spec: neither torch.fx nor torch.export can trace {type(model).__name__}: "
            f"{' '.join(str(fx_error).split())[:120]}; {' '.join(str(exc).split())[:160]}"
        ) from None
    finally:
        model.train(was_training)
