"""The tracer on attention (lmclab.trace.attention): torchvision's VisionTransformer (nn.MultiheadAttention
as a leaf) is invariant in float64 under random headed permutations of its traced spec and not under
permutations that cross heads or untie them; what it cannot prove about heads is refused in one line.
(The project's own ViT, written with separate q/k/v Linears, is compared to its hand-written spec in
tests/trace/test_trace.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

from lmclab.archs import build_model, get_arch, make_config
from lmclab.archs.gpt import rotate_half
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.search.weight_matching import weight_matching
from lmclab.trace import TraceError, trace_spec

SMALL = {"image_size": 28, "patch_size": 7, "num_layers": 2, "num_heads": 4, "hidden_dim": 16, "mlp_dim": 32}


def small_vit(seed: int = 0) -> nn.Module:
    """The small VisionTransformer in float64, eval mode, with every weight random (torchvision zeroes
    the head and the class token, which would hide the function)."""
    torch.manual_seed(seed)
    model = VisionTransformer(**SMALL, num_classes=10).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.3)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
    return model.eval()


def logits_after(model: nn.Module, spec: PermutationSpec, perm: dict, x: torch.Tensor) -> torch.Tensor:
    copy = small_vit()
    copy.load_state_dict(apply_permutation(spec, perm, model.state_dict()))
    with torch.no_grad():
        return copy(x)


@pytest.fixture(scope="module")
def traced():
    model, x = small_vit(), torch.randn(3, 3, 28, 28, dtype=torch.float64)
    spec = trace_spec(model, x)
    spec.check(model.state_dict())
    with torch.no_grad():
        expected = model(x)
    assert (expected[0] - expected[1]).abs().max() > 1e-3 * expected.abs().max()  # the logits depend on x
    return model, x, spec, expected


def test_the_traced_spec_of_multihead_attention_is_headed_and_tied(traced):
    _, _, spec, _ = traced
    attn = "encoder.layers.encoder_layer_0.self_attention"
    q, k, v = spec.axes[f"{attn}.in_proj_weight"][0]
    assert q == k and q.group != v.group and (q.length, v.length, q.block) == (16, 16, 1)
    assert spec.axes[f"{attn}.out_proj.weight"] == (spec.axes["encoder.ln.weight"][0], v.group)
    assert spec.axes[f"{attn}.in_proj_bias"] == (spec.axes[f"{attn}.in_proj_weight"][0],)
    assert spec.heads[q.group].count == spec.heads[v.group].count == 4
    assert spec.heads[q.group].tie == spec.heads[v.group].tie and len(spec.heads) == 4
    assert len({h.tie for h in spec.heads.values()}) == 2  # one head order per layer
    assert (
        spec.axes["class_token"]
        == spec.axes["encoder.pos_embedding"]
        == (None, None, spec.axes["encoder.ln.weight"][0])
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_headed_permutations_leave_torchvision_vit_unchanged(traced, seed):
    model, x, spec, expected = traced
    sizes = spec.group_sizes(model.state_dict())
    perm = random_permutation(sizes, torch.Generator().manual_seed(seed), spec.heads)
    assert all(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    got = logits_after(model, spec, perm, x)
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()


def test_permutations_that_cross_heads_or_untie_them_change_the_logits(traced):
    """The negative controls: the heads are a real restriction, and so is the tie."""
    model, x, spec, expected = traced
    sizes = spec.group_sizes(model.state_dict())
    perm = random_permutation(sizes, torch.Generator().manual_seed(4), spec.heads)
    qk = spec.axes["encoder.layers.encoder_layer_0.self_attention.in_proj_weight"][0][0].group
    vo = spec.axes["encoder.layers.encoder_layer_0.self_attention.out_proj.weight"][1]
    crossing = {**perm, qk: torch.randperm(16, generator=torch.Generator().manual_seed(5))}
    untied = {**perm, vo: (perm[vo].reshape(4, 4)[[1, 0, 2, 3]]).reshape(-1)}  # another head order for V/O only
    for bad in (crossing, untied):
        assert (logits_after(model, spec, bad, x) - expected).abs().max() > 1e-3 * expected.abs().max()


def test_weight_matching_on_the_traced_spec_recovers_a_permuted_vit(traced):
    model, _, spec, _ = traced
    params_a = model.state_dict()
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(6), spec.heads)
    params_b = apply_permutation(spec, perm, params_a)
    found = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    back = apply_permutation(spec, found.perm, params_b)
    assert all(torch.equal(back[k], v) for k, v in spec.matched(params_a).items())


def test_the_traced_architecture_builds_vit_b_16():
    config = make_config(
        "traced",
        input_shape=(3, 32, 32),
        num_classes=10,
        factory="torchvision.models:vit_b_16",
        kwargs={"image_size": 32},
    )
    spec = get_arch("traced").permutation_spec(config)
    spec.check(build_model("traced", config).state_dict())
    assert len(spec.heads) == 2 * 12 and {h.count for h in spec.heads.values()} == {12}
    assert len({h.tie for h in spec.heads.values()}) == 12


class Attention(nn.Module):
    """Self-attention with separate q/k/v Linears (4 heads of 4) and a ``forward`` given as a function."""

    def __init__(self, forward) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.k1, self.v1, self.mix = nn.Linear(16, 4), nn.Linear(16, 4), nn.Linear(4, 4)
        self.f = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, tokens, 16)
        return self.f(self, x)


def heads(x: torch.Tensor, count: int) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1], count, -1).transpose(1, 2)


def merged(o: torch.Tensor) -> torch.Tensor:
    return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)


def attend(m: Attention, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mix=None) -> torch.Tensor:
    logits = q @ k.transpose(-2, -1)
    if mix is not None:
        logits = mix(logits)
    return m.out(merged(torch.softmax(logits, dim=-1) @ v)) + x


def features_beside_logits(m: Attention, x: torch.Tensor) -> torch.Tensor:
    """q's and v's features (two groups) and the logits side by side, each head's tokens then flattened in."""
    q, k, v = heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4)
    return torch.cat([q, v, q @ k.transpose(-2, -1)], -1).transpose(2, 3).flatten(2).sum(-1)


