"""The tracer's proof of a group's kind (lmclab.trace.rotations) and the canonical form (lmclab.core.canonical):
on the project's ``gpt`` with RMSNorm the residual stream is proved orthogonal with its gains listed; folding the
gains keeps the logits, and then random orthogonal maps of the stream (with permutations of every other group)
keep them in float64, while the same maps with the gains in place, or on a group the tracer kept a permutation
group, change them. LayerNorm, a tied head and every operation that does not commute with rotations keep the
stream a permutation group."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.func import functional_call

from lmclab.archs import gpt
from lmclab.core.canonical import fold_gains, is_canonical
from lmclab.core.heads import plane_rotations
from lmclab.core.orthogonal import random_orthogonal
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import TraceError, trace_spec
from lmclab.trace.kinds import WHOLE
from lmclab.trace.planes import PLANE

VOCAB, CONTEXT = 31, 8


def _gpt(seed: int = 0, **options) -> nn.Module:
    """gpt in float64 with every parameter random (gains in 0.5 … 1.5)."""
    shapes = dict(width=12, depth=2, heads=2, mlp_ratio=2, norm="rmsnorm", tie_embeddings=False)
    cfg = gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, **(shapes | options))
    torch.manual_seed(seed)
    model = gpt.Model(cfg).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5) if "norm" in key else p.normal_(0, 0.3)
    return model


def _x() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, CONTEXT), generator=torch.Generator().manual_seed(1))


def _change(model: nn.Module, params: dict, reference: torch.Tensor) -> float:
    with torch.no_grad():
        return float((functional_call(model, params, (_x(),)) - reference).abs().max() / reference.abs().max())


OPTIONS = [dict(position=p, mlp=m, kv_heads=k) for p in gpt.POSITIONS for m in gpt.MLPS for k in (None, 1)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_the_stream_of_rmsnorm_gpt_is_orthogonal_once_its_gains_are_folded(options: dict) -> None:
    model = _gpt(**options)
    spec, state = trace_spec(model, _x(), symmetry="orthogonal"), model.state_dict()
    stream = spec.axes["embed.weight"][1]
    assert spec.axes["norm.weight"] == (None,) and len(spec.gains) == 5 and spec.kinds[stream] == "orthogonal"
    # inside heads, per layer: q/k (rotary positions: turned per plane) and v/o; one key/value head: no heads
    headed = {g for g in spec.kinds if g in spec.heads}
    assert len(headed) == (0 if options["kv_heads"] else 4)
    assert len(spec.kinds) == 1 + (2 if options["kv_heads"] else len(headed))  # MQA: each layer's values plain
    rotary = options["position"] == "rotary" and not options["kv_heads"]
    assert set(spec.kinds.values()) == ({"orthogonal", "rotary"} if rotary else {"orthogonal"})
    with torch.no_grad():
        reference = model(_x())
    folded = fold_gains(spec, state)
    assert is_canonical(spec, folded) and not is_canonical(spec, state)
    assert _change(model, folded, reference) <= 1e-12
    for seed in (1, 2):
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        assert perm[stream].shape == (12, 12)
        assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
        assert _change(model, apply_permutation(spec, perm, state), reference) > 1e-3  # the gains in place
    mlp = spec.axes["blocks.0.fc1.weight"][0]  # a group the tracer kept a permutation group (GELU, SwiGLU)
    forced = dataclasses.replace(spec, kinds={**spec.kinds, mlp: "orthogonal"})
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(3), spec.heads, forced.kinds)
    assert _change(model, apply_permutation(forced, perm, folded), reference) > 1e-3


def _inside_heads(state: dict, names: tuple[str, ...], blocks: torch.Tensor) -> dict:
    """``state`` with the rows of ``names`` (a layer's q and k, each 2 heads of 6) multiplied by ``blocks`` (one map
    per head, ``(2, 6, 6)``), the same for every name."""
    block = torch.block_diag(*blocks)
    return {k: block @ v if k.rsplit(".", 1)[0] in names else v for k, v in state.items()}


QK = ("blocks.0.attn.q", "blocks.0.attn.k")


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_queries_and_keys_rotated_alike_inside_each_head_keep_the_logits_and_under_rotary_positions_per_plane(
    position,
) -> None:
    """``qᵀk = (Rq)ᵀ(Rk)``: one orthogonal map per head shared by a layer's queries and keys keeps the logits with
    learned positions, and the tracer marks that group orthogonal. Rotary positions turn each plane (j, j + d/2) of
    q and k by the token's angle: the tracer marks the group rotary (one group of q and k, not whole heads), a
    rotation of each plane shared by q and k keeps the logits, while a map mixing planes, or the planes of the
    queries turned without the keys', change them. An orthogonal map of a layer's values across heads changes the
    logits too."""
    model = _gpt(position=position)
    spec, state = trace_spec(model, _x(), symmetry="orthogonal"), model.state_dict()
    with torch.no_grad():
        reference = model(_x())
    qk = spec.axes["blocks.0.attn.q.weight"][0]
    assert spec.axes["blocks.0.attn.k.weight"][0] == qk and spec.heads[qk].count == 2
    g = torch.Generator().manual_seed(4)
    general = torch.stack([random_orthogonal(6, g) for _ in range(2)])
    planes = plane_rotations(torch.rand(2, 3, generator=g, dtype=torch.float64) * 6.28)
    if position == "learned":
        assert spec.kinds[qk] == "orthogonal" and _change(model, _inside_heads(state, QK, general), reference) <= 1e-10
    else:
        assert spec.kinds[qk] == "rotary" and spec.kind_reasons[qk] == f"node 'mul': {PLANE}"
        assert _change(model, _inside_heads(state, QK, planes), reference) <= 1e-10
        assert _change(model, _inside_heads(state, QK, general), reference) > 1e-3  # planes mixed
        assert _change(model, _inside_heads(state, QK[:1], planes), reference) > 1e-3  # the queries alone
    vo = spec.axes["blocks.0.attn.v.weight"][0]
    assert spec.kinds[vo] == "orthogonal" and spec.heads[vo].count == 2
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(5), spec.heads, spec.kinds)
    folded = fold_gains(spec, state)
    assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
    across = {**perm, vo: random_orthogonal(12, torch.Generator().manual_seed(6))}
    assert _change(model, apply_permutation(spec, across, folded), reference) > 1e-3


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_the_stream_of_layernorm_gpt_is_centred_once_its_gains_are_folded(position: str) -> None:
    """LayerNorm's centring commutes with the orthogonal maps that fix the all-ones vector; its bias is rotated
    with the stream, its gain folded; a general orthogonal map changes the logits."""
    model = _gpt(norm="layernorm", position=position)
    spec, state = trace_spec(model, _x(), symmetry="orthogonal"), model.state_dict()
    stream = spec.axes["embed.weight"][1]
    assert spec.kinds[stream] == "centred" and len(spec.gains) == 5
    inside = {"orthogonal", "rotary"} if position == "rotary" else {"orthogonal"}  # q/k turned per plane, v/o
    assert {k for g, k in spec.kinds.items() if g != stream} == inside
    assert spec.axes["blocks.0.norm1.bias"] == (stream,) and spec.axes["blocks.0.norm1.weight"] == (None,)
    with torch.no_grad():
        reference = model(_x())
    folded = fold_gains(spec, state)
    assert _change(model, folded, reference) <= 1e-12
    sizes = spec.group_sizes(state)
    for seed in (1, 2):
        perm = random_permutation(sizes, torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        assert _change(model, apply_permutation(spec, perm, folded), reference) <= 1e-10
    general = dataclasses.replace(spec, kinds={**spec.kinds, stream: "orthogonal"})
    perm = random_permutation(sizes, torch.Generator().manual_seed(3), spec.heads, general.kinds)
    assert _change(model, apply_permutation(general, perm, folded), reference) > 1e-3


def test_the_default_spec_has_no_kinds_and_keeps_the_gains_in_the_stream() -> None:
    model = _gpt()
    spec = trace_spec(model, _x())
    assert spec.kinds == {} and spec.gains == {}
    assert spec.axes["norm.weight"] == (spec.axes["embed.weight"][1],)
    with pytest.raises(ValueError, match="symmetry: expected one of"):
        trace_spec(model, _x(), symmetry="rotation")


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_a_gain_folded_into_a_tied_head_keeps_the_stream_a_permutation_group(norm: str) -> None:
    model = _gpt(norm=norm, tie_embeddings=True)
    spec = trace_spec(model, _x(), symmetry="orthogonal")
    assert set(spec.kinds) == set(spec.heads) and spec.gains == {}  # only inside the heads
    assert dataclasses.replace(spec, kinds={}) == trace_spec(model, _x())


class Stream(nn.Module):
    """x → embed → stream ops of one kind (``how``) → head: which ones keep the stream orthogonal."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.embed, self.fc, self.head = how, nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)
        self.gain, self.gain2 = nn.Parameter(torch.rand(4) + 0.5), nn.Parameter(torch.rand(4) - 0.5)
        self.depthwise = nn.Conv2d(4, 4, 1, groups=4)
        self.mix = nn.Linear(5, 5)
        self.norm = nn.LayerNorm(4)
        self.c1d, self.c1d_bias = nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(6))  # (in, out)
        self.per_unit = nn.Linear(1, 3)
        self.square, self.square_bias, self.back = (
            nn.Parameter(torch.randn(4, 4)),
            nn.Parameter(torch.randn(4)),
            nn.Linear(6, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.embed(x)
        if self.how == "gelu":
            s = nn.functional.gelu(s)
        elif self.how == "rms":  # a hand-written RMSNorm with its gain, read by a linear layer
            s = s + self.fc(self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "cast gain":  # the same gain, cast first (as mixed-precision RMSNorms do): still stored
            s = s + self.fc(self.gain.double() * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "postnorm":  # the gained output is the stream itself, read by an add: not foldable
            s = self.gain * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))
            s = s + self.fc(s)
        elif self.how == "sum":  # a plain sum over the units is no invariant of a rotation
            s = s * s.sum(-1, keepdim=True)
        elif self.how == "product":
            s = s * self.fc(s)
        elif self.how == "square":  # a square read otherwise than summed over the units
            s = s + (s * s)
        elif self.how == "square over samples":
            s = s + (s * s).mean(0, keepdim=True)
        elif self.how == "cube":
            s = s * s.pow(3).sum(-1, keepdim=True)
        elif self.how == "1 + gain":  # Gemma's gain: folded as 1 + w, leaving w = 0
            s = s + self.fc(
                (1.0 + self.gain.float().double()) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            )
        elif self.how == "cast 1 + gain":  # the offset gain cast as a whole (a method call): still c + w
            s = s + self.fc((1.0 + self.gain).double() * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "plus zero":  # adds nothing: no shift of the units
            s = s + 0
        elif self.how == "True + gain":  # a bool is no number here: not read as the offset 1
            s = s + self.fc((True + self.gain) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "conv1d reader":  # GPT-2's Conv1D: bias + x @ W with W (in, out), through a reshape
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + self.back(torch.relu(torch.addmm(self.c1d_bias, h.reshape(-1, 4), self.c1d)))
        elif self.how == "scaled conv1d reader":  # addmm's beta and alpha scale its bias and its product: still linear
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + self.back(torch.relu(torch.addmm(self.c1d_bias, h.reshape(-1, 4), self.c1d, beta=0.5, alpha=2.0)))
        elif self.how == "square conv1d reader":  # (4, 4): no telling its input axis from its shape
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + torch.addmm(self.square_bias, h, self.square)
        elif self.how == "gain moved off the last axis":  # a reshape that moves the units off the last axis
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + self.per_unit(h.reshape(5, 4, 1)).sum(-1)
        elif self.how == "gain read through a copy":  # a method-call copy between the gained output and its reader
            s = s + self.fc((self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))).contiguous())
        elif self.how == "gain - 0.5":  # another offset, on the other side
            s = s + self.fc(torch.add(self.gain, -0.5) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "sum of two gains":  # two parameters: no c + w
            s = s + self.fc((self.gain + self.gain2) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "gain + alpha * 1":  # torch.add's alpha scales the number: read as is, it is not folded
            s = s + self.fc(
                torch.add(self.gain, 1.0, alpha=2.0) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            )
        elif self.how == "2 * gain":  # computed otherwise: no folding sets what is read to 1
            s = s + self.fc((2.0 * self.gain) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "1 + gain, read by a GELU":  # an offset gain whose output is not read by linear layers
            s = s + nn.functional.gelu((1.0 + self.gain) * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
        elif self.how == "shift":  # a constant added to every unit: O(x + c·1) ≠ Ox + c·1
            s = s + 0.5
        elif self.how == "token shift":  # a per-sample constant, broadcast along the units
            s = s - x[:, :1]
        elif self.how == "bias":  # a parameter along the units: rotated with them
            s = s + self.gain
        elif self.how == "reciprocal":
            s = s + self.fc(1.0 / s)
        elif self.how == "gain read across samples":  # the normed output read by a Linear over the batch axis
            h = self.gain * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))
            s = s + self.mix(h.transpose(0, 1)).transpose(0, 1)
        elif self.how == "gain read by a norm":  # a module other than a linear layer reads the gained units
            h = self.gain * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))
            s = s + self.fc(self.norm(h))
        elif self.how == "layernorm":  # its centring commutes with the maps that fix the all-ones vector
            s = s + self.fc(self.norm(s))
        elif self.how == "shape read":  # x.shape, x.dtype read by torch.fx as getattr: no value of the units
            s = s + self.fc(self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6)))
            s = s.reshape(s.shape[0], -1).to(s.dtype)
        elif self.how == "normed shape read":  # the gained output's shape read beside its linear reader
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + self.fc(h).reshape(h.shape[0], -1)
        elif self.how in ("gained mean over samples", "gained sample picked"):  # other axes than the units read
            h = self.gain * (s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6))
            s = s + self.fc(h.mean(0, keepdim=True) if self.how == "gained mean over samples" else h[0])
        elif self.how == "gram":  # (s sᵀ) s: a product over the units of one group on both sides keeps sᵀ's O away
            s = s + (s @ s.transpose(0, 1)) @ s
        elif self.how == "gram over samples":  # (sᵀ s): the units on both axes of the product, read by a ReLU
            s = s + torch.relu(s.transpose(0, 1) @ s).sum(0)
        elif self.how == "depthwise":  # a kernel per channel
            s = self.depthwise(s[:, :, None, None]).flatten(1)
        return self.head(s)


