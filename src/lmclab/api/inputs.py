"""What the public API accepts, turned into what the library works on: a model or a state dict into
a parameter dict, any data (a ``DataLoader``, an iterable of ``(input, target)`` batches, a dataset
of samples, a pair of tensors) into a :class:`~lmclab.core.data.Split`, and a model into its
permutation spec (given, or traced with :mod:`lmclab.trace`). Errors name the API's own arguments."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from lmclab.api.weights import Weights, check_same_shapes, check_weights, compute_dtype, in_dtype
from lmclab.core.batches import Pairs, as_batch
from lmclab.core.data import Split, inputs_like
from lmclab.core.device import resolve_device
from lmclab.core.spec import Params, PermutationSpec, with_metadata

if TYPE_CHECKING:
    from lmclab.trace.inputs import Inputs

Model = nn.Module | Mapping[str, Tensor] | str | os.PathLike  # a module, its state_dict, or a checkpoint path
Data = Split | tuple[Tensor, Tensor] | Iterable[Any]


def params_of(model: Model, name: str, device: torch.device) -> Params:
    """The state dict of ``model`` (a module, a mapping of tensors, or a checkpoint path as
    :func:`open_models` reads it), detached, on ``device``; a one-line error naming ``name`` and the tensor
    when it has no values (``meta``) or a non-finite weight (:func:`lmclab.api.weights.check_weights`)."""
    if isinstance(model, str | os.PathLike):
        state = _opened(model, name).params
    elif isinstance(model, nn.Module):
        state = model.state_dict()
    elif isinstance(model, Mapping) and all(isinstance(v, Tensor) for v in model.values()):
        state = model
    else:
        raise TypeError(
            f"{name} must be an nn.Module, a state dict of tensors or a checkpoint path, got {type(model).__name__}"
        )
    check_weights(state, name)
    return with_metadata({k: v.detach().to(device) for k, v in state.items()}, state)


def read_weights(
    models: Sequence[Model], names: Sequence[str], device: torch.device, *, same_shapes: bool = True
) -> Weights:
    """The models as every search, merge and curve reads them (:mod:`lmclab.api.weights`): each one's state
    dict (:func:`params_of`) on ``device``, checked for ``models[0]``'s tensor names and shapes (names only
    without ``same_shapes``: models of other widths, :mod:`lmclab.api.widths`), in the dtype
    :func:`lmclab.api.weights.compute_dtype` chooses for all of them, with each one's own dtypes kept."""
    found = [params_of(m, name, device) for m, name in zip(models, names, strict=True)]
    for params, name in zip(found[1:], names[1:], strict=True):
        check_same_shapes(found[0], params, name, names[0], shapes=same_shapes)
    dtype = compute_dtype(found)
    own = [{k: v.dtype for k, v in p.items() if v.is_floating_point()} for p in found]
    return Weights([in_dtype(p, dtype) for p in found], own)


def _opened(path: str | os.PathLike, name: str) -> Any:
    """The checkpoint at ``path`` (:func:`lmclab.api.files.load_model_file`), its errors naming ``name``."""
    from lmclab.api.files import load_model_file

    if not Path(path).exists():
        raise FileNotFoundError(f"{name}: {path}: no such file or folder")
    return load_model_file(Path(path))


class Opened(NamedTuple):
    """Models read for the library: their state dicts (or modules), the module they run in, and the spec and
    activation points an lmclab checkpoint carries (None otherwise)."""

    models: list[Any]
    model: nn.Module | None
    spec: PermutationSpec | None
    points: dict[str, list[str]] | None
    modules: list[nn.Module | None] = []  # each model's own module: itself, or the one its checkpoint builds


