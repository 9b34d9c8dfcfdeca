"""The tracer on Hugging Face transformers, through ``torch.export`` (lmclab.trace.export): GPT-2 (``Conv1D``
weights stored (in, out), q/k/v split from one projection, the embedding tied to the head), BERT (post-LN,
token-type embeddings, the MLM head tied to the embeddings), ViT, and a Llama with RMSNorm, rotary
embeddings, SwiGLU and grouped-query attention (4 query heads over 2 key/value heads). Each: random
permutations of every group keep the logits in float64, a permutation on one side of a group changes them,
weight matching brings a permuted copy back exactly; and the symmetry derived for rotary heads and
grouped queries is the one in the spec (heads move whole; a key/value head takes its query heads along)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import lmclab
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import TraceError, trace, trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
from transformers.models.gemma import modeling_gemma  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


def float64_rms_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm without its cast to float32 (kept on purpose by transformers): in float64 the residual
    of a permuted model is then the permutation's alone, not float32 rounding of a reordered mean."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 50}
CONFIGS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
        )
    ),
    "bert": lambda: transformers.BertForMaskedLM(
        transformers.BertConfig(**SMALL, hidden_size=32, max_position_embeddings=16)
    ),
    "vit": lambda: transformers.ViTForImageClassification(
        transformers.ViTConfig(**SMALL, hidden_size=32, image_size=16, patch_size=4, num_labels=5)
    ),
    "llama": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**SMALL, hidden_size=32, num_key_value_heads=2, max_position_embeddings=16)
    ),
    "gemma": lambda: transformers.GemmaForCausalLM(
        transformers.GemmaConfig(**SMALL, hidden_size=32, num_key_value_heads=2, head_dim=8, max_position_embeddings=16)
    ),
}


def float64_gemma_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """GemmaRMSNorm with its mean of squares in float64; its gain ``1 + w`` as transformers writes it (the cast of
    ``w`` to float32 rounds each entry alike, whatever their order)."""
    normed = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
    return (normed * (1.0 + self.weight.float())).type_as(hidden)


@pytest.fixture(autouse=True)
def rms_in_float64(monkeypatch):
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    monkeypatch.setattr(modeling_gemma.GemmaRMSNorm, "forward", float64_gemma_norm)


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model in float64 and eval mode, norms' affine terms random, and an input batch of 3."""
    torch.manual_seed(0)
    model = CONFIGS[name]().double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("bias"):  # transformers starts them at zero
                p.normal_(0, 0.1)
            elif "norm" in key.lower() or ".ln_" in key:
                p.uniform_(0.5, 1.5)
    gen = torch.Generator().manual_seed(1)
    x = (
        torch.randn(3, 3, 16, 16, generator=gen, dtype=torch.float64)
        if name == "vit"
        else torch.randint(0, 50, (3, 8), generator=gen)
    )
    return model, x


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits


def permuted(model, spec, seed: int, perm=None):
    state = model.state_dict()
    perm = perm or random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    return twin


def change(y: torch.Tensor, z: torch.Tensor) -> float:
    return float((y - z).abs().max() / y.abs().max())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_permutations_of_every_group_keep_the_logits(name):
    model, x = build(name)
    spec = trace_spec(model, x)
    spec.check(model.state_dict())
    y = logits(model, x)
    assert change(y[0], y[1]) > 1e-3 and len(spec.heads) >= 4
    for seed in (1, 2):
        assert change(y, logits(permuted(model, spec, seed), x)) <= 1e-10


@pytest.mark.parametrize("name", list(CONFIGS))
def test_nothing_is_left_unpermuted_but_the_logits_which_are_not_listed(name):
    """BERT's decoder is tied to the word table, which pins its logits before the output does: not listed."""
    model, x = build(name)
    assert trace_spec(model, x).pinned == ()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_permutation_that_misses_one_weight_of_a_group_changes_the_logits(name):
    model, x = build(name)
    spec, state, y = trace_spec(model, x), model.state_dict(), logits(model, x)
    sizes = spec.group_sizes(state)
    for group in sorted(g for g in sizes if sizes[g] > 1):
        perm = random_permutation(sizes, torch.Generator().manual_seed(0), spec.heads)
        perm = {g: p if g == group else torch.arange(sizes[g]) for g, p in perm.items()}
        if torch.equal(perm[group], torch.arange(sizes[group])):
            continue
        one_side = dict(apply_permutation(spec, perm, state))
        entries = spec.groups[group]  # one weight left as it was; a group on one weight: its tie broken
        if len(entries) > 1:
            shared = [v.data_ptr() for v in state.values()]  # not a table tied to the head: one tensor, loaded twice
            first = next(k for k, _ in entries if not k.endswith("bias") and shared.count(state[k].data_ptr()) == 1)
            one_side[first] = state[first]
        twin = copy.deepcopy(model)
        twin.load_state_dict(one_side)
        assert change(y, logits(twin, x)) > 1e-6, group


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weight_matching_brings_a_permuted_copy_back_exactly(name):
    model, x = build(name)
    spec = trace_spec(model, x)
    found = lmclab.find_permutation(model, permuted(model, spec, seed=3), method="wm", example_inputs=x)
    back = found.apply(permuted(model, spec, seed=3))
    assert all(torch.equal(back[k], v) for k, v in spec.matched(model.state_dict()).items())


