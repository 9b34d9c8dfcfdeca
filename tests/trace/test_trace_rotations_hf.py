"""The tracer's proof of kinds on Hugging Face models (lmclab.trace.rotations): Llama's residual stream (RMSNorm,
rotary positions, SwiGLU, grouped-query attention 4/2, untied head) and Gemma's (its gains read as ``1 + w``) are
orthogonal once their gains are folded, and random orthogonal maps of it with permutations of every other group
keep the logits in float64 (≤ 1e-10 relative), while the same maps with the gains in place change them; without
grouped queries, Llama's queries and keys turn per rotary plane (lmclab.trace.planes: its cos and sin proved
constant on each plane from the graph torch.export records), and a rotated copy is aligned back; GPT-2's
stream (LayerNorm, its ``Conv1D`` readers an ``addmm`` of an (in, out) weight) is centred once its gains are
folded into the readers' rows; a tied head keeps every group a permutation group, and the canonical copy of a
tied model unties it."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from lmclab.core.canonical import fold_gains
from lmclab.core.heads import plane_rotations
from lmclab.core.spec import Segment, apply_permutation, random_permutation
from lmclab.trace import trace_spec
from lmclab.trace.planes import PLANE

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
from transformers.models.gemma import modeling_gemma  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 50}
ROPE = {"hidden_size": 32, "num_key_value_heads": 2, "max_position_embeddings": 16}
X = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))


def float64_rms_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm without its cast to float32: in float64 the residual is the map's alone."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _llama(tie: bool = False, kv_heads: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SMALL, **(ROPE | {"num_key_value_heads": kv_heads}), tie_word_embeddings=tie)
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                p.uniform_(0.5, 1.5)
    return model


def float64_gemma_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """GemmaRMSNorm without its cast to float32, its gain still read as ``1 + w``."""
    return self._norm(hidden) * (1.0 + self.weight)


def _gemma(tie: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.GemmaForCausalLM(
        transformers.GemmaConfig(**SMALL, **ROPE, head_dim=8, tie_word_embeddings=tie)
    )
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                p.uniform_(-0.5, 0.5)  # the gain read is 1 + w
    return model.double().eval()


def _change(model: torch.nn.Module, state: dict, reference: torch.Tensor) -> float:
    twin = copy.deepcopy(model)
    twin.load_state_dict(state)
    with torch.no_grad():
        return float((twin(X).logits - reference).abs().max() / reference.abs().max())


def test_llama_s_stream_is_orthogonal_once_its_gains_are_folded(monkeypatch) -> None:
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    model = _llama()
    spec, state = trace_spec(model, X, symmetry="orthogonal"), model.state_dict()
    stream = spec.axes["model.embed_tokens.weight"][1]
    assert spec.kinds[stream] == "orthogonal" and len(spec.gains) == 5
    assert spec.gains["model.norm.weight"] == ("lm_head.weight",)
    with torch.no_grad():
        reference = model(X).logits
    folded = fold_gains(spec, state)
    assert _change(model, folded, reference) <= 1e-12
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
        assert _change(model, apply_permutation(spec, perm, state), reference) > 1e-3  # the gains in place


def _kept_by_random_elements(model: torch.nn.Module, spec, state: dict) -> tuple[dict, torch.Tensor]:
    """``state`` with its gains folded and ``model``'s logits, after two random elements of every group of ``spec``
    are checked to keep them on the folded state (float64, ≤ 1e-10 relative)."""
    with torch.no_grad():
        reference = model(X).logits
    folded = fold_gains(spec, state)
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
    return folded, reference


def _planes(state: dict, names: tuple[str, ...], seed: int) -> dict:
    """``state`` with the rows of ``names`` (layer 0's projections, 4 heads of 8) turned by one random rotation of
    each plane (j, j + 4) per head, the same for every name."""
    angles = torch.rand(4, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 6.28
    block = torch.block_diag(*plane_rotations(angles))
    return {k: block @ v if k.rsplit(".", 1)[0] in names else v for k, v in state.items()}


def test_llama_s_queries_and_keys_turn_per_rotary_plane_without_grouped_queries(monkeypatch) -> None:
    """Without grouped queries each layer's queries and keys are one rotary group (its cos and sin computed in the
    graph from ``cat((freqs, freqs))``), its values orthogonal: random elements keep the logits in float64, while a
    map mixing a head's planes, or the planes of the queries turned without the keys', change them."""
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    model = _llama(kv_heads=4)
    spec, state = trace_spec(model, X, symmetry="orthogonal"), model.state_dict()
    qk, vo = (spec.axes[f"model.layers.0.self_attn.{p}_proj.weight"][0] for p in ("q", "v"))
    assert spec.axes["model.layers.0.self_attn.k_proj.weight"][0] == qk and spec.heads[qk].count == 4
    assert sorted(spec.kinds.values()) == ["orthogonal"] * 3 + ["rotary"] * 2 and spec.kinds[vo] == "orthogonal"
    assert spec.kinds[qk] == "rotary" and re.fullmatch(f"node 'mul_[0-9]+': {re.escape(PLANE)}", spec.kind_reasons[qk])
    folded, reference = _kept_by_random_elements(model, spec, state)
    general = random_permutation(
        spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads, {**spec.kinds, qk: "orthogonal"}
    )
    assert _change(model, apply_permutation(spec, general, folded), reference) > 1e-3  # planes mixed
    attention = "model.layers.0.self_attn"
    assert _change(model, _planes(state, (f"{attention}.q_proj", f"{attention}.k_proj"), 3), reference) <= 1e-10
    assert _change(model, _planes(state, (f"{attention}.q_proj",), 3), reference) > 1e-3  # the queries alone


def test_grouped_queries_turn_with_their_key_head_per_rotary_plane_and_read_its_values_in_copies(monkeypatch) -> None:
    """Grouped queries (4 query heads over 2 key/value heads): one rotation per plane of key head g turns the planes
    of its 2 query heads alike, and one orthogonal map of value head g acts on W_O's columns of both query heads
    (Segments in 2 copies of one head); random elements keep the logits in float64, while the same planes turned in
    one query head of a group and not the other, or the values' map on one copy of W_O's columns alone, change them."""
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    model = _llama(kv_heads=2)
    spec, state = trace_spec(model, X, symmetry="orthogonal"), model.state_dict()
    attention = "model.layers.0.self_attn"
    qk, vo = (spec.axes[f"{attention}.{p}_proj.weight"][0] for p in ("k", "v"))
    assert spec.axes[f"{attention}.q_proj.weight"][0] == (Segment(qk, 32, 1, 2, 8),)
    assert spec.axes[f"{attention}.o_proj.weight"][1] == (Segment(vo, 32, 1, 2, 8),)
    assert spec.heads[qk].count == spec.heads[vo].count == 2 and (spec.kinds[qk], spec.kinds[vo]) == (
        "rotary",
        "orthogonal",
    )
    _, reference = _kept_by_random_elements(model, spec, state)
    angles = torch.rand(2, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 6.28
    turn = plane_rotations(angles)  # per key head
    q, k = state[f"{attention}.q_proj.weight"].clone(), state[f"{attention}.k_proj.weight"]
    both = {f"{attention}.k_proj.weight": torch.block_diag(*turn) @ k}
    alike = torch.block_diag(turn[0], turn[0], turn[1], turn[1]) @ q
    assert _change(model, {**state, **both, f"{attention}.q_proj.weight": alike}, reference) <= 1e-10
    q[8:16] = turn[0] @ q[8:16]  # the second query head of key head 0 alone
    assert _change(model, {**state, **both, f"{attention}.q_proj.weight": q}, reference) > 1e-3
    values = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64))[0]
    v, o = state[f"{attention}.v_proj.weight"].clone(), state[f"{attention}.o_proj.weight"].clone()
    v[:8] = values @ v[:8]
    o[:, :8] = o[:, :8] @ values.T  # the first query head's copy of value head 0; the second's left
    assert _change(model, {**state, f"{attention}.v_proj.weight": v, f"{attention}.o_proj.weight": o}, reference) > 1e-3
    o[:, 8:16] = o[:, 8:16] @ values.T
    assert (
        _change(model, {**state, f"{attention}.v_proj.weight": v, f"{attention}.o_proj.weight": o}, reference) <= 1e-10
    )


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_rotated_llama_is_aligned_back_by_orthogonal_weight_matching(monkeypatch, kv_heads: int) -> None:
    """Llama (with and without grouped queries) in canonical form, its stream rotated, its MLP units permuted, its
    heads reordered and turned inside (queries and keys per rotary plane, values freely): aligned back exactly."""
    import lmclab

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    canonical = lmclab.canonicalize(_llama(kv_heads=kv_heads), X)
    spec, state = trace_spec(canonical, X, symmetry="orthogonal"), canonical.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
    rotated = copy.deepcopy(canonical)
    rotated.load_state_dict(apply_permutation(spec, perm, state))
    res = lmclab.align(canonical, rotated, symmetry="orthogonal", example_inputs=X)
    assert {res.spec.kinds[g] for g in res.spec.heads} == {"orthogonal", "rotary"}
    back = res.apply(rotated)
    assert max(float((back[k] - v).abs().max()) for k, v in state.items()) <= 1e-9
    assert lmclab.l2_reduction(canonical, rotated, res) == pytest.approx(100.0, abs=1e-6)


def _gpt2(tie: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    shape = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50, "n_positions": 16}
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, tie_word_embeddings=tie))
    with torch.no_grad():
        for key, p in model.named_parameters():
            if ".ln_" in key:
                p.uniform_(0.5, 1.5) if key.endswith("weight") else p.normal_(0, 0.3)
    return model.double().eval()


def test_gpt2_s_stream_is_centred_once_its_gains_are_folded_into_its_conv1d_readers_rows() -> None:
    import lmclab

    model = _gpt2()
    spec, state = trace_spec(model, X, symmetry="orthogonal"), model.state_dict()
    ((stream, kind),) = ((g, k) for g, k in spec.kinds.items() if g not in spec.heads)
    assert kind == "centred" and spec.axes["transformer.wte.weight"] == (None, stream)
    # q/k and v/o of each layer, split out of the packed c_attn: orthogonal inside each head
    assert len(spec.kinds) == 5 and {spec.kinds[g] for g in spec.heads} == {"orthogonal"}
    assert spec.gains["transformer.h.1.ln_2.weight"] == ("transformer.h.1.mlp.c_fc.weight",)
    assert len(spec.gains) == len(spec.gain_biases) == 5 and spec.gains["transformer.ln_f.weight"] == (
        "lm_head.weight",
    )
    with torch.no_grad():
        reference = model(X).logits
    folded = fold_gains(spec, state)
    assert _change(model, folded, reference) <= 1e-12
    general = {**spec.kinds, stream: "orthogonal"}  # not fixing the all-ones vector: LayerNorm's centring does
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
        assert _change(model, apply_permutation(spec, perm, state), reference) > 1e-3  # the gains in place
        other = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads, general)
        assert _change(model, apply_permutation(spec, other, folded), reference) > 1e-3
    tied = _gpt2(tie=True)
    canonical = lmclab.canonicalize(tied, X)
    assert canonical.lm_head.weight is not canonical.transformer.wte.weight
    assert trace_spec(canonical, X, symmetry="orthogonal").kinds[stream] == "centred"
    with torch.no_grad():
        reference = tied(X).logits
        assert float((canonical(X).logits - reference).abs().max() / reference.abs().max()) <= 1e-12
    rotated = copy.deepcopy(model)  # centred stream, heads rotated inside and reordered: weight matching undoes it
    rotated.load_state_dict(apply_permutation(spec, perm, folded))
    res = lmclab.align(model, rotated, symmetry="orthogonal", example_inputs=X)
    assert lmclab.l2_reduction(model, rotated, res) == pytest.approx(100.0, abs=1e-6)


@pytest.mark.parametrize("name", ["tied gpt2", "tied llama", "tied gemma"])
def test_a_tied_head_keeps_the_stream_a_permutation_group(name: str) -> None:
    if name == "tied gpt2":
        model = _gpt2(tie=True)
    elif name == "tied gemma":
        model = _gemma(tie=True)
    else:
        model = _llama(tie=True)
    spec = trace_spec(model.eval(), X, symmetry="orthogonal")
    assert set(spec.kinds) <= set(spec.heads) and spec.gains == {}  # at most inside heads (GPT-2's; Llama's move whole)


def test_a_tied_llama_s_canonical_copy_is_untied_saved_untied_and_orthogonal(monkeypatch, tmp_path) -> None:
    import lmclab

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", float64_rms_norm)
    model = _llama(tie=True)
    canonical = lmclab.canonicalize(model, X)
    assert canonical.config.tie_word_embeddings is False and model.config.tie_word_embeddings is True
    assert canonical.lm_head.weight is not canonical.model.embed_tokens.weight
    assert set(trace_spec(canonical, X, symmetry="orthogonal").kinds.values()) == {"orthogonal", "rotary"}
    canonical.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    with torch.no_grad():
        reference = model(X).logits
        assert float((loaded(X).logits - reference).abs().max() / reference.abs().max()) <= 1e-12


def test_gemma_s_stream_is_orthogonal_once_its_1_plus_w_gains_are_folded(monkeypatch) -> None:
    import lmclab

    assert set(trace_spec(_gemma().float(), X, symmetry="orthogonal").kinds.values()) == {"orthogonal", "rotary"}
    monkeypatch.setattr(modeling_gemma.GemmaRMSNorm, "forward", float64_gemma_norm)
    model = _gemma()
    spec, state = trace_spec(model, X, symmetry="orthogonal"), model.state_dict()
    assert (
        len(spec.gains) == 5 and set(spec.gain_offsets.values()) == {1.0} and set(spec.gain_offsets) == set(spec.gains)
    )
    with torch.no_grad():
        reference = model(X).logits
    folded = fold_gains(spec, state)
    assert all(bool((folded[g] == 0).all()) for g in spec.gains)  # 1 + w = 1
    assert _change(model, folded, reference) <= 1e-12
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads, spec.kinds)
    assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
    assert _change(model, apply_permutation(spec, perm, state), reference) > 1e-3  # the gains in place
    tied = _gemma(tie=True)
    canonical = lmclab.canonicalize(tied, X)
    assert set(trace_spec(canonical, X, symmetry="orthogonal").kinds.values()) == {"orthogonal", "rotary"}
    with torch.no_grad():
        reference = tied(X).logits
        assert float((canonical(X).logits - reference).abs().max() / reference.abs().max()) <= 1e-12


def _vit(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "timm vit_tiny":
        timm = pytest.importorskip("timm")
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    else:
        shape = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
        config = transformers.ViTConfig(**shape, image_size=32, patch_size=8, num_labels=10)
        model = transformers.ViTForImageClassification(config)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                p.uniform_(0.5, 1.5) if key.endswith("weight") else p.normal_(0, 0.3)
    return model.double().eval()


@pytest.mark.parametrize("name", ["timm vit_tiny", "hf vit"])
def test_a_vit_s_stream_is_centred_once_its_gains_are_folded(name: str) -> None:
    """The class token's path to the head (timm: an index, ``fc_norm`` and ``head_drop``, identities) reads the
    final norm linearly: its gain folds into the head, and the stream takes centred maps but no others; the heads
    (timm's packed ``qkv`` and fused attention, Hugging Face's separate projections) take orthogonal maps inside."""
    model, images = (
        _vit(name),
        torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3)),
    )
    spec, state = trace_spec(model, images, symmetry="orthogonal"), model.state_dict()
    ((stream, kind),) = ((g, k) for g, k in spec.kinds.items() if g not in spec.heads)
    assert {spec.kinds.get(g) for g in spec.heads} == {"orthogonal"}  # q/k and v/o: orthogonal inside each head
    head = "head.weight" if name.startswith("timm") else "classifier.weight"
    assert kind == "centred" and spec.gains["norm.weight" if name.startswith("timm") else "vit.layernorm.weight"] == (
        head,
    )

    def change(state: dict) -> float:
        twin = copy.deepcopy(model)
        twin.load_state_dict(state)
        with torch.no_grad():
            out, reference = twin(images), model(images)
            out, reference = getattr(out, "logits", out), getattr(reference, "logits", reference)
            return float((out - reference).abs().max() / reference.abs().max())

    folded = fold_gains(spec, state)
    assert change(folded) <= 1e-12
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads, spec.kinds)
    assert change(apply_permutation(spec, perm, folded)) <= 1e-10
    assert change(apply_permutation(spec, perm, state)) > 1e-3  # the gains in place
    general = random_permutation(
        spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads, {**spec.kinds, stream: "orthogonal"}
    )
    assert change(apply_permutation(spec, general, folded)) > 1e-3  # LayerNorm's centring tells it apart


@pytest.mark.parametrize("name", ["timm vit_tiny", "hf vit"])
def test_a_rotated_vit_is_aligned_back_by_orthogonal_weight_matching(name: str) -> None:
    import lmclab

    model, images = (
        _vit(name),
        torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3)),
    )
    canonical = lmclab.canonicalize(model, images)
    spec, state = trace_spec(canonical, images, symmetry="orthogonal"), canonical.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
    rotated = copy.deepcopy(canonical)
    rotated.load_state_dict(apply_permutation(spec, perm, state))
    res = lmclab.align(model, rotated, symmetry="orthogonal", example_inputs=images)
    assert lmclab.l2_reduction(model, rotated, res) == pytest.approx(100.0, abs=1e-6)
