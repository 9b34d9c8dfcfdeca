"""The state that every rule of :mod:`lmclab.trace` reads and writes, declared in one place: the graph
being traced, the union-find of its groups, each node's tag, each parameter's axes, the activation points
of each group and what the attention rules remember about the nodes they met; with the primitive
operations on it (a node's tag and shape, pinning groups, recording an activation point, refusing a node)
and :meth:`TraceState.check`, which asserts the invariants the rules keep. The rules' mixins
(:mod:`lmclab.trace.layers`, :mod:`lmclab.trace.shapes`, …) are joined with it into
:class:`lmclab.trace.graph.GraphTracer`."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import fx, nn

from lmclab.core.spec import PermutationSpec
from lmclab.trace.groups import FIXED, Groups, Layout, Seg, Tag, TraceError, Within

CONSTANT = re.compile(r"_tensor_constant\d+")  # a tensor torch.fx copied out of forward: no entry of the model


@dataclass(eq=False)
class TraceState:
    """What the tracer knows so far (one pass over ``gm``; ``partial``: pin instead of refusing)."""

    gm: fx.GraphModule
    partial: bool
    symmetry: str = "permutation"  # "orthogonal": prove which groups orthogonal maps may act on (rotations)
    groups: Groups = field(default_factory=Groups)
    tags: dict[fx.Node, Tag | None] = field(default_factory=dict)  # each node met: its output's layouts
    axes: dict[str, list[Layout]] = field(default_factory=dict)  # parameter or buffer -> its axes' layouts
    writers: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # group -> (norm | layer, point)
    state_keys: set[str] | None = None  # the model's state_dict keys (None: the graph module's, constants left out)
    names: dict[int, str] = field(default_factory=dict)  # union-find root -> P_k, filled by result()
    attention_heads: dict[fx.Node, tuple[int, int, int]] = field(default_factory=dict)  # MHA -> (tie, H, ndim)
    packed: dict[fx.Node, tuple[int, list[Tag | None]]] = field(default_factory=dict)  # (part axis, parts' tags)
    unbound: dict[fx.Node, list[Tag | None]] = field(default_factory=dict)  # unbind of a packed tensor -> tags
    bent: dict[int, str] = field(default_factory=dict)  # group -> why no orthogonal map of it is a symmetry
    centred: dict[int, str] = field(default_factory=dict)  # group -> why only the maps with O1 = 1 keep it
    squares: set[fx.Node] = field(default_factory=set)  # x.pow(2), x * x of a group's tensor: summed, or bent
    gains: dict[str, list[str]] = field(default_factory=dict)  # per-channel gain -> the linear weights reading it
    gain_biases: dict[str, str] = field(default_factory=dict)  # a LayerNorm's gain -> its bias
    gain_offsets: dict[str, float] = field(default_factory=dict)  # a gain read as c + w -> c
    planes: dict[int, str] = field(default_factory=dict)  # group -> why only rotations of each plane keep it
    fixed: dict[int, str] = field(default_factory=dict)  # group -> why its width may not differ (trace.widths)
    scalars: list[tuple[str, float]] = field(default_factory=list)  # (node, number) of every float argument

    def __post_init__(self) -> None:
        if self.state_keys is None:
            self.state_keys = {k for k in self.gm.state_dict() if not CONSTANT.fullmatch(k)}
        self.groups.partial = self.partial

    def check(self) -> None:
        """Assert the invariants the rules keep: every node remembered is a node of the graph, and so is
        every node an attention rule remembers; every union-find element a tag, an axis, a writer or a
        name refers to exists; a tag has one layout per axis of its node's output, each as long as its
        axis; the names are distinct and name union-find roots that are not pinned."""
        nodes = set(self.gm.graph.nodes)
        assert set(self.tags) <= nodes, "a tag of a node outside the graph"
        for remembered in (self.attention_heads, self.packed, self.unbound):
            assert set(remembered) <= nodes, "an attention rule remembers a node outside the graph"
        known = set(self.groups.parent)
        layouts = [lay for t in self.tags.values() if t is not None for lay in t.layouts]
        layouts += [lay for lays in self.axes.values() for lay in lays]
        gids = {s.gid for lay in layouts if lay is not None for s in lay if isinstance(s, Seg | Within)}
        assert gids | set(self.writers) <= known, f"unknown groups {sorted(gids | set(self.writers) - known)}"
        for node, t in self.tags.items():  # a layout per axis of the node's output, as long as the axis
            shape = self.shape(node)
            if t is not None and shape is not None:
                assert len(t.layouts) == len(shape), f"{node.name}: {len(t.layouts)} layouts of {len(shape)} axes"
                assert all(
                    lay is None or sum(s.length for s in lay) == n for lay, n in zip(t.layouts, shape, strict=True)
                ), f"{node.name}: a layout not as long as its axis"
        assert all(self.groups.find(r) == r and r != FIXED for r in self.names), "a name of a non-root or FIXED"
        assert len(set(self.names.values())) == len(self.names), "two groups of one name"

    # ---- the primitive operations of every rule ------------------------------------------------------
    def tag(self, arg: object) -> Tag | None:
        return self.tags.get(arg) if isinstance(arg, fx.Node) else None

    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta")
        return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None

    def live(self, tag: Tag) -> list[int]:
        """The axes of ``tag`` still permuted: some segment's group is not pinned (so far)."""
        return [a for a in tag.permuted if any(self.groups.find(s.gid) != FIXED for s in tag.at(a))]

    def tagged_inputs(self, node: fx.Node) -> list[Tag]:
        return [t for a in node.all_input_nodes if (t := self.tag(a)) is not None]

    def pin(self, gids: Sequence[int], reason: str | None = None) -> None:
        """Leave ``gids`` unpermuted; ``reason``: why, in place of the node's own (:mod:`lmclab.trace.pinned`)."""
        with self.because(reason):
            for gid in gids:
                self.groups.union(gid, FIXED)

    @contextmanager
    def because(self, reason: str | None) -> Iterator[None]:
        """The pins made inside are for ``reason`` (None: the node's own)."""
        cause = self.groups.cause
        if reason is not None and cause is not None:
            self.groups.cause = (*cause[:2], reason)
        try:
            yield
        finally:
            self.groups.cause = cause

    def write(self, gid: int, kind: str, name: str, axis: int, ndim: int) -> None:
        """Module ``name``'s output holds group ``gid``'s units on ``axis``: an activation point (``@`` names
        the axis when it is not 1, as :mod:`lmclab.search.activation_matching` reads it)."""
        point = name if axis == 1 else f"{name}@{axis - ndim}"
        self.writers.setdefault(gid, []).append((kind, point))

    def cannot(self, gids: list[int], reason: str) -> None:
        """Groups no spec can follow: one-line :class:`TraceError`, or with ``partial`` pinned for ``reason``."""
        if not self.partial:
            raise TraceError(f"trace_spec: {reason}")
        self.pin(gids, reason)

    def refuse(self, node: fx.Node, reason: str) -> None:
        if not self.partial:
            raise TraceError(
                f"trace_spec: node {node.name!r}: {_op_name(node, self.gm)} in {_where(node)} "
                f"cannot be proved permutation-equivariant ({reason}); pass partial=True to leave "
                "its channels unpermuted"
            )
        for t in self.tagged_inputs(node):
            self.pin(t.gids, reason)
        self.tags[node] = None