def test_gpt2_reads_conv1d_weights_as_in_out_and_ties_the_head_to_the_embedding():
    model, x = build("gpt2")
    spec = trace_spec(model, x)
    stream = spec.axes["transformer.wte.weight"][1]
    assert spec.axes["lm_head.weight"] == spec.axes["transformer.wte.weight"] == (None, stream)
    assert spec.axes["transformer.h.0.mlp.c_fc.weight"] == (stream, spec.axes["transformer.h.0.mlp.c_fc.bias"][0])
    qkv = spec.axes["transformer.h.0.attn.c_attn.weight"][1]  # (in, 3E): q and k one group, v another
    assert [s.length for s in qkv] == [32, 32, 32] and qkv[0].group == qkv[1].group != qkv[2].group


def test_bert_ties_the_mlm_decoder_to_the_word_embeddings():
    model, x = build("bert")
    spec = trace_spec(model, x)
    stream = spec.axes["bert.embeddings.word_embeddings.weight"][1]
    assert spec.axes["cls.predictions.decoder.weight"] == (None, stream)
    assert spec.axes["bert.embeddings.token_type_embeddings.weight"] == (None, stream)


def test_llama_rotary_heads_move_whole_and_key_value_heads_take_their_query_heads_along():
    """d = 8 features per head, 4 query heads over 2 key/value heads: q/k/v rows and o_proj's columns are
    permuted in whole heads (q's and o's in blocks of two query heads), one σ on the 2 key/value heads."""
    model, x = build("llama")
    spec = trace_spec(model, x)
    (q,), (k,), (v,) = (spec.axes[f"model.layers.0.self_attn.{p}_proj.weight"][0] for p in "qkv")
    (o,) = spec.axes["model.layers.0.self_attn.o_proj.weight"][1]
    assert (q.length, q.block, k.length, k.block, v.block, o.block) == (32, 16, 16, 8, 8, 16) and o.group == v.group
    assert {spec.heads[g.group] for g in (q, k, v)} == {spec.heads[q.group]} and spec.heads[q.group].count == 2
    gate, up = spec.axes["model.layers.0.mlp.gate_proj.weight"], spec.axes["model.layers.0.mlp.up_proj.weight"]
    assert gate == up and gate[1] == spec.axes["model.layers.0.input_layernorm.weight"][0]  # SwiGLU, RMSNorm