ORTH, CENT = "orthogonal", "centred"  # the kinds the proof may give; None: a permutation group


@pytest.mark.parametrize(
    ("how", "kind"),
    [("rms", ORTH), ("gelu", None), ("postnorm", None), ("sum", CENT), ("product", None), ("square", None)]
    + [("square over samples", None), ("cube", None), ("depthwise", None), ("1 + gain", ORTH), ("gain - 0.5", ORTH)]
    + [("2 * gain", None), ("1 + gain, read by a GELU", None), ("sum of two gains", None), ("gain + alpha * 1", None)]
    + [("shift", CENT), ("token shift", CENT), ("bias", ORTH), ("reciprocal", None), ("gain read across samples", None)]
    + [("layernorm", CENT), ("cast gain", ORTH), ("shape read", ORTH), ("normed shape read", ORTH)]
    + [("gain read by a norm", None), ("gained mean over samples", ORTH), ("gained sample picked", ORTH)]
    + [("True + gain", None), ("gain read through a copy", ORTH), ("cast 1 + gain", ORTH), ("plus zero", ORTH)]
    + [("conv1d reader", ORTH), ("square conv1d reader", None), ("gain moved off the last axis", None)]
    + [("scaled conv1d reader", ORTH)]
    + [("gram", ORTH), ("gram over samples", None)],
)
def test_each_rule_of_the_proof(how: str, kind: str | None) -> None:
    """The kind the proof gives, and that the maps of that kind keep the function while the next larger ones
    (general orthogonal maps of a centred group, centred ones of a permutation group) change it."""
    model = Stream(how).double().eval()
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    spec = trace_spec(model, x, symmetry="orthogonal")
    stream = spec.axes["embed.weight"][0]
    assert spec.kinds.get(stream) == kind
    offset = {"1 + gain": 1.0, "cast 1 + gain": 1.0, "gain - 0.5": -0.5}.get(how)
    assert spec.gain_offsets == ({} if offset is None else {"gain": offset})  # none for a gain left in place
    if how == "sum of two gains":  # a gain of two parameters pins the stream already as a permutation group
        assert stream is None and spec.gains == {}
        return
    folded_gain = ("rms", "cast gain", "layernorm", "1 + gain", "gain - 0.5", "shape read", "normed shape read")
    folded_gain += ("gain read through a copy", "cast 1 + gain")
    if how in (*folded_gain, "gained mean over samples", "gained sample picked"):
        assert spec.gains == {"norm.weight" if how == "layernorm" else "gain": ("fc.weight",)}
    if how in ("conv1d reader", "scaled conv1d reader", "square conv1d reader"):
        assert spec.gains == ({"gain": ("c1d",)} if kind else {})
    if how == "gain read by a norm":  # no gain of a permutation group is listed, the one the norm reads neither
        assert spec.gains == {}
    with torch.no_grad():
        state, reference = model.state_dict(), model(x)
    folded = fold_gains(spec, state)
    for forced in (CENT, ORTH):
        perm = random_permutation(
            spec.group_sizes(state), torch.Generator().manual_seed(4), spec.heads, {stream: forced}
        )
        moved = apply_permutation(dataclasses.replace(spec, kinds={stream: forced}), perm, folded)
        with torch.no_grad():
            change = float((functional_call(model, moved, (x,)) - reference).abs().max())
        assert (change <= 1e-12) is (kind in (ORTH, forced)), (forced, change)


