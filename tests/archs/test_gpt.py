"""The decoder-only transformer ``gpt`` (lmclab.archs.gpt): its hand-written spec equals the traced one for
every combination of norm, positions, MLP, attention and tied head; random permutations of every group keep
the logits in float64; permutations that break a symmetry the spec does not claim change them; and a
permuted copy with grouped-query attention and rotary positions is brought back exactly through
``lmclab.find_permutation``, by weight matching and by activation matching (whole heads matched on their
features in place)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from conftest import headed, partition

import lmclab
from lmclab.archs import gpt, mlp
from lmclab.archs.canonical import symmetric_forms, untied_config
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.options import OptionError
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace

VOCAB, CONTEXT = 37, 12
SHAPES = {"width": 24, "depth": 2, "heads": 4, "mlp_ratio": 2}
VARIANTS = [  # every option of the family once against each other (norm, position, mlp, kv_heads, tie)
    dict(zip(("norm", "position", "mlp", "kv_heads", "tie_embeddings"), values, strict=True))
    for values in itertools.product(gpt.NORMS, gpt.POSITIONS, gpt.MLPS, (None, 2), (True, False))
    if values[0] == "layernorm" or values[4]  # rmsnorm only with a tied head: 24 cases
] + [  # heads of other sizes than width/heads (head_dim; 5 heads of 4 over a width of 24)
    {"norm": "layernorm", "position": "learned", "mlp": "gelu", "kv_heads": None, "tie_embeddings": True, "heads": 5,
     "head_dim": 4},
    {"norm": "rmsnorm", "position": "rotary", "mlp": "swiglu", "kv_heads": 2, "tie_embeddings": False, "head_dim": 10},
]  # fmt: skip
IDS = ["-".join(str(v) for v in c.values()) for c in VARIANTS]


def config(**options) -> gpt.Config:
    return gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, **(SHAPES | options))


def built(cfg: gpt.Config, seed: int = 0) -> torch.nn.Module:
    """The model in float64 and eval mode, every parameter random (norms near 1, biases nonzero)."""
    torch.manual_seed(seed)
    model = gpt.Model(cfg).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key and key.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.3)
    return model


def tokens(seed: int = 1, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, CONTEXT), generator=torch.Generator().manual_seed(seed))


def with_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    twin.load_state_dict(state)
    return twin


def change(model_a: torch.nn.Module, model_b: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        y, z = model_a(x), model_b(x)
    return float((y - z).abs().max() / y.abs().max())


@pytest.mark.parametrize("options", VARIANTS, ids=IDS)
def test_the_hand_written_spec_and_points_are_the_traced_ones(options) -> None:
    cfg = config(**options)
    model = built(cfg)
    traced, hand = trace(model, tokens()), gpt.permutation_spec(cfg)
    assert set(hand.axes) == set(model.state_dict()) == set(traced.spec.axes)
    assert partition(traced.spec) == partition(hand) and headed(traced.spec) == headed(hand)
    for name, axes in hand.axes.items():  # the same blocks: whole heads where the tracer found them
        assert [_blocks(e) for e in axes] == [_blocks(e) for e in traced.spec.axes[name]], name
    hand_points = gpt.activation_points(cfg)
    named = {frozenset(places): g for g, places in hand.groups.items()}
    rename = {g: named[frozenset(places)] for g, places in traced.spec.groups.items()}
    assert {rename[g]: sorted(p) for g, p in traced.points.items()} == {g: sorted(p) for g, p in hand_points.items()}


def _blocks(entry) -> list:
    """An axis entry's segments as (length, block), without the group's name."""
    return [] if entry is None or isinstance(entry, str) else [(s.length, s.block) for s in entry]


@pytest.mark.parametrize("options", VARIANTS, ids=IDS)
def test_random_permutations_of_every_group_keep_the_logits_in_float64(options) -> None:
    cfg = config(**options)
    model, x = built(cfg), tokens()
    spec, state = gpt.permutation_spec(cfg), model.state_dict()
    spec.check(state)
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
        assert any(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
        assert change(model, with_state(model, apply_permutation(spec, perm, state)), x) < 1e-12
    assert change(model, model, tokens(seed=2)) == 0 and change(model, built(cfg, seed=1), x) > 0.1


def _partly(spec, state, perm, leave: str) -> dict:
    """``perm`` applied to every tensor but ``leave``."""
    return apply_permutation(spec, perm, state) | {leave: state[leave]}


@pytest.mark.parametrize(
    ("options", "leave"),
    [
        ({}, "blocks.0.attn.k.weight"),  # queries moved without their keys
        ({}, "blocks.1.attn.out.weight"),  # values without the output projection
        ({"mlp": "swiglu"}, "blocks.0.gate.weight"),  # SwiGLU's gate left behind
        ({"tie_embeddings": False}, "head.weight"),  # the head's input left in the old stream order
        ({"norm": "rmsnorm"}, "blocks.1.norm2.weight"),  # an RMSNorm's scale
        ({"kv_heads": 2, "position": "rotary"}, "blocks.0.attn.q.weight"),  # the query heads of a key head
    ],
)
def test_a_permutation_that_misses_one_tensor_of_a_group_changes_the_logits(options, leave) -> None:
    cfg = config(**options)
    model, x = built(cfg), tokens()
    spec, state = gpt.permutation_spec(cfg), model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(3), spec.heads)
    assert change(model, with_state(model, _partly(spec, state, perm, leave)), x) > 1e-3


def test_features_moved_inside_a_rotary_head_or_query_heads_moved_across_key_heads_change_the_logits() -> None:
    """What the spec leaves out is no symmetry: the same feature permutation τ ≠ id in every query and key
    head (a symmetry with learned positions) changes a rotary model; query heads swapped across their key
    heads' groups (a symmetry of plain multi-head attention) change a grouped-query one."""
    d = SHAPES["width"] // SHAPES["heads"]
    tau = torch.tensor([1, 0, 2, 4, 3, 5])  # pairs (0, 3) and (1, 4) keep their halves together
    for position, expected in (("learned", 0.0), ("rotary", 1e-3)):
        model = built(config(position=position))
        state = model.state_dict()
        moved = {}
        for key in ("blocks.0.attn.q", "blocks.0.attn.k"):
            rows = torch.cat([h * d + tau for h in range(SHAPES["heads"])])
            moved |= {f"{key}.weight": state[f"{key}.weight"][rows], f"{key}.bias": state[f"{key}.bias"][rows]}
        changed = change(model, with_state(model, state | moved), tokens())
        assert changed > expected if expected else changed < 1e-12
    model = built(config(kv_heads=2))
    state = model.state_dict()
    heads = torch.tensor([0, 2, 1, 3])  # query heads 1 and 2 read key/value heads 0 and 1: swapped
    rows = torch.cat([h * d + torch.arange(d) for h in heads])
    moved = {"blocks.0.attn.q.weight": state["blocks.0.attn.q.weight"][rows]}
    moved |= {"blocks.0.attn.q.bias": state["blocks.0.attn.q.bias"][rows]}
    moved |= {"blocks.0.attn.out.weight": state["blocks.0.attn.out.weight"][:, rows]}
    assert change(model, with_state(model, state | moved), tokens()) > 1e-3


