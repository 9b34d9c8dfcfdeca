"""The tracer on the families a review found refused: Hugging Face Swin (``aten.pad`` on the export path, its
relative position bias passed to SDPA as the mask), T5 (two inputs as a dict, ``where`` over the position
bias, an embedding over the heads), and those refused with a documented workaround: GPT-NeoX, Bloom and
timm's LeViT, whose q, k, v are packed head by head. (torchvision's shufflenet_v2 and swin_t:
``tests/trace/test_trace.py`` and ``tests/trace/test_trace_timm.py``.) Each traced one: random permutations
of every group keep the outputs in float64, weight matching brings a permuted copy back exactly, and the
symmetry it leaves out is one the function does not have; each refused one: its one line, and
``partial=True`` keeps the function and is matched exactly. Every model is built afresh for each trace."""

from __future__ import annotations

import copy

import pytest
import torch

import lmclab
from lmclab.trace import TraceError, trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")
from transformers.models.t5 import modeling_t5  # noqa: E402


def tool():
    """tools/trace_coverage.py (tools/ is on the tests' import path): the models and their randomisation."""
    import trace_coverage

    return trace_coverage


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor | dict[str, torch.Tensor]]:
    """A fresh float64 model of the coverage table (random weights, eval mode) and a batch of 3 inputs."""
    make, shape = tool().MODELS[name]
    return tool().randomised(make(), shape), tool().inputs(shape, 3, seed=1)


def change(model: torch.nn.Module, twin: torch.nn.Module, x) -> float:
    y = tool().logits(model, x)
    return float((y - tool().logits(twin, x)).abs().max() / y.abs().max())


def matched_back(model, twin, traced, **given) -> bool:
    """WM (default options, ``given``: the spec or how to trace it) on ``model`` and ``twin`` = π(model): π(θb)
    equal to θa on every matched entry of the ``traced`` spec."""
    back = lmclab.find_permutation(model, twin, method="wm", **given).apply(twin)
    return all(torch.equal(back[k], v) for k, v in traced.matched(model.state_dict()).items())


def float64_t5_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """T5LayerNorm without its float32 mean of squares (kept on purpose by transformers): in float64 the
    change of a permuted model is then the permutation's alone, not float32 rounding of a reordered mean."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


class T5Logits(torch.nn.Module):
    """T5's logits alone: its output also holds the encoder's last hidden state, which pins the stream."""

    def __init__(self, t5: torch.nn.Module) -> None:
        super().__init__()
        self.t5 = t5

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.t5(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False).logits


def test_hf_swin_traces_with_its_head_orders_pinned_by_the_relative_position_bias():
    model, x = build("transformers:SwinForImageClassification")
    spec = trace_spec(model, x)
    spec.check(model.state_dict())
    stream = spec.axes["swin.embeddings.norm.weight"][0]
    q_proj = spec.axes["swin.encoder.layers.0.blocks.0.attention.q_proj.weight"]
    assert not spec.heads and q_proj == (None, stream) and stream is not None
    assert len(spec.groups) == 4  # two stages' streams (patch merging writes the second) and MLP units
    for seed in (1, 2):
        assert change(model, tool().permuted(model, spec, seed), x) <= 1e-12
    assert matched_back(model, tool().permuted(model, spec, 3), spec, example_inputs=x)


def test_moving_the_heads_of_a_swin_block_changes_its_logits():
    """The converse: the position bias differs per head, so the head order (the symmetry of plain multi-head
    attention) is none here: heads 0 and 1 swapped in q, k, v and the output projection's columns."""
    model, x = build("transformers:SwinForImageClassification")
    state, block = model.state_dict(), "swin.encoder.layers.0.blocks.0.attention"
    swap = torch.tensor([*range(8, 16), *range(8)])  # 2 heads of 8 features
    moved = {f"{block}.{p}_proj.{w}": state[f"{block}.{p}_proj.{w}"][swap] for p in "qkv" for w in ("weight", "bias")}
    moved[f"{block}.o_proj.weight"] = state[f"{block}.o_proj.weight"][:, swap]
    twin = copy.deepcopy(model)
    twin.load_state_dict(state | moved)
    assert change(model, twin, x) > 1e-6