def _where(node: fx.Node) -> str:
    """The module path a node belongs to (``(top level)`` outside any submodule); torch.fx and torch.export
    both record it, a called module's own path included."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()), ("(top level)",))[0] if stack else "(top level)"


def _op_name(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        return type(model.get_submodule(str(node.target))).__name__
    return getattr(node.target, "__name__", str(node.target))


def dim_of(node: fx.Node, index: int, default: object = None) -> object:
    """A call's ``dim`` argument: at ``index`` when given by position, else by keyword, ``dim`` or NumPy's ``axis``
    (which ``torch.cat``, ``torch.sum``, ``torch.softmax``, ``torch.unbind`` and their kind also take)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get("dim", node.kwargs.get("axis", default))


def exponent_of(node: fx.Node) -> object:
    """The exponent of ``x ** c``, ``torch.pow(x, c)`` or ``x.pow(exponent=c)``."""
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")


def unknown(node: fx.Node) -> str:
    """Why an op is refused; a function from outside torch that ``torch.fx`` kept whole (``torch.fx.wrap``)."""
    module = getattr(node.target, "__module__", None) or "torch"
    if node.op == "call_function" and inspect.isfunction(node.target) and module.split(".")[0] != "torch":
        return f"a function of {module} that torch.fx keeps whole: the graph does not show its inside"
    return "an operation the tracer does not know"


def tensor_identity(model: nn.Module, state: dict) -> dict[str, object]:
    """What each entry of ``state`` (``model``'s) is, so that two entries that are one tensor (an embedding tied to
    the head) compare equal: its storage's address, shape, strides and dtype — and on the ``meta`` device, where
    every tensor's address is 0, the parameter or buffer object itself (a model built without weights)."""
    owned = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    return {
        key: ("object", id(owned.get(key, value)))
        if value.is_meta
        else (value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
        for key, value in state.items()
    }


class Traced(NamedTuple):
    """The spec, and per group the modules whose outputs carry its units for activation matching:
    the norms that follow the layers writing it, or those layers themselves (pre-activation)."""

    spec: PermutationSpec
    points: dict[str, list[str]]
    fixed: dict[str, str] = {}  # group -> why its width may not differ between two models (lmclab.trace.widths)
    scalars: tuple[tuple[str, float], ...] = ()  # the graph's numbers: (node, value), in the graph's order
