"""The graph of a model that ``torch.fx`` cannot trace, from ``torch.export`` (non-strict).

``torch.fx.symbolic_trace`` runs ``forward`` on proxies: Python control flow over them fails, and
Hugging Face transformers (version 5 no longer ships its own fx tracer) branch on shapes, index lists
of caches and build masks in Python. ``torch.export.export(model, inputs, strict=False)`` runs
``forward`` in Python on tensors with real shapes and records the ATen operations it reaches: a flat
graph with the module path of every node (``nn_module_stack``) and the shapes (``tensor_meta``).
(TorchDynamo's own capture, ``strict=True``, breaks the graph at the Python it cannot follow; the
transformers models export without it.) Measured on transformers 5.24: GPT-2, BERT, ViT and Llama
models of two layers export in under a second each.

:func:`exported` turns that graph into the form :class:`lmclab.trace.graph.GraphTracer` reads: the
parameters and buffers (placeholders of the exported program) become ``get_attr`` nodes named by their
``state_dict`` keys, and each ATen operation with a rule becomes the ``torch`` function of that rule
(``aten.linear`` is ``F.linear``, ``aten.view`` a reshape, ``aten.slice`` and ``aten.unsqueeze`` an index,
``aten.embedding`` ``F.embedding`` with its arguments in that order, ``aten.pad``/``aten.constant_pad_nd``
``F.pad``, ``aten.roll`` ``torch.roll``, the 2-d poolings theirs, ``aten.adaptive_avg_pool1d(x, 1)`` a mean over the
last axis).
Elementwise ATen operations are in the tracer's tables (:mod:`lmclab.trace.groups`); the rest keep their
ATen target and are refused when they touch a permuted tensor. Checks the program asserts on its own
values (no result) are dropped.
"""

from __future__ import annotations

import inspect
import operator

import torch
from torch import fx, nn

from lmclab.trace.groups import loaded_carry_functions

aten = torch.ops.aten
F = torch.nn.functional

# ATen operations whose arguments are those of a torch function with a rule
SAME_ARGS = {
    aten.linear.default: F.linear,
    aten.conv2d.default: F.conv2d,
    aten.scaled_dot_product_attention.default: F.scaled_dot_product_attention,
    aten.transpose.int: torch.transpose,
    aten.permute.default: torch.permute,
    aten.view.default: torch.reshape,
    aten.reshape.default: torch.reshape,
    aten._unsafe_view.default: torch.reshape,
    aten.flatten.using_ints: torch.flatten,
    aten.cat.default: torch.cat,
    aten.unbind.int: torch.unbind,  # (input, dim): packed q/k/v unbound into its parts
    aten.mean.dim: torch.mean,
    aten.sum.dim_IntList: torch.mean,  # a sum over axes: the same rule as a mean
    aten.softmax.int: torch.softmax,
    aten._softmax.default: torch.softmax,
    aten.matmul.default: torch.matmul,
    aten.bmm.default: torch.matmul,
    aten.add.Tensor: torch.add,
    aten.sub.Tensor: torch.sub,
    aten.mul.Tensor: torch.mul,
    aten.div.Tensor: torch.div,
    aten.pad.default: F.pad,  # (input, pad, mode, value)
    aten.roll.default: torch.roll,  # (input, shifts, dims)
    aten.adaptive_avg_pool2d.default: F.adaptive_avg_pool2d,
    aten.max_pool2d.default: F.max_pool2d,  # (input, kernel_size, stride, padding, dilation, ceil_mode)
    aten.avg_pool2d.default: F.avg_pool2d,  # (input, kernel_size, stride, padding, ceil_mode, count_include_pad, …)
}
ASSERTS = {aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default}


def exported(model: nn.Module, args: tuple, kwargs: dict | None = None) -> fx.GraphModule:
    """``model``'s exported graph on positional ``args`` and keyword ``kwargs`` in the tracer's form (module
    docstring); raises what export raises."""
    caching = "use_cache" in inspect.signature(model.forward).parameters  # transformers: no cache in the output
    kwargs = (kwargs or {}) | ({"use_cache": False} if caching else {})
    program = torch.export.export(model, args, kwargs, strict=False)
    signature = program.graph_signature
    owned = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    graph, env = fx.Graph(), {}
    for node in program.graph.nodes:
        if node.op == "call_function" and (node.target in ASSERTS or not node.users):
            continue
        if node.op == "placeholder" and not node.users:  # a constant argument (use_cache=False)
            continue
        if node.op == "placeholder" and node.name in owned:
            new = graph.get_attr(owned[node.name])
        elif node.op == "call_function":
            target, args, kwargs = _translated(node)
            new = graph.call_function(target, fx.node.map_arg(args, env.get), fx.node.map_arg(kwargs, env.get))
        else:
            new = graph.node_copy(node, env.get)
        new.name = node.name
        new.meta = dict(node.meta)
        env[node] = new
    return fx.GraphModule(model, graph)