def features_beside_logits_into_a_linear(m: Attention, x: torch.Tensor) -> torch.Tensor:
    """q's and v's features (two groups) and 8 of the logits' tokens on one axis of 16, read by a Linear."""
    q, k, v = heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4)
    return m.out(torch.cat([q, v, (q @ k.transpose(-2, -1))[..., :8]], -1))


REFUSED = {
    "multi-query": (  # one key/value head with no head axis: the output mixes query heads and its features
        lambda m, x: attend(m, x, heads(m.q(x), 4), heads(m.k1(x), 1), heads(m.v1(x), 1)),
        r"node 'reshape.*a flatten that does not join a head axis to the features of its heads",
    ),
    "two-head-counts": (  # one group split into 4 heads for q, 2 for k
        lambda m, x: (
            attend(m, x, heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4)) + m.out(merged(heads(m.q(x), 2)))
        ),
        r"node 'reshape_4'.*a split into 2 heads of a group split into 4 heads elsewhere",
    ),
    "heads-not-batched": (  # q @ kᵀ with the heads left beside the features: logits between heads
        lambda m, x: m.out(
            (
                torch.softmax(m.q(x).reshape(2, 9, 4, 4) @ m.k(x).reshape(2, 9, 4, 4).transpose(-2, -1), dim=-1)
                @ m.v(x).reshape(2, 9, 4, 4)
            ).reshape(2, 9, 16)
        ),
        r"node 'matmul': matmul .*a product over the features of heads that are not one batch axis",
    ),
    "talking-heads": (  # a Linear mixing the heads of the logits
        lambda m, x: attend(
            m,
            x,
            heads(m.q(x), 4),
            heads(m.k(x), 4),
            heads(m.v(x), 4),
            lambda w: m.mix(w.transpose(1, -1)).transpose(1, -1),
        ),
        r"node 'mix': Linear in mix .*an operation over heads or per-head features it does not know",
    ),
    "heads-beside-units": (  # the logits' head axis times k1's 4 units on that axis: a head order is no group
        lambda m, x: attend(
            m,
            x,
            heads(m.q(x), 4),
            heads(m.k(x), 4),
            heads(m.v(x), 4),
            lambda w: w * m.k1(x).transpose(1, 2)[..., None],
        ),
        r"node 'mul': mul .*\(its operands are permuted in blocks or segments that differ\)",
    ),
    "softmax-across-heads": (
        lambda m, x: m.out(merged(torch.softmax(heads(m.v(x), 4), dim=1))),
        r"node 'softmax': softmax .*a softmax across heads whose features are permuted per head",
    ),
    "outer-product-of-heads": (  # (…, H, 1, t, d) * (…, 1, H, t, d): two head axes, features permuted per head
        lambda m, x: m.out(merged((heads(m.v(x), 4)[:, None] * heads(m.v(x), 4)[:, :, None]).sum(1))),
        r"node 'mul': mul .*per-head features beside no axis of their heads, or two",
    ),
    "mean-over-heads": (
        lambda m, x: m.out(torch.cat([heads(m.v(x), 4).mean(1)] * 4, dim=-1)),
        r"node 'mean': mean .*an operation over heads or per-head features",
    ),
    "features-of-two-groups-flattened-with-tokens": (
        features_beside_logits,
        r"node 'flatten': flatten .*\(a flatten that does not join a head axis to the features of its heads\)",
    ),
    "linear-over-features-beside-logits": (  # an axis of per-head features and unpermuted logits is still headed
        features_beside_logits_into_a_linear,
        r"node 'out': Linear in out .*an operation over heads or per-head features it does not know",
    ),
    "two-head-axes-side-by-side": (  # a head order pinned by the input, then twice along one axis: 8 "heads"
        lambda m, x: torch.cat([heads(m.q(x), 4) * x[:, 0, :4, None, None]] * 2, 1).transpose(1, 2).reshape(2, 9, 32),
        r"node 'reshape_1': reshape .*\(a flatten that does not join a head axis to the features of its heads\)",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_attention_it_cannot_prove_is_refused_in_one_line(name):
    forward, message = REFUSED[name]
    with pytest.raises(TraceError, match=message) as err:
        trace_spec(Attention(forward), torch.zeros(2, 9, 16))
    assert "\n" not in str(err.value)


def test_the_same_attention_with_shared_heads_is_traced():
    """The control of the refusals: the plain form of the module above is traced, headed and tied."""
    spec = trace_spec(
        Attention(lambda m, x: attend(m, x, heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4))),
        torch.zeros(2, 9, 16),
    )
    (qk, stream), (vo, _) = spec.axes["q.weight"], spec.axes["v.weight"]
    assert spec.axes["k.weight"] == (qk, stream) and spec.axes["out.weight"] == (stream, vo)
    assert spec.heads[qk].count == spec.heads[vo].count == 4 and spec.heads[qk].tie == spec.heads[vo].tie


