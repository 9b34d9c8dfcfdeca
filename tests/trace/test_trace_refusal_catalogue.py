"""Every refusal of the tracer, reached: each reason a rule of ``src/lmclab/trace`` gives ``refuse`` (or
``refuse_packed``, or returns from ``heads_reason``, ``packed_reason`` and ``unknown``) has a case here, the
smallest model that reaches it. Each case is checked three ways:

- the whole one-line message, node, operation, module path and reason (a reader greps for it);
- with ``partial=True`` the trace goes through, the refused node's inputs are pinned with that reason, and
  random permutations of the spec keep the output in float64 (the partial spec is still exact);
- the list itself: a reason in the source with no case here fails ``tests/meta/test_trace_catalogues.py``, so a
  new refusal comes with its case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from test_trace_refusals import overridable
from torch import nn

from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec


class Case(NamedTuple):
    """``build()`` gives the model and its example inputs; the refusal is of node ``node``, an ``op`` (the
    module's class or the function's name) in module path ``where``, for ``reason``. ``pins``: whether the
    refused node has permuted inputs, which ``partial=True`` then pins with the reason."""

    build: Callable[[], tuple[nn.Module, Any]]
    node: str
    op: str
    where: str
    reason: str
    pins: bool = True


class Net(nn.Module):
    """Parameters and layers a case's ``forward`` (a function of the module and its input) picks from."""

    def __init__(self, forward: Callable[..., torch.Tensor], **layers: nn.Module) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(5, 6), nn.Linear(6, 3)
        for name, layer in layers.items():
            self.add_module(name, layer)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


def _flip(m: Net, x: torch.Tensor) -> torch.Tensor:
    return m.head(torch.relu(m.a(x)).flip(-1))


# --- cases for attention.py, calls.py, packed.py, routing.py and state.py ---
F = nn.functional
SDPA = F.scaled_dot_product_attention


def _heads(h: torch.Tensor) -> torch.Tensor:
    """``(2, 4, 6) -> (2, 4, 2, 3)``: the 6 units of one group as 2 heads of 3, the heads beside the features."""
    return h.reshape(2, 4, 2, 3)


def _batched(h: torch.Tensor) -> torch.Tensor:
    """As :func:`_heads`, the heads on axis 1 (a batch axis of a product), the tokens on axis 2."""
    return _heads(h).transpose(1, 2)


def _logits(q: torch.Tensor) -> torch.Tensor:
    """``q kᵀ`` with ``k = q``: ``(batch, heads, tokens, tokens)``, permuted by the head order alone."""
    return q @ q.transpose(-2, -1)


def _two_groups(m: Net, x: torch.Tensor) -> torch.Tensor:
    """``b``'s 3 units beside ``c``'s 3: an axis of 6 units in two groups (``a``'s 6 are one)."""
    return torch.cat([m.b(x), m.c(x)], -1)


def _parts(m: Net, x: torch.Tensor) -> torch.Tensor:
    """timm's packed q, k, v: ``qkv``'s 18 units as ``(3 parts, batch, 2 heads, 4 tokens, 3)``."""
    return m.qkv(x).reshape(2, 4, 3, 2, 3).permute(2, 0, 3, 1, 4)


def _two_linears() -> dict[str, nn.Module]:
    return {"b": nn.Linear(5, 3), "c": nn.Linear(5, 3)}


def _attention(**options: Any) -> nn.MultiheadAttention:
    return nn.MultiheadAttention(6, 2, batch_first=True, **options)


# --- cases for functional.py, graph.py, layers.py and shapes.py ---


def _mlp(forward: Callable[..., torch.Tensor]) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with ``c`` (5 → 2) and ``d`` (5 → 4) beside ``a`` and ``head``, on ``(2, 5)`` inputs."""
    return lambda: (Net(forward, c=nn.Linear(5, 2), d=nn.Linear(5, 4)), torch.randn(2, 5))


def _split(m: Net, x: torch.Tensor) -> torch.Tensor:
    """``q``'s 16 units as 4 heads of 4: ``(2, 9, 4, 4)``, the head axis beside the per-head features."""
    return m.q(x).reshape(2, 9, 4, 4)