def test_wm_and_am_bring_back_a_permuted_copy_with_grouped_queries_and_rotary_positions() -> None:
    cfg = config(norm="rmsnorm", position="rotary", mlp="swiglu", kv_heads=2, tie_embeddings=False)
    model_a, x = built(cfg), tokens()
    spec, state = gpt.permutation_spec(cfg), model_a.state_dict()
    planted = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(5), spec.heads)
    model_b = with_state(model_a, apply_permutation(spec, planted, state))
    assert change(model_a, model_b, x) < 1e-12  # the same function, other weights
    assert any(not torch.equal(model_b.state_dict()[k], v) for k, v in state.items())
    assert any(not torch.equal(planted[f"P_k_{k}"], torch.arange(2)) for k in range(SHAPES["depth"]))  # σ moved
    hand = {"spec": spec, "points": gpt.activation_points(cfg)}
    for method, given in itertools.product(("wm", "am"), ({"example_inputs": x}, hand)):  # traced, hand-written
        data = {"data": [(x, x)], "model": model_a} if method == "am" else {}  # AM: whole heads in runs
        found = lmclab.find_permutation(model_a, model_b, method=method, device="cpu", **given, **data)
        back = found.apply(model_b)
        assert all(torch.equal(back[k], v) for k, v in state.items()), (method, list(given))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heads": 5}, r"^heads: 5 heads do not divide the width 24$"),
        ({"kv_heads": 3}, r"^kv_heads: 3 key/value heads do not divide the 4 heads$"),
        ({"width": 20, "position": "rotary"}, r"^position: rotary heads need an even size, got 5 features$"),
        ({"head_dim": 5, "position": "rotary"}, r"^position: rotary heads need an even size, got 5 features$"),
    ],
)
def test_shapes_that_do_not_fit_are_refused_in_one_line(options, message) -> None:
    with pytest.raises(OptionError, match=message):
        config(**options)


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_the_output_at_a_position_reads_the_tokens_up_to_it_and_none_after(position) -> None:
    """Causal attention (GPT-2's mask): changing token s changes the logits at every t ≥ s and none at t < s."""
    model = built(config(position=position))
    ids = tokens(seed=0, batch=1)
    s = CONTEXT // 2
    changed = ids.clone()
    changed[0, s] = (ids[0, s] + 1) % VOCAB
    with torch.no_grad():
        moved = (model(changed) - model(ids)).abs().amax(dim=-1)[0]  # (tokens,)
    assert torch.all(moved[:s] == 0), moved
    assert torch.all(moved[s:] > 1e-6), moved


