"""The tracer on timm's attention (lmclab.trace.packed): one packed ``qkv`` Linear reshaped to
``(B, N, 3, H, d)``, permuted, unbound, then ``F.scaled_dot_product_attention`` (timm's fused path) or
the unfused ``softmax(q kᵀ) v``. The ViT below is timm's VisionTransformer written out (its module
names, its forward); loaded with the project's ``vit`` weights it computes the same function, its traced
spec is the ``vit`` hand-written spec with q/k/v packed, random headed permutations of it leave the
logits unchanged in float64, the negative controls change them, and WM and AM bring a permuted copy back."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.search.activation_matching import activation_matching
from lmclab.search.weight_matching import weight_matching
from lmclab.trace import TraceError, trace, trace_spec

E, H, DEPTH = 16, 4, 2
CONFIG = {"patch_size": 7, "width": E, "depth": DEPTH, "heads": H}


class Attention(nn.Module):
    """timm.models.vision_transformer.Attention (qk_norm off)."""

    def __init__(self, dim: int, num_heads: int, fused: bool) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.fused_attn = num_heads, dim // num_heads, fused
        self.scale = self.head_dim**-0.5
        self.qkv, self.q_norm, self.k_norm = nn.Linear(dim, dim * 3), nn.Identity(), nn.Identity()
        self.attn_drop, self.proj, self.proj_drop = nn.Dropout(0.0), nn.Linear(dim, dim), nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape  # noqa: N806
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            x = self.attn_drop(attn) @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, fused: bool) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, num_heads, fused)
        self.ls1, self.drop_path1 = nn.Identity(), nn.Identity()
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 2 * dim)
        self.ls2, self.drop_path2 = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PatchEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(1, E, 7, stride=7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """timm's VisionTransformer (class token, learned positions, global_pool="token") at 28 px, patch 7."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed()
        self.cls_token, self.pos_embed = nn.Parameter(torch.zeros(1, 1, E)), nn.Parameter(torch.zeros(1, 17, E))
        self.blocks = nn.Sequential(*(Block(E, H, fused) for _ in range(DEPTH)))
        self.norm, self.head = nn.LayerNorm(E), nn.Linear(E, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def timm_keys(key: str) -> str:
    """The project's ``vit`` parameter name -> timm's (``q``/``k``/``v`` -> ``qkv``, see :func:`packed`)."""
    for ours, theirs in (
        ("embed.", "patch_embed.proj."),
        (".attn.out.", ".attn.proj."),
        (".fc1.", ".mlp.fc1."),
        (".fc2.", ".mlp.fc2."),
    ):
        key = key.replace(ours, theirs)
    return key


def packed(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The project's ``vit`` state_dict in timm's layout: ``qkv`` = the rows of q, k, v stacked."""
    out = {timm_keys(k): v for k, v in ours.items() if not any(f".attn.{p}." in k for p in "qkv")}
    for b in range(DEPTH):
        for kind in ("weight", "bias"):
            rows = [ours[f"blocks.{b}.attn.{p}.{kind}"] for p in "qkv"]
            out[f"blocks.{b}.attn.qkv.{kind}"] = torch.cat(rows)
    return out


def ours() -> tuple[nn.Module, object]:
    config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, **CONFIG)
    torch.manual_seed(0)
    model = build_model("vit", config).double()
    with torch.no_grad():  # every weight random, norms not at 1: nothing hides the function
        for p in model.parameters():
            p.normal_(0, 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.3)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
    return model.eval(), config


def twin(fused: bool) -> nn.Module:
    model = VisionTransformer(fused).double().eval()
    model.load_state_dict(packed(ours()[0].state_dict()))
    return model


X = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.fixture(scope="module", params=[True, False], ids=["fused-sdpa", "unfused"])
def traced(request):
    model = twin(request.param)
    spec = trace_spec(model, X)
    spec.check(model.state_dict())
    with torch.no_grad():
        expected = model(X)
    return model, spec, expected, request.param


def test_the_timm_twin_computes_the_project_vit(traced):
    model, _, expected, _ = traced
    with torch.no_grad():
        assert (ours()[0](X) - expected).abs().max() <= 1e-12 * expected.abs().max()
    assert (expected[0] - expected[1]).abs().max() > 1e-3 * expected.abs().max()


def unpacked(spec: PermutationSpec) -> dict[str, tuple]:
    """The traced timm spec in the project's names: ``qkv``'s three row segments become q, k, v."""
    axes = {}
    for key, entry in spec.axes.items():
        if ".attn.qkv." in key:
            for part, seg in zip("qkv", entry[0], strict=True):
                assert seg.length == E and seg.block == 1
                axes[key.replace(".qkv.", f".{part}.")] = (seg.group, *entry[1:])
        else:
            axes[key] = entry
    return axes


def test_the_traced_spec_is_the_hand_written_one_with_qkv_packed(traced):
    _, spec, _, _ = traced
    hand = get_arch("vit").permutation_spec(ours()[1])
    got = unpacked(spec)
    assert set(got) == {timm_keys(k) for k in hand.axes}
    names: dict[str, str] = {}  # traced group -> hand group: one-to-one on every axis
    for key, entry in hand.axes.items():
        for mine, theirs in zip(got[timm_keys(key)], entry, strict=True):
            assert (mine is None) == (theirs is None), key
            if mine is not None:
                assert names.setdefault(mine, theirs) == theirs, key
    assert len(set(names.values())) == len(names) == len(hand.groups)
    assert {names[g]: h.count for g, h in spec.heads.items()} == {g: h.count for g, h in hand.heads.items()}
    ties = {h.tie: set() for h in spec.heads.values()}
    for g, h in spec.heads.items():
        ties[h.tie].add(names[g])
    assert sorted(map(sorted, ties.values())) == sorted(
        sorted(g for g, h in hand.heads.items() if h.tie == tie) for tie in {h.tie for h in hand.heads.values()}
    )


def logits_after(fused: bool, spec: PermutationSpec, perm: dict, params: dict) -> torch.Tensor:
    copy = VisionTransformer(fused).double().eval()
    copy.load_state_dict(apply_permutation(spec, perm, params))
    with torch.no_grad():
        return copy(X)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_headed_permutations_leave_the_timm_vit_unchanged(traced, seed):
    model, spec, expected, fused = traced
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(seed), spec.heads)
    assert all(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    got = logits_after(fused, spec, perm, model.state_dict())
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()


def test_crossing_heads_untying_v_or_splitting_the_q_and_k_features_changes_the_logits(traced):
    model, spec, expected, fused = traced
    params = model.state_dict()
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(3), spec.heads)
    qk, _, vo = (s.group for s in spec.axes["blocks.0.attn.qkv.weight"][0])
    crossing = {**perm, qk: torch.randperm(E, generator=torch.Generator().manual_seed(4))}
    untied = {**perm, vo: perm[vo].reshape(H, -1)[[1, 0, 2, 3]].reshape(-1)}
    for bad in (crossing, untied):
        assert (logits_after(fused, spec, bad, params) - expected).abs().max() > 1e-3 * expected.abs().max()
    moved = apply_permutation(spec, perm, params)  # then τ of head 0 swapped for K's rows only
    for kind in ("weight", "bias"):
        rows = moved[f"blocks.0.attn.qkv.{kind}"]
        rows[[E, E + 1]] = rows[[E + 1, E]]
    copy = VisionTransformer(fused).double().eval()
    copy.load_state_dict(moved)
    with torch.no_grad():
        assert (copy(X) - expected).abs().max() > 1e-3 * expected.abs().max()


def test_weight_matching_and_activation_matching_bring_a_permuted_timm_vit_back(traced):
    model, spec, _, _ = traced
    params_a = model.state_dict()
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(5), spec.heads)
    params_b = apply_permutation(spec, perm, params_a)
    found = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    assert back_to(spec, found.perm, params_a, params_b)
    points = trace(model, X).points
    assert points[spec.axes["blocks.1.attn.qkv.weight"][0][2].group] == ["blocks.1.attn.qkv@-1[2/3]"]
    images = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    data = Split(images, torch.zeros(64))
    found = activation_matching(spec, params_a, params_b, model=model, points=points, data=data)
    assert back_to(spec, found.perm, params_a, params_b)


def back_to(spec: PermutationSpec, found: dict, params_a: dict, params_b: dict) -> bool:
    back = apply_permutation(spec, found, params_b)
    return all(torch.equal(back[k], v) for k, v in spec.matched(params_a).items())


class Packed(nn.Module):
    """A packed projection (3 parts of 4 heads of 4) with a ``forward`` given as a function."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, tokens, 16)
        return self.f(self, x)


def parts(m: Packed, x: torch.Tensor) -> torch.Tensor:
    return m.qkv(x).reshape(x.shape[0], x.shape[1], 3, 4, 4).permute(2, 0, 3, 1, 4)


def merged(o: torch.Tensor) -> torch.Tensor:
    return o.transpose(1, 2).flatten(2)


def fused(m: Packed, x: torch.Tensor, extra) -> torch.Tensor:
    q, k, v = parts(m, x).unbind(0)
    return m.out(merged(F.scaled_dot_product_attention(q, k, v, **extra(q, k))))


REFUSED = {
    "sum-over-parts": (
        lambda m, x: m.out(merged(parts(m, x).sum(0))),
        r"node 'sum\w*': sum .*an operation on packed q/k/v it does not know",
    ),
    "unbind-samples": (
        lambda m, x: m.out(merged(torch.stack(parts(m, x).unbind(1), 1)[0])),
        r"node 'unbind': unbind .*an unbind along an axis that is not the packed part axis",
    ),
    "permuted-mask": (
        lambda m, x: fused(m, x, lambda q, k: {"attn_mask": q @ k.transpose(-2, -1)}),
        r"node 'scaled_dot_product_attention'.*an attention mask that is permuted",
    ),
    "grouped-query": (lambda m, x: fused(m, x, lambda q, k: {"enable_gqa": True}), r"grouped-query attention"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_it_cannot_follow_on_packed_qkv_is_refused_in_one_line(name):
    forward, message = REFUSED[name]
    with pytest.raises(TraceError, match=message) as err:
        trace_spec(Packed(forward), torch.zeros(2, 9, 16))
    assert "\n" not in str(err.value)


def test_with_partial_a_refused_packed_tensor_leaves_every_part_unpermuted():
    spec = trace_spec(Packed(REFUSED["sum-over-parts"][0]), torch.zeros(2, 9, 16), partial=True)
    assert spec.axes["qkv.weight"][0] is None and not spec.heads


class SplitQKV(torch.nn.Module):
    """q, k, v split from one projection by ``torch.split`` in the module's own code (GPT-2's pattern, fx)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = torch.split(self.qkv(x), 16, dim=-1)
        b, t = x.shape[:2]
        q, k, v = (z.reshape(b, t, 4, 4).transpose(1, 2) for z in (q, k, v))
        o = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return self.out(o.transpose(1, 2).reshape(b, t, 16)) + x


def test_a_split_projection_traced_by_fx_is_three_groups_and_keeps_the_function():
    from lmclab.core.spec import apply_permutation, random_permutation

    torch.manual_seed(0)
    model = SplitQKV().double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    spec = trace_spec(model, x)
    rows = spec.axes["qkv.weight"][0]
    assert [s.length for s in rows] == [16, 16, 16] and rows[0].group == rows[1].group != rows[2].group
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads)
    twin = SplitQKV().double()
    twin.load_state_dict(apply_permutation(spec, perm, state))
    assert torch.allclose(model(x), twin(x), rtol=1e-12, atol=1e-12)


def channels_first(m: Packed, x: torch.Tensor) -> torch.Tensor:
    """The parts split off an axis with the tokens after it: ``(B, 3·E, N) -> (B, 3, H, d, N)``."""
    return m.qkv(x).transpose(1, 2).reshape(x.shape[0], 3, 4, 4, x.shape[1]).permute(1, 0, 2, 4, 3)


@pytest.mark.parametrize(
    "pack,pick",
    [
        (parts, lambda p: (p[0], p[1], p[2])),
        (parts, lambda p: p.unbind(0)),
        (channels_first, lambda p: p.unbind(0)),
        (parts, lambda p: p.swapaxes(0, 1).unbind(1)),
    ],
    ids=["indexed-parts", "unbound-parts", "channels-first", "swapped-axes"],
)
def test_parts_picked_by_index_are_the_parts_unbind_gives(pack, pick):
    """``qkv[0], qkv[1], qkv[2]`` (older timm), ``qkv.unbind(0)``, the parts split with the tokens last and the part
    axis moved by the ``swapaxes`` method: the same spec, and it keeps the logits."""

    def attend(m, x):
        q, k, v = pick(pack(m, x))
        return m.out(merged(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)) + x

    torch.manual_seed(0)
    model, x = Packed(attend).double(), torch.randn(2, 9, 16, dtype=torch.float64)
    spec = trace_spec(model, x)
    rows = spec.axes["qkv.weight"][0]
    assert [s.length for s in rows] == [16, 16, 16] and rows[0].group == rows[1].group != rows[2].group
    assert spec.heads[rows[0].group].tie == spec.heads[rows[2].group].tie
    state = model.state_dict()
    with torch.no_grad():
        expected = model(x)
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads)
        model.load_state_dict(apply_permutation(spec, perm, state))
        assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()


class Projections(Packed):
    """:class:`Packed` with separate ``q``, ``k``, ``v`` Linears (16 → 16) and a ``gate`` (16 → 16)."""

    def __init__(self, forward) -> None:
        super().__init__(forward)
        self.q, self.k, self.v, self.gate = (nn.Linear(16, 16) for _ in range(4))


def concatenated(m: Projections, x: torch.Tensor) -> torch.Tensor:
    """Three Linears side by side, then split into parts as one packed projection: ``(B, N, 3, H, d)``."""
    h = torch.cat([m.q(x), m.k(x), m.v(x)], -1).reshape(x.shape[0], x.shape[1], 3, 4, 4)
    q, k, v = h.permute(2, 0, 3, 1, 4).unbind(0)
    return m.out(merged(F.scaled_dot_product_attention(q, k, v)))


def gated(m: Projections, x: torch.Tensor) -> torch.Tensor:
    """The gate's units chunked in two (its group refined) after the packed parts are made, before they are read."""
    p = parts(m, x)
    g1, g2 = m.gate(x).chunk(2, -1)
    q, k, v = p.unbind(0)
    return m.out(merged(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)) * (g1 * g2).sum(-1, keepdim=True)


def invariant(model: nn.Module, x: torch.Tensor) -> PermutationSpec:
    """The traced spec, after checking in float64 that a random permutation of it keeps the output."""
    model, x = model.double(), x.double()
    spec, state = trace_spec(model, x), model.state_dict()
    with torch.no_grad():
        expected = model(x)
        perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(3), spec.heads)
        model.load_state_dict(apply_permutation(spec, perm, state))
        assert (model(x) - expected).abs().max() <= 1e-12 * expected.abs().max()
    return spec


def test_three_projections_concatenated_then_split_into_parts_are_their_own_three_groups():
    torch.manual_seed(0)
    spec = invariant(Projections(concatenated), torch.randn(2, 9, 16))
    (qk, stream), (vo, _) = spec.axes["q.weight"], spec.axes["v.weight"]
    assert spec.axes["k.weight"] == (qk, stream) and qk != vo and spec.axes["out.weight"] == (None, vo)
    assert spec.heads[qk].count == spec.heads[vo].count == 4 and spec.heads[qk].tie == spec.heads[vo].tie


def test_a_group_refined_while_packed_parts_wait_to_be_read_leaves_the_parts_as_they_were():
    torch.manual_seed(0)
    spec = invariant(Projections(gated), torch.randn(2, 9, 16))
    rows = spec.axes["qkv.weight"][0]
    assert [s.length for s in rows] == [16, 16, 16] and rows[0].group == rows[1].group != rows[2].group
    halves = spec.axes["gate.weight"][0]
    assert [s.length for s in halves] == [8, 8] and halves[0].group == halves[1].group is not None


def keys_of_the_input(m: Packed, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_queries_against_keys_of_the_input_are_read_in_place_fused_or_not(fused):
    """Keys never permuted: the queries' features are read in place and their head order is fixed by the keys'
    heads, so the query and value parts are left unpermuted alike by the fused and the unfused attention."""

    def forward(m, x):
        q, _, v = parts(m, x).unbind(0)
        k = keys_of_the_input(m, x)
        if fused:
            return m.out(merged(F.scaled_dot_product_attention(q, k, v)))
        return m.out(merged(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v))

    spec = invariant(Packed(forward), torch.randn(2, 9, 16))
    q, k, v = spec.axes["qkv.weight"][0]
    assert q.group is None and v.group is None and k.group is not None and spec.axes["out.weight"] == (None, None)
    assert [p.node for p in spec.pinned] == ["scaled_dot_product_attention" if fused else "matmul"]