def open_models(
    models: Sequence[Model],
    names: Sequence[str],
    *,
    model: nn.Module | None = None,
    factory: str | Callable[..., nn.Module] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> Opened:
    """Every checkpoint path among ``models`` read once — a state dict file (``.pt``/``.pth``, also nested
    under ``"state_dict"`` or ``"model"``, ``.safetensors``), a Hugging Face folder or an lmclab checkpoint
    (:func:`lmclab.api.files.load_model_file`) — and the module they run in: ``model``, else
    ``factory(**kwargs)`` (a callable, or ``"module:callable"`` as ``lmclab --factory`` takes it), else the
    one the first checkpoint builds, else ``models[0]`` when it is a module."""
    if kwargs is not None and factory is None:
        raise ValueError("kwargs: keyword arguments of factory=, which is not given")
    if factory is not None and model is not None:
        raise ValueError("factory: give the module as model= or its factory as factory=, not both")
    opened = {i: _opened(m, n) for i, (m, n) in enumerate(zip(models, names, strict=True)) if _is_path(m)}
    found = [opened[i].params if i in opened else m for i, m in enumerate(models)]
    first = opened.get(0)
    if factory is not None:
        model = _built(factory, dict(kwargs or {}))
        first_params = found[0] if isinstance(found[0], Mapping) else None
        if first_params is not None:  # a state dict and the module of its factory must fit, before any work
            check_same_shapes(model.state_dict(), first_params, names[0], "the module of factory")
    elif model is None and first is not None:
        model = first.model
    own = first is not None and first.spec is not None and model is first.model
    modules = [
        opened[i].model if i in opened else m if isinstance(m, nn.Module) else None for i, m in enumerate(models)
    ]
    return Opened(found, model, first.spec if own else None, first.points if own else None, modules)


def _is_path(model: Any) -> bool:
    return isinstance(model, str | os.PathLike)


def _built(factory: str | Callable[..., nn.Module], kwargs: dict[str, Any]) -> nn.Module:
    from lmclab.api.files import build_factory

    if isinstance(factory, str):
        return build_factory(factory, kwargs)
    if not callable(factory):
        raise TypeError(f"factory must be a callable or 'module:callable', got {type(factory).__name__}")
    net = factory(**kwargs)
    if not isinstance(net, nn.Module):
        raise ValueError(f"factory: returned {type(net).__name__}, not an nn.Module")
    return net


def skeleton(model: nn.Module | None, model_a: Model, why: str) -> nn.Module:
    """The module whose forward pass the method runs: ``model``, else ``model_a`` if it is one."""
    found = model if model is not None else model_a if isinstance(model_a, nn.Module) else None
    if found is None:
        raise ValueError(
            f"model: {why} needs the nn.Module the state dicts belong to (pass model= or factory=, or model_a as "
            "a module, a Hugging Face folder or an lmclab checkpoint)"
        )
    meta = next((k for k, v in (*found.named_parameters(), *found.named_buffers()) if v.is_meta), None)
    if meta is not None:  # it is run: tensors outside the state dict (non-persistent buffers) need values too
        name = "model" if model is not None else "model_a"
        raise ValueError(f"{name}: tensor {meta!r} is on the meta device (shapes without values); {why} runs it")
    return found


def on_device(net: nn.Module, device: torch.device) -> nn.Module:
    """``net`` if all its tensors are on ``device``, else a copy moved there (the caller's module stays
    where it is: ``nn.Module.to`` moves in place)."""
    if all(t.device == device for t in (*net.parameters(), *net.buffers())):
        return net
    import copy

    return copy.deepcopy(net).to(device)


def as_split(data: Data, name: str = "data") -> Split:
    """All of ``data`` as one :class:`Split` in memory (inputs ``x`` in their own dtype — integer
    token ids stay integers —, integer class targets ``y``).

    For the consumers that pass over the data more than once or by index: STE and Sinkhorn STE (one
    pass per epoch, a held-out part), REPAIR and the BatchNorm reset (a fixed subset, one pass per
    repair point). Activation matching, CCA Merge, ZipIt! and :func:`lmclab.curve` stream a
    ``DataLoader`` instead (:func:`lmclab.core.batches.input_batches`)."""
    if isinstance(data, Split) or (
        isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data)
    ):
        split = data if isinstance(data, Split) else Split(data[0], _targets(data[1]))
        if len(split) == 0:
            raise ValueError(f"{name} is empty")
        return split
    if isinstance(data, Iterable):
        items = iter(data)
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):  # a map-style Dataset of samples
        items = (data[i] for i in range(len(data)))
    else:
        raise TypeError(
            f"{name} must be a DataLoader, a Dataset, an iterable of (input, target) batches or a "
            f"pair of tensors, got {type(data).__name__}"
        )
    xs, ys = [], []
    for item in items:  # batches, or samples (a 0-d target) read as batches of one
        x, y = as_batch(item, name)
        if y is None:
            raise TypeError(f"{name}: expected (input, target) items, got input tensors alone")
        xs.append(x)
        ys.append(y)
    if not xs:
        raise ValueError(f"{name} is empty")
    return Split(torch.cat(xs), _targets(torch.cat(ys)))