def test_t5_traces_from_a_dict_of_its_two_inputs_with_every_head_order_pinned():
    """The model's outputs include the encoder's last hidden state: the stream is pinned; the MLP units move."""
    model, x = build("transformers:T5ForConditionalGeneration")
    spec = trace_spec(model, x)
    assert sorted(k for k, _ in spec.groups["P_0"]) == [
        "encoder.block.0.layer.1.DenseReluDense.wi.weight",
        "encoder.block.0.layer.1.DenseReluDense.wo.weight",
    ]
    assert len(spec.groups) == 4 and not spec.heads
    assert change(model, tool().permuted(model, spec, 1), x) <= 1e-12


def test_t5_logits_alone_permute_the_stream_and_weight_matching_finds_it(monkeypatch):
    monkeypatch.setattr(modeling_t5.T5LayerNorm, "forward", float64_t5_norm)
    t5, x = build("transformers:T5ForConditionalGeneration")
    model = T5Logits(t5).eval()
    spec = trace_spec(model, x)
    stream = spec.axes["t5.shared.weight"][1]
    assert stream is not None and spec.axes["t5.lm_head.weight"] == (None, stream)
    assert spec.axes["t5.decoder.block.0.layer.1.EncDecAttention.k.weight"] == (None, stream)
    assert spec.axes["t5.encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] == (None, None)
    assert not spec.heads  # the position bias, an embedding over the heads, fixes every head order
    for seed in (1, 2):
        assert change(model, tool().permuted(model, spec, seed), x) <= 1e-12
    assert matched_back(model, tool().permuted(model, spec, 3), spec, spec=spec)


def test_inputs_given_as_a_dict_must_be_arguments_of_forward():
    model, x = build("transformers:T5ForConditionalGeneration")
    with pytest.raises(TypeError, match=r"^example_inputs: T5ForConditionalGeneration.forward takes no input 'ids'"):
        trace_spec(model, {"ids": x["input_ids"]})


PACKED_PER_HEAD = {  # model -> the node refused: q, k, v packed head by head
    "transformers:GPTNeoXForCausalLM": r"node 'chunk': chunk.default in gpt_neox.layers.0.attention .*a split of each "
    r"head's features into q, k, v packed head by head",
    "transformers:BloomForCausalLM": r"node 'select': getitem in transformer.h.0.self_attention .*an index of q, k, "
    r"v packed head by head, \(heads, 3, d\)",
    "timm:levit_128s": r"node 'split': split in stages.0.blocks.0.attn .*a split of each head's features",
}


@pytest.mark.parametrize("name", sorted(PACKED_PER_HEAD))
def test_qkv_packed_head_by_head_is_refused_in_one_line_and_partial_keeps_the_function(name):
    model, x = build(name)
    with pytest.raises(TraceError, match=PACKED_PER_HEAD[name]) as err:
        trace_spec(model, x)
    assert "\n" not in str(err.value) and "no headed group" in str(err.value) and "partial=True" in str(err.value)
    model, x = build(name)  # afresh: LeViT caches its attention biases
    spec = trace_spec(model, x, partial=True)
    assert spec.groups and not spec.heads
    assert change(model, tool().permuted(model, spec, 1), x) <= 1e-12
    given = {"example_inputs": x, "partial": True} if "levit" not in name else {"spec": spec}  # traced once
    assert matched_back(model, tool().permuted(model, spec, 2), spec, **given)


def test_a_partial_trace_of_qkv_packed_head_by_head_leaves_only_the_attention_unpermuted():
    model, x = build("transformers:BloomForCausalLM")
    spec = trace_spec(model, x, partial=True)
    stream = spec.axes["transformer.word_embeddings.weight"][1]
    assert spec.axes["transformer.h.0.self_attention.query_key_value.weight"] == (None, stream) and stream
    assert spec.axes["transformer.h.0.self_attention.dense.weight"] == (stream, None)
    assert spec.axes["transformer.h.0.mlp.dense_h_to_4h.weight"][1] == stream
