"""The rules of :mod:`lmclab.trace` for the calls of an exported graph (:mod:`lmclab.trace.export`) and of any
model that calls them itself. Mixed into :class:`lmclab.trace.graph.GraphTracer`.

- ``F.embedding(ids, weight)`` and an ``nn.Embedding`` module: row ``i`` of the table is the embedding of token
  ``i``; the output's last axis is a new group, the table's axis 1 (a table tied to an output head is one
  parameter: the head's rows are the logits, never permuted);
- ``addmm(bias, x, weight)`` with ``weight`` stored ``(in, out)`` (GPT-2's ``Conv1D``): a Linear whose
  weight is transposed: a new group on the output's last axis and the weight's axis 1, the input's
  layout on the weight's axis 0;
- ``F.conv2d`` of the model's own kernel: as ``nn.Conv2d`` (a grouped one ties its input's conv groups);
- ``expand`` repeats size-1 axes and adds leading ones: the permuted axes keep their layouts;
- ``split``/``chunk`` of an axis: along an unpermuted axis every piece keeps the layouts; along an axis
  holding one group of ``P·E`` units in ``P`` equal pieces (GPT-2's ``c_attn`` output into q, k, v) the
  group is refined into ``P`` groups side by side (:mod:`lmclab.trace.packed`), one per piece; along
  ``P`` segments of equal length, each piece is one of them; anything else is refused.
"""

from __future__ import annotations

import torch
from torch import fx

from lmclab.trace.groups import Seg, Tag
from lmclab.trace.state import TraceState

aten = torch.ops.aten
F = torch.nn.functional
SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, torch.split, torch.chunk}
SPLITS |= {"split", "chunk"}  # the methods, as torch.fx records them
CALL_RULES = {F.embedding: "embedding", aten.addmm.default: "addmm", torch.addmm: "addmm", F.conv2d: "functional_conv"}
CALL_RULES |= {aten.expand.default: "expand", **dict.fromkeys(SPLITS, "split")}