def test_fold_gains_refuses_a_reader_of_another_width() -> None:
    model = _gpt()
    spec = trace_spec(model, _x(), symmetry="orthogonal")
    state = dict(model.state_dict())
    state["head.weight"] = state["head.weight"][:, :5]
    with pytest.raises(ValueError, match=r"model_b: 'head.weight' of shape \(31, 5\) reads the gain 'norm.weight'"):
        fold_gains(spec, state, "model_b")


def test_fold_gains_refuses_a_zero_gain_with_a_bias() -> None:
    model = _gpt(norm="layernorm")
    spec = trace_spec(model, _x(), symmetry="orthogonal")
    assert spec.gain_biases["norm.weight"] == "norm.bias"
    state = dict(model.state_dict())
    state["norm.weight"] = state["norm.weight"].clone()
    state["norm.weight"][0] = 0.0
    with pytest.raises(ValueError, match="model_b: the gain 'norm.weight' has a zero entry; its bias 'norm.bias'"):
        fold_gains(spec, state, "model_b")


@pytest.mark.parametrize(("pool", "position"), [("cls", "learned"), ("mean", "sincos")])
def test_the_vit_s_stream_is_centred_once_its_layernorm_gains_are_folded(pool: str, position: str) -> None:
    """The project's ViT (LayerNorm before the attention, the MLP and a class-token or mean-pooled head; its
    attention reads ``x.shape``): centred maps of its stream keep the logits once the gains are folded, general
    orthogonal maps change them, and so do centred maps with the gains in place."""
    from lmclab.archs import vit

    shapes = dict(patch_size=4, width=8, depth=2, heads=2, pool=pool, position=position)
    torch.manual_seed(0)
    model = vit.Model(vit.Config(input_shape=(3, 8, 8), num_classes=5, **shapes)).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5) if "norm" in key and key.endswith("weight") else p.normal_(0, 0.3)
    x = torch.randn(4, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    spec, state = trace_spec(model, x, symmetry="orthogonal"), model.state_dict()
    (stream,) = set(spec.kinds) - set(spec.heads)
    assert spec.kinds[stream] == CENT and spec.gains["norm.weight"] == ("head.weight",) and len(spec.gains) == 5
    with torch.no_grad():
        reference = model(x)
    folded = fold_gains(spec, state)

    def change(kind: str, params: dict) -> float:
        kinds = {**spec.kinds, stream: kind}
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, kinds)
        moved = apply_permutation(dataclasses.replace(spec, kinds=kinds), perm, params)
        with torch.no_grad():
            return float((functional_call(model, moved, (x,)) - reference).abs().max() / reference.abs().max())

    assert change(CENT, folded) <= 1e-10
    assert change(ORTH, folded) > 1e-3 and change(CENT, state) > 1e-3