def test_moving_features_inside_a_rotary_head_changes_the_logits():
    """The derivation's converse: two rotary pairs of every query and key head swapped alike (a τ that keeps
    each pair whole and applies one map to both halves) turns them by other angles; any τ ≠ id changes q·k."""
    model, x = build("llama")
    y, state = logits(model, x), model.state_dict()
    tau = torch.tensor([1, 0, 2, 3, 5, 4, 6, 7])  # pairs (0, 4) and (1, 5) exchanged
    twin = copy.deepcopy(model)
    swapped = {}
    for key in ("q_proj", "k_proj"):
        w = state[f"model.layers.0.self_attn.{key}.weight"]
        rows = torch.cat([h * 8 + tau for h in range(w.shape[0] // 8)])
        swapped[f"model.layers.0.self_attn.{key}.weight"] = w[rows]
    twin.load_state_dict(state | swapped)
    assert change(y, logits(twin, x)) > 1e-6


@pytest.mark.parametrize(
    ("name", "bias", "point"),
    [
        ("gpt2", "transformer.h.0.mlp.c_fc.bias", "transformer.h.0.mlp.c_fc@-1"),
        ("llama", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj@-1:16"),  # 2 heads/run
    ],
)
def test_activation_matching_reads_hooks_on_the_modules_of_an_exported_graph(name, bias, point):
    """GPT-2's units one by one; Llama's rotary heads whole, in runs of their features (a key/value head's
    query heads: a run of 2 × 8), matched on the features in place."""
    model, x = build(name)
    traced = trace(model, x)
    axis = traced.spec.axes[bias][0]
    assert traced.points[axis if isinstance(axis, str) else axis[0].group] == [point]
    spec = traced.spec
    twin = permuted(model, spec, seed=2)
    found = lmclab.find_permutation(model, twin, method="am", data=[(x, x)])
    back = found.apply(twin)
    assert all(torch.equal(back[k], v) for k, v in spec.matched(model.state_dict()).items())


def test_gemma_keeps_its_stream_through_the_gain_one_plus_w_and_the_gain_alone_changes_the_logits():
    """GemmaRMSNorm scales by ``1 + w``: a parameter plus a constant is permuted as the parameter, so the stream
    (pinned, whole, before) is one group; permuting only the norms' gains gives another function."""
    model, x = build("gemma")
    spec, state, y = trace_spec(model, x), model.state_dict(), logits(model, x)
    stream = spec.axes["model.embed_tokens.weight"][1]
    assert spec.pinned == () and all(any(e is not None for e in axes) for axes in spec.axes.values())
    assert stream == spec.axes["model.layers.1.post_attention_layernorm.weight"][0] == spec.axes["model.norm.weight"][0]
    twin = copy.deepcopy(model)
    twin.load_state_dict(state | {k: v.flip(0) for k, v in state.items() if k.endswith("norm.weight")})
    assert change(y, logits(twin, x)) > 1e-3


T5 = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 1, "num_heads": 4}


@pytest.mark.parametrize("form", ["tuple", "mapping"])
def test_an_encoder_decoder_reaches_the_tracer_on_a_tuple_or_a_mapping_of_its_inputs(form):
    """T5's decoder needs its own ids: given them (positionally after the mask, or by name), find_permutation
    runs the tracer on the model, which traces it or refuses a node of its graph (not the inputs)."""
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5)).eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    mask, decoder_ids = torch.ones_like(ids), ids.roll(1, 1)
    inputs = (ids, mask, decoder_ids) if form == "tuple" else {"input_ids": ids, "decoder_input_ids": decoder_ids}
    try:
        lmclab.find_permutation(model, model, method="wm", example_inputs=inputs)
    except TraceError as exc:
        assert str(exc).startswith("trace_spec: node ") and "input_ids" not in str(exc)


def test_an_encoder_decoders_inputs_are_built_from_its_decoder_start_token_or_refused():
    from lmclab.api.hf import example_inputs

    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5, decoder_start_token_id=3))
    inputs = example_inputs(model, (5,))
    assert set(inputs) == {"input_ids", "decoder_input_ids"} and inputs["decoder_input_ids"].shape == (2, 5)
    assert inputs["decoder_input_ids"][:, 0].tolist() == [3, 3]
    assert torch.equal(inputs["decoder_input_ids"][:, 1:], inputs["input_ids"][:, :-1])  # shifted right
    bare = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5))
    bare.generation_config.decoder_start_token_id = 4  # where transformers 5 keeps it
    assert getattr(bare.config, "decoder_start_token_id", None) is None
    assert example_inputs(bare, None)["decoder_input_ids"][:, 0].tolist() == [4, 4]
    bare.generation_config.decoder_start_token_id = None
    expected = (
        "T5ForConditionalGeneration: an encoder–decoder reads decoder_input_ids besides input_ids, and its config "
        "sets no decoder_start_token_id to build them from (set it in config.json)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        example_inputs(bare, None)


def test_the_example_token_ids_are_the_same_each_time_span_the_vocabulary_and_leave_the_global_seed_alone():
    from lmclab.api.hf import example_inputs

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=2))
    state = torch.random.get_rng_state()
    ids = example_inputs(model, None)
    assert torch.equal(torch.random.get_rng_state(), state) and torch.equal(example_inputs(model, None), ids)
    assert ids.shape == (2, 8) and set(ids.flatten().tolist()) == {0, 1}  # token 0 drawn too
    assert torch.equal(ids, torch.randint(0, 2, (2, 8), generator=torch.Generator().manual_seed(0)))  # seed 0