def module_kind(node: fx.Node) -> tuple[str, str]:
    """The innermost module a node was called in: its path and its class's qualified name."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, kind = next(reversed(stack.values()))
    return path, kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"


class CallRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``record``, ``parameter``, ``refine``, ``grouped_output`` and ``carry``."""

    def written(self, node: fx.Node, gid: int, kinds: tuple[str, ...], axis: str = "@-1", role: str = "layer") -> None:
        """An activation point on ``axis`` (``@-1``: the last; ``""``: axis 1) of the module ``node`` runs in, when
        it is one of ``kinds`` (its output is then ``node``'s, reshaped at most: ``nn.Linear``, GPT-2's
        ``Conv1D``, ``nn.Embedding``, ``nn.Conv2d``, ``nn.LayerNorm``)."""
        path, kind = module_kind(node)
        if path and kind.rsplit(".", 1)[-1] in kinds:
            self.writers.setdefault(gid, []).append((role, f"{path}{axis}"))

    def embedding(self, node: fx.Node, t_in: Tag | None) -> None:
        args = dict(zip(("input", "weight"), node.args, strict=False)) | node.kwargs  # torch.fx: every option too
        ids, weight = args["input"], args["weight"]
        if self.tag(ids) is not None or self.parameter(weight) is not weight:
            return self.refuse(node, "an embedding of permuted indices, or of a table not of the model")
        g, shape = self.groups.new(), self.shape(node)
        out = (Seg(g, shape[-1]),)
        self.record(str(weight.target), [None, out])
        self.written(node, g, ("Embedding",))
        self.tags[node] = Tag.of((None,) * (len(shape) - 1) + (out,))

    def embedding_layer(self, node: fx.Node, name: str) -> None:
        """An ``nn.Embedding`` module (a leaf of the ``torch.fx`` graph): as ``F.embedding`` of its weight."""
        if self.tagged_inputs(node):
            return self.refuse(node, "an embedding of permuted indices")
        g, shape = self.groups.new(), self.shape(node)
        out = (Seg(g, shape[-1]),)
        self.record(f"{name}.weight", [None, out])
        self.write(g, "layer", name, len(shape) - 1, len(shape))
        self.tags[node] = Tag.of((None,) * (len(shape) - 1) + (out,))

    def addmm(self, node: fx.Node, t_in: Tag | None) -> None:
        args = dict(zip(("input", "mat1", "mat2"), node.args, strict=False)) | node.kwargs
        bias, x, weight = args["input"], args["mat1"], args["mat2"]  # beta and alpha scale it: still linear
        if self.tag(x) is not t_in or any(self.parameter(p) is not p for p in (bias, weight)):
            return self.refuse(node, "a product whose weight or bias is not a parameter of the model")
        g, shape = self.groups.new(), self.shape(node)
        out = (Seg(g, shape[-1]),)
        self.record(str(weight.target), [t_in.at(-1) if t_in else None, out])
        self.record(str(bias.target), [out])
        self.written(node, g, ("Conv1D", "Linear"))
        self.tags[node] = Tag.of((t_in.layouts[:-1] if t_in else (None,) * (len(shape) - 1)) + (out,))

    def functional_conv(self, node: fx.Node, t_in: Tag | None) -> None:
        """``F.conv2d(x, weight, bias, stride, padding, dilation, groups)`` of the model's kernel."""
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        args = dict(zip(names, node.args, strict=False)) | node.kwargs
        weight, bias, groups = args["weight"], args.get("bias"), args.get("groups", 1)
        if self.tag(args["input"]) is not t_in or any(
            p is not None and self.parameter(p) is not p for p in (weight, bias)
        ):
            return self.refuse(node, "a convolution whose kernel or bias is not a parameter of the model")
        if t_in is not None and self.live(t_in) not in ([], [1]):
            return self.refuse(node, "a convolution over a permuted axis that is not its channel axis")
        c_out, c_in = self.shape(weight)[:2]
        if groups == 1:
            layout = (Seg(self.groups.new(), c_out),)
            self.record(str(weight.target), [layout, t_in.at(1) if t_in else None, None, None])
            self.written(node, layout[0].gid, ("Conv2d",), axis="")
        elif t_in is None or t_in.at(1) is None or (layout := self.grouped_output(t_in, c_in, c_out // groups)) is None:
            return self.refuse(node, f"a grouped convolution ({groups} groups) reading segments that split them")
        else:
            self.record(str(weight.target), [layout, None, None, None])
        if bias is not None:
            self.record(str(bias.target), [layout])
        self.tags[node] = Tag.of((None, layout, None, None))

    def expand(self, node: fx.Node, t_in: Tag | None) -> None:
        new = len(self.shape(node)) - len(self.shape(node.args[0]))
        moved = Tag.of((None,) * new + t_in.layouts)
        shape_in = (1,) * new + self.shape(node.args[0])
        if any(shape_in[a] != self.shape(node)[a] for a in self.live(moved)):
            return self.refuse(node, "an expand of a permuted axis")
        self.tags[node] = moved

    def split(self, node: fx.Node, t_in: Tag | None) -> None:
        """Pieces along ``dim`` (module docstring); each ``pieces[i]`` is read by ``operator.getitem``."""
        x = node.args[0]  # the size may be a keyword (split_size_or_sections, split_size, chunks)
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(self.shape(x))
        pieces = node.meta.get("val") or node.meta.get("tensor_meta")  # export's values, or ShapeProp's metadata
        lengths = [v.shape[dim] for v in pieces]
        if dim not in self.live(t_in):
            self.unbound[node] = [t_in] * len(lengths)
        elif (parts := self.parts(t_in.at(dim), lengths)) is None:
            return self.refuse(node, "a split of a permuted axis into pieces that are not whole groups")
        else:
            self.unbound[node] = [Tag.of(t_in.layouts[:dim] + (part,) + t_in.layouts[dim + 1 :]) for part in parts]
        self.tags[node] = None

    def parts(self, layout: tuple, lengths: list[int]) -> list[tuple] | None:
        """The layout of each piece of an axis cut into ``lengths`` (None: a piece would cut a segment)."""
        segs = [self.groups.resolve(s) if isinstance(s, Seg) else s for s in layout]
        if len(segs) == 1 and isinstance(segs[0], Seg) and segs[0].block == 1 and len(set(lengths)) == 1:
            if segs[0].gid in self.groups.heads or self.is_headed(segs[0]):
                return None
            return [(Seg(g, lengths[0]),) for g in self.refine(segs[0].gid, len(lengths))]
        if len(segs) == 1 and isinstance(segs[0], Seg) and len(set(lengths)) == 1:  # blocks (a channel shuffle's)
            return self.split_blocks(segs[0], len(lengths))
        if [s.length for s in segs] == lengths:
            return [(s,) for s in segs]
        return None