def test_a_softmax_across_the_heads_of_the_attention_logits_is_traced():
    """The logits ``q kᵀ`` hold no per-head features: a softmax over their head axis moves with the head order."""

    def forward(m, x):
        return attend(m, x, heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4), lambda w: w.softmax(1))

    spec = trace_spec(Attention(forward), torch.zeros(2, 9, 16))
    assert spec.heads[spec.axes["q.weight"][0]].count == 4


def test_an_nn_softmax_module_on_the_attention_logits_is_traced_as_the_function_is():
    def forward(m, x):
        return attend(m, x, heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4), m.softmax)

    model = Attention(forward)
    model.softmax = nn.Softmax(dim=-1)
    spec = trace_spec(model, torch.zeros(2, 9, 16))
    assert spec.heads[spec.axes["q.weight"][0]].count == 4 and not spec.pinned


def weights_out(m: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = heads(m.q(x), 4), heads(m.k(x), 4), heads(m.v(x), 4)
    weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return m.out(merged(weights @ v)) + x, weights


def queries_out(m: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = m.q(x)
    return attend(m, x, heads(q, 4), heads(m.k(x), 4), heads(m.v(x), 4)), q


@pytest.mark.parametrize("forward", [weights_out, queries_out], ids=["per-head-weights", "queries"])
def test_an_output_fixing_the_head_order_pins_every_group_it_orders(forward):
    """Per-head weights (or the queries) leave the model unpermuted: σ is the identity, so no group it
    orders may stay headed (a Heads would draw another σ): q/k and v/o are pinned."""
    spec = trace_spec(Attention(forward), torch.zeros(2, 9, 16))
    assert not spec.heads and spec.axes["q.weight"] == spec.axes["v.weight"] == (None, None)
    assert not spec.groups  # (the stream holds the input: never permuted)


class Leaf(nn.Module):
    """``nn.MultiheadAttention`` (4 heads of 4) after a Linear, returning ``out(attention(h, h, h))``."""

    def __init__(self, returned) -> None:
        super().__init__()
        self.proj, self.attn, self.returned = (
            nn.Linear(16, 16),
            nn.MultiheadAttention(16, 4, batch_first=True),
            returned,
        )

    def forward(self, x: torch.Tensor):
        h = self.proj(x)
        return self.returned(self.attn(h, h, h, average_attn_weights=False), self.attn(h, h, h)[1])


@pytest.mark.parametrize(
    "returned,headed",
    [
        (lambda both, averaged: both[0] + averaged.sum(), True),  # weights averaged over heads: invariant
        (lambda both, averaged: both, False),  # the tuple itself, per-head weights included
        (lambda both, averaged: both[1], False),  # per-head weights
    ],
    ids=["output-and-averaged-weights", "the-tuple", "per-head-weights"],
)
def test_multihead_attention_weights_per_head_in_the_output_pin_its_head_order(returned, headed):
    spec = trace_spec(Leaf(returned), torch.zeros(2, 9, 16))
    assert bool(spec.heads) == headed and spec.axes["proj.weight"][0] is not None
    assert (spec.axes["attn.in_proj_weight"][0] is not None) == headed


class Residual(nn.Module):
    """``nn.MultiheadAttention`` in a residual stream that also carries the input (pinned by the addition)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(16, 16), nn.Linear(16, 3)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.head(h + self.attn(h, h, h)[0] + x)


def test_a_pin_lists_the_axes_of_multihead_attention_in_the_order_of_the_model():
    """The axes a pin leaves alone come in the order the graph reaches them, here the state_dict's: the input
    projection's columns before the output projection's rows (``lmclab trace`` prints the first four)."""
    spec = trace_spec(Residual(), torch.zeros(2, 9, 16))
    (pin,) = spec.pinned
    assert pin.node == "add_1" and pin.units == 16 and len(spec.heads) == 2  # the heads stay permuted
    assert pin.places == (
        ("proj.weight", 0),
        ("proj.bias", 0),
        ("attn.in_proj_weight", 1),
        ("attn.out_proj.weight", 0),
        ("attn.out_proj.bias", 0),
        ("head.weight", 1),
    )


class Unlike(nn.Module):
    """``nn.MultiheadAttention`` whose query is two Linears' outputs side by side (two groups of 8) and whose
    key and value are one Linear's (one group of 16): no one permutation of the 16 features fits both."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 8)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.attn(torch.cat([self.a(x), self.b(x)], -1), h, h)[0]


def test_multihead_attention_on_a_query_key_and_value_permuted_differently_is_refused():
    with pytest.raises(
        TraceError,
        match=r"^trace_spec: node 'attn': MultiheadAttention in attn cannot be proved "
        r"permutation-equivariant \(its query, key and value are permuted differently\); pass",
    ):
        trace_spec(Unlike(), torch.zeros(2, 9, 16))
    spec = trace_spec(Unlike(), torch.zeros(2, 9, 16), partial=True)
    assert not spec.heads and all(axes == (None,) * len(axes) for axes in spec.axes.values())


def test_a_product_of_query_and_key_with_their_heads_on_different_axes_is_refused():
    """q ``(B, H, T, d)`` times a key ``(H, B, d, T)`` (batch 4 = 4 heads, so the shapes broadcast): each
    query head meets the keys of another sample's heads — not Σ_j q_j k_j within one head."""

    def crossed(m, x):
        return attend(m, x, heads(m.q(x), 4), heads(m.k(x), 4).transpose(0, 1), heads(m.v(x), 4))

    model = Attention(crossed)
    model(torch.zeros(4, 9, 16))  # it runs
    with pytest.raises(TraceError, match=r"a product over the features of heads that are not one batch axis"):
        trace_spec(model, torch.zeros(4, 9, 16))


class SharedBias(nn.Module):
    """``nn.MultiheadAttention`` whose input-projection bias is also added to three Linears' outputs side by
    side: the first Linear's group is the attention's query/key group, whose heads then take a rotary
    embedding (its features read by position: the heads move whole, d = 4 features each)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.mix, self.head = nn.Linear(24, 8), nn.Linear(8, 3)
        self.register_buffer("cos", torch.linspace(-1, 1, 20).reshape(5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, 5 tokens, 4)
        h = self.proj(x)
        attended, q = self.attn(h, h, h)[0], self.a(h)  # the attention first: its group is the older one
        packed = torch.cat([q, self.b(h), self.c(h)], -1) + self.attn.in_proj_bias
        q = q.reshape(x.shape[0], 5, 2, 4).transpose(1, 2)
        q = q * self.cos[:5] + rotate_half(q) * self.cos[:5]
        return self.head(attended + q.transpose(1, 2).reshape(x.shape[0], 5, 8) + self.mix(packed))


def test_a_rotary_embedding_on_the_heads_of_multihead_attentions_group_moves_them_whole():
    torch.manual_seed(0)
    model, x = SharedBias().double().eval(), torch.randn(3, 5, 4, dtype=torch.float64)
    spec = trace_spec(model, x)
    qk = spec.axes["a.weight"][0][0].group  # in blocks of 4: heads moved whole
    assert spec.axes["attn.in_proj_weight"][0][0].group == qk and spec.heads[qk].count == 2
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(1), spec.heads)
    moved = apply_permutation(spec, perm, model.state_dict())
    with torch.no_grad():
        assert torch.allclose(torch.func.functional_call(model, moved, (x,)), model(x), atol=1e-12)