def test_rotary_attention_turns_features_j_and_j_plus_half_of_queries_and_keys_by_theta_j_t() -> None:
    """Su et al.'s rotation written as complex numbers: feature pair (j, j + d/2) of a head at position t is
    ``x_j + i·x_{j+d/2}`` times ``exp(i·θ_j·t)``, ``θ_j = 10000^(−2j/d)``, in queries and keys alike."""
    attn, (b, t, heads, d) = built(config(position="rotary")).blocks[0].attn, (2, CONTEXT, 4, 6)
    x = torch.randn(b, t, SHAPES["width"], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones_like(angles), angles)  # (t, d/2)

    def heads_of(layer: torch.nn.Linear, rotary: bool) -> torch.Tensor:  # (b, heads, t, d)
        z = layer(x).reshape(b, t, heads, d)
        if rotary:
            z = torch.view_as_complex(torch.stack([z[..., : d // 2], z[..., d // 2 :]], -1)) * turn[:, None]
            z = torch.cat([z.real, z.imag], dim=-1)
        return z.transpose(1, 2)

    q, k, v = heads_of(attn.q, True), heads_of(attn.k, True), heads_of(attn.v, False)
    logits = (q @ k.transpose(-2, -1) / d**0.5).masked_fill(torch.ones(t, t).triu(1).bool(), -torch.inf)
    expected = attn.out((logits.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)  # the tables are float32's


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_the_causal_mask_and_rotary_tables_are_buffers_never_saved(position) -> None:
    """Each block's attention holds its mask, then (rotary) the cos and sin tables, as buffers computed at
    construction: none is in the state dict, so a checkpoint holds the parameters alone."""
    model = gpt.Model(config(position=position))
    tables = ("mask", "cos", "sin") if position == "rotary" else ("mask",)
    assert [n for n, _ in model.named_buffers()] == [f"blocks.{k}.attn.{t}" for k in range(2) for t in tables]
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters(remove_duplicate=False)}
    if position == "rotary":
        cos, sin = gpt.rotary_tables(CONTEXT, 6)
        assert torch.equal(model.blocks[1].attn.cos, cos) and torch.equal(model.blocks[1].attn.sin, sin)


@pytest.mark.parametrize(("norm", "kind"), [("layernorm", "centred"), ("rmsnorm", "orthogonal")])
def test_the_pipelines_orthogonal_forms_are_untied_copies_of_the_same_function_with_gains_folded(norm, kind):
    cfg, x = config(norm=norm, tie_embeddings=True), tokens()
    a, b = (Checkpoint("gpt", cfg, s, built(cfg, s).state_dict()) for s in (0, 1))
    before = {k: v.clone() for k, v in b.state_dict.items()}
    (ca, cb), spec, points = symmetric_forms(a, b, symmetry="orthogonal", example_inputs=x)
    assert ca.config == cfg.model_copy(update={"tie_embeddings": False}) == cb.config
    widest = max(spec.group_sizes(ca.state_dict), key=lambda g: sum(g in axes for axes in spec.axes.values()))
    assert spec.kinds[widest] == kind and set(points) <= set(spec.group_sizes(ca.state_dict))
    for ckpt, canon in ((a, ca), (b, cb)):
        original = with_state(built(ckpt.config), ckpt.state_dict)
        assert change(original, with_state(gpt.Model(canon.config).double().eval(), canon.state_dict), x) < 1e-10
        gains = [v for k, v in canon.state_dict.items() if "norm" in k and k.endswith("weight")]
        assert gains and all(torch.equal(g, torch.ones_like(g)) for g in gains)
        assert canon.state_dict["head.weight"].dtype == torch.float64
    assert all(torch.equal(before[k], b.state_dict[k]) for k in before)  # the caller's checkpoint untouched
    forms, own, _ = symmetric_forms(a, b, symmetry="permutation", example_inputs=None)  # nothing to trace
    assert forms[0] is a and forms[1] is b and not own.kinds and own.group_sizes(a.state_dict)
    with pytest.raises(ValueError, match=r"^symmetry: expected one of \('permutation', 'orthogonal'\), got 'rot'$"):
        symmetric_forms(a, b, symmetry="rot", example_inputs=x)
    with pytest.raises(ValueError, match=r"^example_inputs: needed to trace the orthogonal form of the checkpoints$"):
        symmetric_forms(a, b, symmetry="orthogonal", example_inputs=None)
    with pytest.raises(ValueError, match=r"^mlp: embed.weight and head.weight are one tensor a gain folds into; "):
        untied_config("mlp", mlp.Config(input_shape=(1, 28, 28), num_classes=10), ("embed.weight", "head.weight"))
