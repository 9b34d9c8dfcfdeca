"""The tracer's two front ends agree: a model ``torch.fx`` traces gives the same spec when its graph comes from
``torch.export`` instead (the path Hugging Face models take, ``lmclab.trace.export``), with ``torch.fx`` made to
fail. Every model of the refusal catalogue (under ``partial=True``), of the kinds' reasons (for orthogonal maps:
the kinds, gains, offsets and reasons too) and the project's architectures is traced both ways; the few whose
``torch.fx`` graph keeps a module whole that ``torch.export`` opens are checked invariant under the exported
spec instead. A translation of an ATen operation that loses an argument, an axis or a rule shows here."""

from __future__ import annotations

import pytest
import torch
from test_trace_kind_reasons import CASES as KIND_CASES
from test_trace_refusal_catalogue import CASES as REFUSAL_CASES
from test_trace_refusal_catalogue import _invariant
from torch import nn

import lmclab.trace
from lmclab.archs import build_model, make_config
from lmclab.core.spec import PermutationSpec
from lmclab.trace import trace_spec

# torch.fx keeps these whole (nn.MultiheadAttention, a function torch.fx.wrap marks): export opens them, and the
# spec it gives permutes what the opened graph proves
OPENED = {
    "library-function-kept-whole",
    "multihead-attention-with-extra-keys",
    "multihead-attention-with-a-permuted-mask",
    "multihead-attention-on-query-key-and-value-unlike",
}
ARCHS = {
    "mlp": ("mlp", (1, 28, 28), {"hidden": 2, "width": 16}),
    "vgg": ("vgg", (3, 32, 32), {"width_multiplier": 0.125}),
    "resnet20": ("resnet20", (3, 32, 32), {"width_multiplier": 1}),
    "mixer": ("mixer", (3, 32, 32), {"patch_size": 8, "hidden": 8, "token_mlp": 8, "channel_mlp": 8, "depth": 1}),
    "vit": ("vit", (3, 32, 32), {"patch_size": 8, "width": 8, "heads": 2, "depth": 1}),
    "vit-mean-sincos": ("vit", (3, 32, 32), {"patch_size": 8, "width": 8, "heads": 2, "depth": 1, "pool": "mean"}),
    "gpt": ("gpt", (6,), {"width": 8, "depth": 1, "heads": 2, "mlp_ratio": 2}),
    "gpt-rotary-gqa-swiglu": (
        "gpt",
        (6,),
        {"width": 8, "depth": 1, "heads": 2, "kv_heads": 1, "position": "rotary", "mlp": "swiglu", "norm": "rmsnorm"},
    ),
}


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch):
    """``trace_spec`` through ``torch.export``: ``torch.fx.symbolic_trace`` fails as on untraceable Python."""

    def traced(model: nn.Module, x, **keywords) -> PermutationSpec:
        def refuse(*args, **kwargs):
            raise RuntimeError("symbolic tracing refused")

        with monkeypatch.context() as patch:
            patch.setattr(lmclab.trace.fx, "symbolic_trace", refuse)
            return trace_spec(model, x, **keywords)

    return traced


@pytest.mark.parametrize("key", REFUSAL_CASES)
def test_a_partial_spec_is_the_same_through_torch_export(key: str, exported) -> None:
    model, x = REFUSAL_CASES[key].build()
    through_fx, through_export = trace_spec(model, x, partial=True), exported(model, x, partial=True)
    if key in OPENED:
        assert through_export != through_fx
        _invariant(model, x, through_export)
    else:
        assert through_export == through_fx


WHOLE_MODULES = ("heads-of-a-whole-multihead-attention",)  # torch.export decomposes it: no module is whole there


@pytest.mark.parametrize("key", [key for key in KIND_CASES if key not in WHOLE_MODULES])
def test_kinds_gains_and_reasons_are_the_same_through_torch_export(key: str, exported) -> None:
    model, x = KIND_CASES[key].build()
    through_fx, through_export = (f(model, x, symmetry="orthogonal") for f in (trace_spec, exported))
    assert through_export == through_fx  # axes, heads, kinds, gains, their biases and offsets
    assert through_export.kind_reasons.keys() == through_fx.kind_reasons.keys()


@pytest.mark.parametrize("case", ARCHS)
def test_the_project_s_architectures_trace_alike_through_torch_export(case: str, exported) -> None:
    arch, shape, fields = ARCHS[case]
    model = build_model(arch, make_config(arch, input_shape=shape, num_classes=5, **fields), seed=0).eval()
    x = torch.randint(0, 5, (2, *shape)) if arch == "gpt" else torch.randn(2, *shape)
    for symmetry in ("permutation", "orthogonal"):
        assert exported(model, x, symmetry=symmetry) == trace_spec(model, x, symmetry=symmetry)


@pytest.mark.parametrize("fused", [True, False])
def test_packed_q_k_v_unbound_into_its_parts_traces_alike_through_torch_export(fused: bool, exported) -> None:
    """timm's attention (``qkv.unbind(0)``): torch.export records ``aten.unbind.int``, read as ``torch.unbind``."""
    from test_trace_packed import Attention

    torch.manual_seed(0)
    model, x = Attention(16, 4, fused=fused).eval(), torch.randn(2, 5, 16)
    for symmetry in ("permutation", "orthogonal"):
        assert exported(model, x, symmetry=symmetry) == trace_spec(model, x, symmetry=symmetry)