class _WholeAttention(nn.Module):
    """An ``nn.MultiheadAttention`` module, traced whole: its heads are headed groups of the spec."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attn, self.head = (
            nn.Linear(3, 8),
            nn.MultiheadAttention(8, 2, batch_first=True),
            nn.Linear(8, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.embed(x)
        return self.head(s + self.attn(s, s, s, need_weights=False)[0]).mean(1)


def test_the_heads_of_a_whole_multihead_attention_module_stay_permutation_groups() -> None:
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    spec = trace_spec(_WholeAttention().double().eval(), x, symmetry="orthogonal")
    assert spec.heads and not set(spec.heads) & set(spec.kinds)
    assert {spec.kind_reasons[g] for g in spec.heads} == {WHOLE}


class Rope(nn.Module):
    """Self-attention of 2 heads of 4 features over 5 tokens with rotary positions (``q·cos + rotate_half(q)·sin``),
    traced by ``torch.fx``, with its tables and ``rotate_half`` written as ``how`` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.embed, self.out = how, nn.Linear(3, 8), nn.Linear(8, 2)
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.01]), persistent=False)
        angles = torch.arange(5.0)[:, None] * self.inv_freq
        angles = torch.cat((angles, 2 * angles if how == "unpaired buffer" else angles), -1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        wide = torch.arange(5.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.01])
        self.register_buffer("wide", torch.cat((wide, wide), -1).cos(), persistent=False)  # paired on 8 features

    def tables(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored (``cos``, ``sin`` buffers), or computed in the graph as Llama does (``cat((f, f))``, cos, casts)."""
        if self.how in ("buffer", "unpaired buffer"):
            return self.cos, self.sin
        if self.how == "sliced table":  # 4 of a paired table's 8 features: not paired
            return self.wide[: x.shape[1], :4], self.sin
        freqs = torch.arange(x.shape[1], dtype=x.dtype)[:, None] * self.inv_freq
        emb = torch.cat((freqs, 2 * freqs if self.how == "unpaired table" else freqs), dim=-1)
        return emb.cos().to(x.dtype)[None, None], emb.sin().type_as(x).unsqueeze(0).unsqueeze(0)

    def turn(self, z: torch.Tensor) -> torch.Tensor:
        x1, x2 = z[..., : z.shape[-1] // 2], z[..., z.shape[-1] // 2 :]
        if self.how == "swapped halves":
            return torch.cat((x2, x1), dim=-1)
        if self.how == "reflected halves":
            return torch.cat((x1, -x2), dim=-1)
        if self.how == "turned the other way":  # -J: a rotation of each plane too
            return torch.cat((x2, -x1), dim=-1)
        if self.how == "half read alone":
            return torch.cat((-x2, x1), dim=-1) + torch.cat((x1, x1), dim=-1)
        if self.how == "halves of two tensors":
            return torch.cat((-(2 * z)[..., 2:], x1), dim=-1)
        if self.how == "strided halves":
            return torch.cat((-z[..., 1::2], z[..., ::2]), dim=-1)
        if self.how == "uneven halves":
            return torch.cat((-z[..., 1:], z[..., :1]), dim=-1)
        if self.how == "middle half":
            return torch.cat((-z[..., 1:3], x1), dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (f(self.embed(x)).view(b, t, 2, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        cos, sin, bias = *self.tables(x), 0.0
        if self.how == "table alone":  # q·cos and k·cos: a scale of each plane
            q, k = q * cos, k * cos
        elif self.how == "turn alone":  # q + rotate_half(q)/2 and k: a scaled turn of each plane of q
            q = q + self.turn(q) * 0.5
        elif self.how == "negated half read alone":  # the Gram matrix of -q[2:] beside rotate_half: no turn keeps it
            n2 = -q[..., 2:]
            q, k, bias = (
                q * cos + torch.cat((n2, q[..., :2]), -1) * sin,
                k * cos + self.turn(k) * sin,
                n2 @ n2.transpose(-2, -1),
            )
        else:
            q, k = q * cos + self.turn(q) * sin, k * cos + self.turn(k) * sin
        if self.how == "table added":
            q = q + cos
        if self.how == "bent after":
            q = torch.relu(q)
        weights = torch.softmax(q @ k.transpose(-2, -1) * 0.5 + bias, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, 8))


ROTARY = (
    "computed",
    "buffer",
    "turned the other way",
    "table alone",
    "turn alone",
)  # proved rotary from the graph; the others are not
WHOLE_HEADS = ("unpaired table", "unpaired buffer", "sliced table", "table added", "bent after", "swapped halves")
WHOLE_HEADS += ("reflected halves", "half read alone", "negated half read alone", "halves of two tensors")
WHOLE_HEADS += ("strided halves", "uneven halves", "middle half")


@pytest.mark.parametrize("how", ROTARY + WHOLE_HEADS)
def test_rotary_planes_are_proved_from_the_graph(how: str) -> None:
    """On the ``torch.fx`` path: a product by a table constant on each plane (a buffer by value, ``cat((f, f))``
    computed in the graph by its structure) and ``rotate_half`` (±J) of the halves of one tensor commute with a
    rotation of each plane: the queries and keys are one rotary group, whose random elements keep the output
    while a map mixing planes changes it. A table whose halves differ, other concatenations of the halves, a half
    read otherwise, a table added, or a nonlinearity after it keep the heads whole, as under permutations; the
    rotary element of the proved model then changes their output."""
    torch.manual_seed(0)
    model = Rope(how).double().eval()
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    spec, state = trace_spec(model, x, symmetry="orthogonal"), model.state_dict()
    assert isinstance(trace_spec(model, x).axes["q.weight"][0], tuple)  # permutations: whole heads, always
    with torch.no_grad():
        reference = model(x)

    def change(spec, kinds: dict) -> float:
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, kinds)
        with torch.no_grad():
            return float((functional_call(model, apply_permutation(spec, perm, state), (x,)) - reference).abs().max())

    qk = spec.axes["q.weight"][0]
    if how in ROTARY:
        assert spec.axes["k.weight"][0] == qk and spec.kinds[qk] == "rotary"
        assert change(spec, spec.kinds) <= 1e-12 and change(spec, {**spec.kinds, qk: "orthogonal"}) > 1e-3
        return
    assert isinstance(qk, tuple) and qk[0].block == 4 and qk[0].group not in spec.kinds  # whole heads
    assert change(spec, spec.kinds) <= 1e-12  # a head order: the heads' features stay in place
    proved = trace_spec(Rope("computed").double(), x, symmetry="orthogonal")
    assert change(proved, proved.kinds) > 1e-3


class _OneUnit(nn.Module):
    """One sample's single unit through an RMSNorm with its gain, returned as a 0-d tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm = nn.Linear(3, 1), nn.RMSNorm(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.a(x)).reshape(())


def test_a_gained_output_reshaped_into_a_scalar_is_refused_at_the_reshape_for_rotations_too() -> None:
    """The proof looks at the norm's readers before the reshape's own rule runs: a reshape to ``()`` is no linear
    read (no last axis), and the reshape is then refused in one line as it is for permutations."""
    for symmetry in ("permutation", "orthogonal"):
        with pytest.raises(TraceError, match=r"node 'reshape': .*a reshape \(1, 1\) -> \(\) it cannot follow"):
            trace_spec(_OneUnit(), torch.randn(1, 3), symmetry=symmetry)