def _targets(y: Tensor) -> Tensor:
    """Class labels as int64; real-valued targets (a regression's, for a ``loss_fn``) as they are."""
    return y if y.is_floating_point() else y.long()


def pairs(
    data: Iterable[Any],
    *,
    input_key: str | None = None,
    target_key: str | None = None,
    collate: Callable[[Any], tuple[Any, Any]] | None = None,
) -> Pairs:
    """``data`` (a ``DataLoader`` or dataset of dict batches, or of anything else) read as ``(input,
    target)`` pairs, for every function that takes ``data``: ``(batch[input_key], batch[target_key])``,
    or ``collate(batch)``. Lazy: a ``DataLoader`` wrapped so still streams where the method allows.

    >>> import torch, lmclab
    >>> batches = [{"pixel_values": torch.zeros(4, 3), "labels": torch.ones(4)}]
    >>> x, y = next(iter(lmclab.pairs(batches, input_key="pixel_values", target_key="labels")))
    >>> tuple(x.shape), tuple(y.shape)
    ((4, 3), (4,))
    """
    return Pairs(data, input_key=input_key, target_key=target_key, collate=collate)


def first_inputs(data: Data) -> Tensor:
    """Two inputs of ``data`` (the first batch's), enough to trace shapes."""
    if isinstance(data, Split):
        return data.x[:2]
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        return data[0][:2]
    item = next(iter(data), None) if isinstance(data, Iterable) else (data[0] if len(data) else None)
    if item is None:
        raise ValueError("data is empty")
    return as_batch(item)[0][:2]  # a batch of one for a sample item


class Problem(NamedTuple):
    """A pair resolved for the library: the spec, its activation points, the skeleton, the device."""

    spec: PermutationSpec
    points: dict[str, list[str]] | None
    model: nn.Module | None
    device: torch.device
    traced: Any = None  # the skeleton's trace (lmclab.trace.Traced) and the inputs it ran on, when traced here
    inputs: Any = None


def resolve(
    model_a: Model,
    *,
    spec: PermutationSpec | None,
    model: nn.Module | None,
    example_inputs: Inputs | None,
    data: Data | None,
    device: str,
    needs_forward: bool,
    partial: bool = False,
    symmetry: str = "permutation",
) -> Problem:
    """The spec (given, or traced from the skeleton on ``example_inputs`` — else on two inputs of
    ``data``; with ``partial``, what the tracer cannot prove is left unpermuted), the activation
    points of a traced spec, and the skeleton on ``device``."""
    if partial and spec is not None:
        raise ValueError("partial: applies to a traced spec; a spec given as spec= is used as it is")
    dev = resolve_device(device)
    net = (
        skeleton(model, model_a, "tracing the permutation spec" if spec is None else "this method")
        if spec is None or needs_forward
        else None
    )
    points, traced, inputs = None, None, None
    if spec is None:
        from lmclab.trace import trace, warn_pinned

        if example_inputs is None and data is None:  # a transformers model's own: token ids, images
            from lmclab.api.hf import example_inputs as own_inputs

            example_inputs = own_inputs(net, None)
        if example_inputs is None:
            if data is None:
                raise ValueError("example_inputs: needed to trace the permutation spec (or pass spec=)")
            example_inputs = first_inputs(data)
        cpu_net = on_device(net, torch.device("cpu"))
        inputs = traced_inputs(example_inputs, dict(cpu_net.state_dict()))
        traced = trace(cpu_net, inputs, partial=partial, symmetry=symmetry)
        spec, points = traced.spec, traced.points
        warn_pinned(spec, cpu_net.state_dict())
    return Problem(spec, points, on_device(net, dev) if net is not None else None, dev, traced, inputs)


def traced_inputs(example_inputs: Inputs, state: Mapping[str, Tensor]) -> Inputs:
    """Every tensor of ``example_inputs`` (one, a sequence, or a mapping of keyword inputs) on the CPU, floating
    ones in the model's dtype (:func:`lmclab.core.data.inputs_like`)."""

    def cpu(x: Any) -> Any:
        return inputs_like(x.cpu(), state) if isinstance(x, Tensor) else x

    if isinstance(example_inputs, Mapping):
        return {k: cpu(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str | Tensor):
        return tuple(cpu(x) for x in example_inputs)
    return cpu(example_inputs)