def _headed(forward: Callable[..., torch.Tensor]) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with ``q`` (16 → 16) split into heads and ``mix`` (4 → 4), on ``(2, 9, 16)`` inputs."""
    return lambda: (Net(forward, q=nn.Linear(16, 16), mix=nn.Linear(4, 4)), torch.randn(2, 9, 16))


def _convs(
    forward: Callable[..., torch.Tensor], **layers: Callable[[], nn.Module]
) -> Callable[[], tuple[nn.Module, Any]]:
    """A ``Net`` with convs ``c1`` and ``c2`` (2 → 3 channels) and ``layers`` (each built anew from its factory, so
    that no case shares a module with another build), on ``(1, 2, 4, 4)`` inputs."""
    return lambda: (
        Net(forward, c1=nn.Conv2d(2, 3, 1), c2=nn.Conv2d(2, 3, 1), **{k: f() for k, f in layers.items()}),
        torch.randn(1, 2, 4, 4),
    )


def _two_parts(m: Net, x: torch.Tensor) -> torch.Tensor:
    """Channels (axis 1) in two segments: ``c1``'s 3, then ``c2``'s 3."""
    return torch.cat([m.c1(x), m.c2(x)], 1)


# One case per reason; the key is the case's id. Cases are grouped by the module of src/lmclab/trace whose rule
# refuses (keep each group in its own block).
CASES: dict[str, Case] = {
    # --- state.py -----------------------------------------------------------------------------------------
    "unknown-operation": Case(
        lambda: (Net(_flip), torch.randn(2, 5)), "flip", "flip", "(top level)", "an operation the tracer does not know"
    ),
    "library-function-kept-whole": Case(
        lambda: (Net(lambda m, x: m.head(overridable("mylib.ops")(m.a(x)))), torch.randn(2, 5)),
        "op",
        "op",
        "(top level)",
        "a function of mylib.ops that torch.fx keeps whole: the graph does not show its inside",
    ),
    # --- attention.py ------------------------------------------------------------------------------------
    "two-head-counts": Case(  # a's 6 units as 2 heads of 3, then as 3 heads of 2
        lambda: (
            Net(lambda m, x: m.head(_heads(m.a(x)).flatten(2) * m.a(x).reshape(2, 4, 3, 2).flatten(2))),
            torch.randn(2, 4, 5),
        ),
        "reshape_1",
        "reshape",
        "(top level)",
        "a split into 3 heads of a group split into 2 heads elsewhere",
    ),
    "softmax-across-heads": Case(
        lambda: (Net(lambda m, x: m.head(torch.softmax(_heads(m.a(x)), dim=2).flatten(2))), torch.randn(2, 4, 5)),
        "softmax",
        "softmax",
        "(top level)",
        "a softmax across heads whose features are permuted per head",
    ),
    "product-with-a-vector": Case(
        lambda: (Net(lambda m, x: m.a(x) @ x.new_ones(6)), torch.randn(2, 5)),
        "matmul",
        "matmul",
        "(top level)",
        "a product with a vector",
    ),
    "product-over-units-of-two-layouts": Case(  # a's one group of 6 against b's 3 and c's 3
        lambda: (Net(lambda m, x: m.a(x) @ _two_groups(m, x).transpose(0, 1), **_two_linears()), torch.randn(2, 5)),
        "matmul",
        "matmul",
        "(top level)",
        "a product over an axis its operands permute differently",
    ),
    "product-over-features-of-heads-beside-them": Case(  # the heads on axis 2, beside the contracted features
        lambda: (
            Net(lambda m, x: _heads(m.a(x)) @ _heads(m.b(x)).transpose(-2, -1), b=nn.Linear(5, 6)),
            torch.randn(2, 4, 5),
        ),
        "matmul",
        "matmul",
        "(top level)",
        "a product over the features of heads that are not one batch axis",
    ),
    "product-with-batch-axes-of-two-layouts": Case(  # (6, 2, 1) @ (6, 1, 2): a's 6 units against b's 3 and c's 3
        lambda: (
            Net(
                lambda m, x: m.a(x).transpose(0, 1)[:, :, None] @ _two_groups(m, x).transpose(0, 1)[:, None],
                **_two_linears(),
            ),
            torch.randn(2, 5),
        ),
        "matmul",
        "matmul",
        "(top level)",
        "its operands are permuted differently on a batch axis",
    ),
    "multihead-attention-with-extra-keys": Case(
        lambda: (
            Net(lambda m, x: m.head(m.attn(*[m.a(x)] * 3)[0]), attn=_attention(add_zero_attn=True)),
            torch.randn(2, 4, 5),
        ),
        "attn",
        "MultiheadAttention",
        "attn",
        "a MultiheadAttention with separate q/k/v projections or extra keys",
    ),
    "multihead-attention-with-a-permuted-mask": Case(  # the (4, 4) mask: b's 4 units on its last axis
        lambda: (
            Net(
                lambda m, x: m.head(m.attn(*[m.a(x)] * 3, attn_mask=m.b(x)[0])[0]),
                attn=_attention(),
                b=nn.Linear(5, 4),
            ),
            torch.randn(2, 4, 5),
        ),
        "attn",
        "MultiheadAttention",
        "attn",
        "an attention mask that is permuted",
    ),
    "multihead-attention-over-permuted-tokens": Case(  # (2, 6, 3): a's 6 units are the tokens
        lambda: (
            Net(
                lambda m, x: m.attn(*[m.a(x).transpose(1, 2)] * 3)[0],
                attn=nn.MultiheadAttention(3, 1, batch_first=True),
            ),
            torch.randn(2, 3, 5),
        ),
        "attn",
        "MultiheadAttention",
        "attn",
        "an attention over permuted tokens or samples",
    ),
    "multihead-attention-on-query-key-and-value-unlike": Case(  # the query b's 3 and c's 3, key and value a's 6
        lambda: (
            Net(lambda m, x: m.head(m.attn(_two_groups(m, x), m.a(x), m.a(x))[0]), attn=_attention(), **_two_linears()),
            torch.randn(2, 4, 5),
        ),
        "attn",
        "MultiheadAttention",
        "attn",
        "its query, key and value are permuted differently",
    ),
    # --- calls.py ----------------------------------------------------------------------------------------
    "embedding-of-a-table-not-of-the-model": Case(  # the table: a's output
        lambda: (Net(lambda m, x: m.head(F.embedding(torch.zeros(2, dtype=torch.long), m.a(x)))), torch.randn(6, 5)),
        "embedding",
        "embedding",
        "(top level)",
        "an embedding of permuted indices, or of a table not of the model",
    ),
    "embedding-layer-of-permuted-indices": Case(  # ids read off a's units (all 0: a sigmoid cast to long)
        lambda: (
            Net(lambda m, x: m.head(m.e(m.a(x).sigmoid().to(torch.long))), e=nn.Embedding(4, 6)),
            torch.randn(2, 5),
        ),
        "e",
        "Embedding",
        "e",
        "an embedding of permuted indices",
    ),
    "addmm-of-a-weight-not-of-the-model": Case(  # head.weight.t(): computed, not a parameter
        lambda: (
            Net(lambda m, x: torch.ops.aten.addmm.default(m.head.bias, torch.relu(m.a(x)), m.head.weight.t())),
            torch.randn(2, 5),
        ),
        "addmm_default",
        "addmm.default",
        "(top level)",
        "a product whose weight or bias is not a parameter of the model",
    ),
    "functional-conv-of-a-kernel-not-of-the-model": Case(
        lambda: (
            Net(lambda m, x: F.conv2d(m.c(x), m.d.weight * 2), c=nn.Conv2d(1, 4, 1), d=nn.Conv2d(4, 3, 1)),
            torch.randn(2, 1, 3, 3),
        ),
        "conv2d",
        "conv2d",
        "(top level)",
        "a convolution whose kernel or bias is not a parameter of the model",
    ),
    "functional-conv-over-permuted-width": Case(  # (2, 1, 3, 6): a's units on the last axis
        lambda: (
            Net(lambda m, x: F.conv2d(m.a(x), m.c.weight, m.c.bias), c=nn.Conv2d(1, 4, 1)),
            torch.randn(2, 1, 3, 5),
        ),
        "conv2d",
        "conv2d",
        "(top level)",
        "a convolution over a permuted axis that is not its channel axis",
    ),
    "grouped-functional-conv-splitting-a-segment": Case(  # groups of 3 channels over p's 4 and q's 2
        lambda: (
            Net(
                lambda m, x: F.conv2d(torch.cat([m.p(x), m.q(x)], 1), m.g.weight, m.g.bias, groups=2),
                p=nn.Conv2d(1, 4, 1),
                q=nn.Conv2d(1, 2, 1),
                g=nn.Conv2d(6, 6, 1, groups=2),
            ),
            torch.randn(2, 1, 3, 3),
        ),
        "conv2d",
        "conv2d",
        "(top level)",
        "a grouped convolution (2 groups) reading segments that split them",
    ),
    "expand-of-a-permuted-axis": Case(  # b's one unit repeated 6 times
        lambda: (Net(lambda m, x: m.head(m.b(x).expand(2, 6)), b=nn.Linear(5, 1)), torch.randn(2, 5)),
        "expand",
        "expand",
        "(top level)",
        "an expand of a permuted axis",
    ),
    "split-cutting-a-group": Case(  # a's 6 units into 2 and 4
        lambda: (Net(lambda m, x: m.head(torch.cat(torch.split(m.a(x), [2, 4], -1)[::-1], -1))), torch.randn(2, 5)),
        "split",
        "split",
        "(top level)",
        "a split of a permuted axis into pieces that are not whole groups",
    ),
    # --- packed.py ---------------------------------------------------------------------------------------
    "fused-grouped-query-attention": Case(
        lambda: (Net(lambda m, x: SDPA(*[_batched(m.a(x))] * 3, enable_gqa=True)), torch.randn(2, 4, 5)),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "grouped-query attention (keys shared by several query heads)",
    ),
    "fused-attention-with-a-headed-mask": Case(  # the mask: the logits q kᵀ, permuted by the head order
        lambda: (
            Net(lambda m, x: SDPA(*[_batched(m.a(x))] * 3, attn_mask=_logits(_batched(m.a(x))))),
            torch.randn(2, 4, 5),
        ),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "an attention mask that is permuted",
    ),
    "fused-attention-over-permuted-tokens": Case(  # (2, 6, 3): a's 6 units are the tokens
        lambda: (Net(lambda m, x: SDPA(*[m.a(x).transpose(1, 2)] * 3)), torch.randn(2, 3, 5)),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "an attention over permuted tokens",
    ),
    "fused-attention-over-features-of-two-layouts": Case(  # the query a's 6 units, the key b's 3 and c's 3
        lambda: (Net(lambda m, x: SDPA(m.a(x), _two_groups(m, x), m.a(x)), **_two_linears()), torch.randn(2, 4, 5)),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "a product over an axis its operands permute differently",
    ),
    "fused-attention-with-the-key-heads-on-another-axis": Case(  # the query's heads on axis 1, the key's on 0
        lambda: (
            Net(lambda m, x: SDPA(_batched(m.a(x)), _batched(m.a(x)).transpose(0, 1), _batched(m.a(x)))),
            torch.randn(2, 4, 5),
        ),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "a product over the features of heads that are not one batch axis",
    ),
    "fused-attention-with-batch-axes-of-two-layouts": Case(  # (6, 1, 2): a's 6 units against b's 3 and c's 3
        lambda: (
            Net(
                lambda m, x: SDPA(*(t.transpose(0, 1)[:, None] for t in (m.a(x), _two_groups(m, x), m.a(x)))),
                **_two_linears(),
            ),
            torch.randn(2, 5),
        ),
        "scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "(top level)",
        "its query, key and value are permuted differently on a batch axis",
    ),
    "unbind-of-packed-parts-along-the-batch": Case(
        lambda: (Net(lambda m, x: _parts(m, x).unbind(1)[0], qkv=nn.Linear(5, 18)), torch.randn(2, 4, 5)),
        "unbind",
        "unbind",
        "(top level)",
        "an unbind along an axis that is not the packed part axis",
    ),
    # --- routing.py --------------------------------------------------------------------------------------
    "split-of-per-head-features": Case(
        lambda: (Net(lambda m, x: _heads(m.a(x)).split(1, -1)[0]), torch.randn(2, 4, 5)),
        "split",
        "split",
        "(top level)",
        "a split of each head's features into q, k, v packed head by head: their rows interleave per head, "
        "which no headed group (one run of heads × features) can hold",
    ),
    "mean-over-heads": Case(
        lambda: (Net(lambda m, x: _heads(m.a(x)).mean(2)), torch.randn(2, 4, 5)),
        "mean",
        "mean",
        "(top level)",
        "an operation over heads or per-head features it does not know",
    ),
    "index-of-qkv-packed-head-by-head": Case(  # Bloom's (batch, tokens, heads, 3, d): q, each head's part 0
        lambda: (
            Net(lambda m, x: m.qkv(x).reshape(2, 4, 2, 3, 3)[:, :, :, 0], qkv=nn.Linear(5, 18)),
            torch.randn(2, 4, 5),
        ),
        "getitem",
        "getitem",
        "(top level)",
        "an index of q, k, v packed head by head, (heads, 3, d): their rows interleave per head, "
        "which no headed group (one run of heads × features) can hold",
    ),
    "sum-over-packed-parts": Case(
        lambda: (Net(lambda m, x: _parts(m, x).sum(0), qkv=nn.Linear(5, 18)), torch.randn(2, 4, 5)),
        "sum_1",
        "sum",
        "(top level)",
        "an operation on packed q/k/v it does not know",
    ),
    #
    #
    #
    #
    # --- functional.py -----------------------------------------------------------------------------------
    "carry-changes-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: m.pool(m.a(x)), pool=nn.AdaptiveAvgPool2d(2)), torch.randn(2, 3, 4, 5)),
        "pool",
        "AdaptiveAvgPool2d",
        "pool",
        "it changes a permuted axis",
    ),
    "pooling-window-over-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: F.avg_pool2d(m.a(x), 3, stride=1, padding=1)), torch.randn(2, 3, 4, 5)),
        "avg_pool2d",
        "avg_pool2d",
        "(top level)",
        "a pooling window over a permuted axis",
    ),
    "functional-norm-scaled-by-a-permuted-tensor": Case(
        lambda: (Net(lambda m, x: F.layer_norm(x, (6,), m.w(x)[0]), w=nn.Linear(6, 6)), torch.randn(2, 6)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a norm whose statistics or scale are computed from a permuted tensor",
    ),
    "functional-layer-norm-over-two-axes": Case(
        lambda: (Net(lambda m, x: m.head(F.layer_norm(m.a(x), (3, 6)))), torch.randn(2, 3, 5)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a LayerNorm or RMSNorm over more than the permuted feature axis",
    ),
    "functional-group-norm-over-split-runs": Case(
        _mlp(lambda m, x: m.head(F.group_norm(torch.cat([m.c(x), m.d(x)], 1), 2))),
        "group_norm",
        "group_norm",
        "(top level)",
        "a group norm over runs of channels that segments of the axis split",
    ),
    "functional-norm-weight-not-of-the-model": Case(
        lambda: (Net(lambda m, x: m.head(F.layer_norm(m.a(x), (6,), torch.ones_like(m.a.bias)))), torch.randn(2, 5)),
        "layer_norm",
        "layer_norm",
        "(top level)",
        "a norm whose weight is not a parameter or buffer of the model",
    ),
    "functional-linear-weight-not-of-the-model": Case(
        lambda: (Net(lambda m, x: F.linear(torch.relu(m.a(x)), 2 * m.head.weight)), torch.randn(2, 5)),
        "linear",
        "linear",
        "(top level)",
        "a linear whose weight or bias is not a parameter of the model",
    ),
    "pad-along-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: F.pad(m.a(x), (1, 1))), torch.randn(2, 3, 5)),
        "pad",
        "pad",
        "(top level)",
        "a pad along a permuted axis",
    ),
    "roll-along-a-permuted-axis": Case(
        lambda: (Net(lambda m, x: m.head(m.a(x).roll(1, -1))), torch.randn(2, 5)),
        "roll",
        "roll",
        "(top level)",
        "a roll along a permuted axis",
    ),
    # --- graph.py ----------------------------------------------------------------------------------------
    "per-head-features-beside-two-head-axes": Case(
        _headed(lambda m, x: _split(m, x)[:, :, :, None] + _split(m, x)[:, :, None]),
        "add",
        "add",
        "(top level)",
        "per-head features beside no axis of their heads, or two",
    ),
    "module-over-per-head-features": Case(
        _headed(lambda m, x: m.mix(_split(m, x))),
        "mix",
        "Linear",
        "mix",
        "an operation over heads or per-head features it does not know",
    ),
    "conv-over-a-permuted-spatial-axis": Case(
        lambda: (Net(lambda m, x: m.conv(m.a(x)), conv=nn.Conv2d(3, 4, 1)), torch.randn(2, 3, 4, 5)),
        "conv",
        "Conv2d",
        "conv",
        "a convolution over a permuted axis that is not its channel axis",
    ),
    "unknown-module": Case(
        lambda: (Net(lambda m, x: m.head(m.act(m.a(x))), act=nn.SELU()), torch.randn(2, 5)),
        "act",
        "SELU",
        "act",
        "an operation the tracer does not know",
    ),
    "sum-of-operands-in-different-segments": Case(
        _mlp(lambda m, x: m.head(m.a(x) + torch.cat([m.c(x), m.d(x)], 1))),
        "add",
        "add",
        "(top level)",
        "its operands are permuted in blocks or segments that differ",
    ),
    "parameter-along-per-head-features": Case(
        _headed(lambda m, x: _split(m, x) + m.mix.bias),
        "add",
        "add",
        "(top level)",
        "a parameter varying along heads or per-head features",
    ),
    # --- layers.py ---------------------------------------------------------------------------------------
    "grouped-conv-over-segments-that-split-its-groups": Case(
        _convs(lambda m, x: m.g(_two_parts(m, x)), g=lambda: nn.Conv2d(6, 6, 1, groups=3)),
        "g",
        "Conv2d",
        "g",
        "a grouped convolution (3 groups of 2 channels) reading segments that do not hold whole groups",
    ),
    "layer-norm-module-over-two-axes": Case(
        lambda: (Net(lambda m, x: m.head(m.ln(m.a(x))), ln=nn.LayerNorm((3, 6))), torch.randn(2, 3, 5)),
        "ln",
        "LayerNorm",
        "ln",
        "a LayerNorm or RMSNorm over more than the permuted feature axis",
    ),
    "group-norm-module-over-split-runs": Case(
        _convs(lambda m, x: m.gn(_two_parts(m, x)), gn=lambda: nn.GroupNorm(3, 6)),
        "gn",
        "GroupNorm",
        "gn",
        "a group norm over runs of channels that segments of the axis split",
    ),
    # --- shapes.py ---------------------------------------------------------------------------------------
    "flatten-of-heads-with-another-axis": Case(
        _headed(lambda m, x: _split(m, x).flatten(1, 2)),
        "flatten",
        "flatten",
        "(top level)",
        "a flatten that does not join a head axis to the features of its heads",
    ),
    "flatten-of-two-permuted-axes": Case(
        lambda: (Net(lambda m, x: m.t(m.a(x).transpose(1, 2)).flatten(1), t=nn.Linear(3, 4)), torch.randn(2, 3, 5)),
        "flatten",
        "flatten",
        "(top level)",
        "a flatten of two permuted axes into one",
    ),
    "reshape-it-cannot-follow": Case(
        lambda: (Net(lambda m, x: m.a(x).reshape(3, 4)), torch.randn(2, 5)),
        "reshape",
        "reshape",
        "(top level)",
        "a reshape (2, 6) -> (3, 4) it cannot follow",
    ),
    "concatenation-of-a-permuted-and-a-computed-tensor": Case(
        lambda: (Net(lambda m, x: m.head(torch.cat([m.a(x), torch.ones(1, 6)]))), torch.randn(2, 5)),
        "cat",
        "cat",
        "(top level)",
        "a concatenation of tensors permuted on another axis, not alike",
    ),
    "index-by-a-list": Case(
        lambda: (Net(lambda m, x: m.head(m.a(x)[[0, 1]])), torch.randn(3, 5)),
        "getitem",
        "getitem",
        "(top level)",
        "an index by tensors",
    ),
    "index-of-one-unit": Case(
        lambda: (Net(lambda m, x: m.a(x)[:, 0]), torch.randn(2, 5)),
        "getitem",
        "getitem",
        "(top level)",
        "an index that picks units of a permuted axis",
    ),
}


def _message(case: Case) -> str:
    return (
        f"trace_spec: node {case.node!r}: {case.op} in {case.where} cannot be proved permutation-equivariant "
        f"({case.reason}); pass partial=True to leave its channels unpermuted"
    )


@pytest.mark.parametrize("key", CASES)
def test_every_refusal_gives_its_whole_message(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    with pytest.raises(TraceError) as refused:
        trace_spec(model, x)
    assert str(refused.value) == _message(case)


def _invariant(model: nn.Module, x: Any, spec: PermutationSpec) -> None:
    model = model.double().eval()
    x = x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    state = model.state_dict()
    with torch.no_grad():
        expected = model(x)
        for seed in range(2):
            perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
            model.load_state_dict(apply_permutation(spec, perm, state))
            assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()
        model.load_state_dict(state)


@pytest.mark.parametrize("key", CASES)
def test_under_partial_every_refusal_pins_its_inputs_with_the_reason_and_keeps_the_function(key: str) -> None:
    case = CASES[key]
    model, x = case.build()
    spec = trace_spec(model, x, partial=True)
    pins = [p for p in spec.pinned if p.node == case.node]
    if case.pins:
        assert pins and all(p.reason == case.reason and p.where == case.where for p in pins)
    _invariant(model, x, spec)