def _translated(node: fx.Node) -> tuple[object, tuple, dict]:
    """The target and arguments of ``node`` as the tracer reads them."""
    target, args, kwargs = node.target, tuple(node.args), dict(node.kwargs)
    if target in SAME_ARGS:
        return SAME_ARGS[target], args, kwargs
    val = args[0].meta.get("val") if args and isinstance(args[0], fx.Node) else None
    ndim = val.dim() if isinstance(val, torch.Tensor) else 0
    if target is aten.layer_norm.default:  # (input, shape, weight, bias, eps, cudnn_enable)
        return F.layer_norm, args[:5], {}
    if target is aten.rms_norm.default:  # (input, shape, weight, eps)
        return F.rms_norm, args[:4], {}
    if target is aten.group_norm.default:
        return F.group_norm, args[:5], {}
    if target is aten.batch_norm.default:  # (input, weight, bias, mean, var, training, momentum, eps, cudnn)
        x, weight, bias, mean, var, *rest = args
        return F.batch_norm, (x, mean, var, weight, bias, *rest[:3]), {}
    if target is aten.constant_pad_nd.default:  # (input, pad, value)
        return F.pad, (args[0], args[1], "constant", *args[2:]), {}
    if target is aten.adaptive_avg_pool1d.default and list(args[1]) == [1]:  # the mean over the last axis
        return torch.mean, (args[0], [-1], True), {}
    if target is aten.embedding.default:  # (weight, indices, …): F.embedding(indices, weight)
        return F.embedding, (args[1], args[0]), {}
    if target is aten.select.int:  # x.select(dim, i) = x[:, …, i]
        dim = args[1] % ndim
        return operator.getitem, (args[0], (slice(None),) * dim + (args[2],)), {}
    if target is aten.slice.Tensor:
        return operator.getitem, (args[0], _slice(node, ndim)), {}
    if target is aten.unsqueeze.default:
        dim = args[1] % (ndim + 1)
        return operator.getitem, (args[0], (slice(None),) * dim + (None,)), {}
    if target is aten.squeeze.dim:
        dim = args[1] % ndim
        return operator.getitem, (args[0], (slice(None),) * dim + (0,)), {}
    return target, args, kwargs


def _slice(node: fx.Node, ndim: int) -> tuple[slice, ...]:
    """``aten.slice(x, dim, start, end, step)`` as an index (a slice that keeps every entry is ``:``)."""
    names = ("input", "dim", "start", "end", "step")
    args = dict(zip(names, node.args, strict=False)) | node.kwargs
    dim = args.get("dim", 0) % ndim
    size = node.args[0].meta["val"].shape[dim]
    # clamped to the axis as Python and torch read them: x[-7:] of 5 entries is all 5, x[7:] none
    start, end, step = slice(args.get("start"), args.get("end"), args.get("step", 1)).indices(size)
    whole = start == 0 and end == size and step == 1
    return (slice(None),) * dim + (slice(None) if whole else slice(start, end, step),)


def wrapped_calls(gm: fx.GraphModule) -> list[str]:
    """The functions ``gm`` calls that ``torch.fx.wrap`` registered (torchvision's ``shifted_window_attention``)
    and no rule knows (torchvision's ``stochastic_depth`` is carried): ``torch.fx`` records a call, not what is
    inside; ``torch.export`` runs them and records their operations."""
    registered = getattr(torch.fx._symbolic_trace, "_wrapped_fns_to_patch", {})
    return [
        node.target.__name__
        for node in gm.graph.nodes
        if node.op == "call_function"
        and inspect.isfunction(node.target)
        and (id(node.target.__globals__), node.target.__name__) in registered
        and node.target.__module__.split(".")[0] != "torch"  # torch.fx's own checks (``_assert_is_none``)
        and node.target not in loaded_carry_functions()
    ]
