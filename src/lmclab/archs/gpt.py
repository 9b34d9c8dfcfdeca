"""A small decoder-only transformer (GPT-2 and Llama families), pre-norm, for next-token prediction.

Tokens (``num_classes`` of them: 256 for bytes) are embedded into ``width`` channels; ``position =
"learned"`` adds a learned table of ``context`` rows (``input_shape = (context,)``), ``"rotary"`` rotates
each head's queries and keys instead (GPT-NeoX's ``rotate_half``: features ``j`` and ``j + d/2`` of a
head turn by ``θ_j·t``, ``θ_j = 10000^(−2j/d)``). Each of ``depth`` blocks adds causal self-attention
(``norm1``; ``q`` of ``heads`` heads, ``k`` and ``v`` of ``kv_heads`` heads — fewer than ``heads`` is
grouped-query attention, query head ``h`` reading key/value head ``h // (heads/kv_heads)``; softmax of
``q kᵀ/√d`` with future positions masked; ``out``) and an MLP (``norm2``; ``GELU`` between ``fc1`` and
``fc2``, or SwiGLU: ``fc2(silu(gate(x)) · fc1(x))``) to the residual stream; a final norm and a linear
``head`` give the next token's logits at every position, ``(batch, context, num_classes)``. The norms are
LayerNorm or RMSNorm (``x / √(mean x² + ε) · weight``); ``tie_embeddings`` makes the head's weight the
embedding's (GPT-2, and the paper's question is then asked of one matrix in two places).

Permutation symmetries (:mod:`lmclab.core.heads`), the ones :mod:`lmclab.trace` derives (the tests check
that the two specs are equal): the residual stream ``P_res`` on every channel axis; per block ``P_mlp_k``
(the MLP's hidden units: the rows of ``fc1`` and ``gate``, the columns of ``fc2``) and the attention's
groups, one head order ``P_heads_k`` shared by
- with learned positions and ``kv_heads = heads``: ``P_qk_k`` (rows of ``q`` and ``k``) and ``P_vo_k``
  (rows of ``v``, columns of ``out``), each head's features free (τ_h) as in the ViT;
- with rotary positions: queries and keys move in whole heads (a feature moved inside a rotary head turns
  by another angle), as two tied groups ``P_q_k`` and ``P_k_k`` of ``H`` units of ``d`` rows each (one σ
  moves both); ``P_vo_k`` as above;
- with grouped queries: whole key/value heads, each taking its ``heads/kv_heads`` query heads along
  (``q``'s rows and ``out``'s columns in blocks of that many heads): ``P_q_k``, ``P_k_k`` and ``P_vo_k`` of
  ``kv_heads`` units each.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import BeforeValidator, model_validator
from torch import Tensor, nn

from lmclab.archs.base import ArchConfig, as_tuple
from lmclab.core.heads import Heads
from lmclab.core.options import Count, OptionError, one_of, option
from lmclab.core.spec import Entry, PermutationSpec, Segment, build_spec
from lmclab.core.spec_builders import dense, norm

INPUT = "tokens"  # reads windows of token ids (a text data set), not images
SHAPES = "data"  # built on its data's windows only (lmclab.archs.base.Interface)
STREAM = "P_res"
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")
MLPS = ("gelu", "swiglu")
ROTARY_BASE = 10000.0  # θ_j = base^(−2j/d) (Su et al. 2021; Llama, GPT-NeoX)
EPS = 1e-5  # the norms' ε (LayerNorm's default; Llama's RMSNorm uses 1e-5 or 1e-6)


class Config(ArchConfig):
    """``input_shape = (context,)``: tokens per window; ``num_classes``: the vocabulary; ``width`` a multiple
    of ``heads`` (unless ``head_dim`` sets the features per head), ``heads`` of ``kv_heads``; rotary heads have an
    even number of features."""

    input_shape: Annotated[tuple[Count], BeforeValidator(as_tuple)] = option(..., "(context,): tokens per window")
    width: Count = option(128, "channels of the residual stream (a multiple of heads)")
    depth: Count = option(4, "transformer blocks")
    heads: Count = option(4, "query heads per block")
    kv_heads: Count | None = option(None, "key/value heads per block (fewer: grouped-query attention; null: heads)")
    head_dim: Count | None = option(None, "features per head of q, k and v (null: width/heads; Llama's head_dim)")
    mlp_ratio: Count = option(4, "hidden units of each MLP per channel of the stream")
    norm: one_of(NORMS) = option("layernorm", "layernorm (GPT-2) or rmsnorm (Llama)")
    position: one_of(POSITIONS) = option("learned", "learned (a table of context rows, GPT-2) or rotary (Llama)")
    mlp: one_of(MLPS) = option("gelu", "gelu (GPT-2) or swiglu (Llama: fc2(silu(gate x) · fc1 x))")
    tie_embeddings: bool = option(True, "the head's weight is the token embedding's (GPT-2) or its own")

    @model_validator(mode="after")
    def _shapes_fit(self) -> Config:
        if self.head_dim is None and self.width % self.heads:
            raise OptionError(f"{{heads}}: {self.heads} heads do not divide the width {self.width}")
        if self.heads % self.groups:
            raise OptionError(f"{{kv_heads}}: {self.groups} key/value heads do not divide the {self.heads} heads")
        if self.position == "rotary" and self.head_size % 2:
            raise OptionError(f"{{position}}: rotary heads need an even size, got {self.head_size} features")
        return self

    @property
    def groups(self) -> int:
        """Key/value heads."""
        return self.kv_heads or self.heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.width // self.heads


def circuit_config(config: Config) -> Config:
    """The model of the circuit space (:mod:`lmclab.analysis.circuits`): heads of twice the features, to hold a
    pair's heads side by side. Learned positions only: a rotary head of ``2d`` features turns its planes by other
    angles than two heads of ``d``."""
    if config.position == "rotary":
        raise OptionError(
            "{circuits}: rotary heads have no circuit-space model (a head of twice the features turns its planes"
            " by other angles); use learned positions"
        )
    return config.model_copy(update={"head_dim": 2 * config.head_size})


def make_norm(config: Config) -> nn.Module:
    return nn.LayerNorm(config.width, eps=EPS) if config.norm == "layernorm" else nn.RMSNorm(config.width, eps=EPS)


def rotary_tables(context: int, d: int) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``θ_j·t`` (context, d), each angle written for feature ``j`` and ``j + d/2``."""
    theta = ROTARY_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(context, dtype=torch.float64)[:, None] * theta
    angles = torch.cat([angles, angles], dim=1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """Causal self-attention with ``heads`` query heads over ``kv_heads`` key/value heads."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        d, context = config.head_size, config.input_shape[0]
        self.heads, self.groups, self.rotary = config.heads, config.groups, config.position == "rotary"
        self.q, self.out = nn.Linear(config.width, config.heads * d), nn.Linear(config.heads * d, config.width)
        self.k, self.v = nn.Linear(config.width, self.groups * d), nn.Linear(config.width, self.groups * d)
        self.register_buffer("mask", torch.full((context, context), -math.inf).triu(1), persistent=False)
        if self.rotary:
            cos, sin = rotary_tables(context, d)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (batch, tokens, width)
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.heads, -1).transpose(1, 2)
        k, v = (f(x).reshape(b, t, self.groups, -1).transpose(1, 2) for f in (self.k, self.v))
        if self.rotary:
            cos, sin = self.cos[:t], self.sin[:t]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.groups != self.heads:  # each key/value head repeated for its query heads (Llama's repeat_kv)
            k, v = (self._repeat(z) for z in (k, v))
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.mask[:t, :t]
        return self.out((torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(b, t, -1))

    def _repeat(self, z: Tensor) -> Tensor:
        b, g, t, d = z.shape
        return z[:, :, None, :, :].expand(b, g, self.heads // g, t, d).reshape(b, self.heads, t, d)


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.width
        self.norm1, self.norm2 = make_norm(config), make_norm(config)
        self.attn = Attention(config)
        self.swiglu = config.mlp == "swiglu"
        self.fc1 = nn.Linear(config.width, hidden)
        if self.swiglu:
            self.gate = nn.Linear(config.width, hidden)
        self.act = nn.SiLU() if self.swiglu else nn.GELU()
        self.fc2 = nn.Linear(hidden, config.width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.fc2(self.act(self.gate(h)) * self.fc1(h) if self.swiglu else self.act(self.fc1(h)))


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.num_classes, config.width)
        nn.init.normal_(self.embed.weight, std=0.02)
        if config.position == "learned":
            self.pos_embed = nn.Embedding(config.input_shape[0], config.width)
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = make_norm(config)
        self.head = nn.Linear(config.width, config.num_classes, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:  # tokens: (batch, t ≤ context) → logits (batch, t, vocabulary)
        x = self.embed(tokens)
        if hasattr(self, "pos_embed"):
            x = x + self.pos_embed(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def block_spec(config: Config, k: int) -> dict:
    """Block ``k``'s entries: the stream on its channel axes, its attention's and MLP's groups."""
    name, (q, k_, vo), mlp = f"blocks.{k}", attention_groups(config, k), f"P_mlp_{k}"
    entries = {
        **_norm(config, f"{name}.norm1"),
        **_norm(config, f"{name}.norm2"),
        **dense(f"{name}.attn.q", _rows(config, q, config.heads, rigid_qk(config)), STREAM),
        **dense(f"{name}.attn.k", _rows(config, k_, config.groups, rigid_qk(config)), STREAM),
        **dense(f"{name}.attn.v", _rows(config, vo, config.groups, grouped(config)), STREAM),
        **dense(f"{name}.attn.out", STREAM, _rows(config, vo, config.heads, grouped(config))),
        **dense(f"{name}.fc1", mlp, STREAM),
        **dense(f"{name}.fc2", STREAM, mlp),
    }
    return entries | (dense(f"{name}.gate", mlp, STREAM) if config.mlp == "swiglu" else {})


def grouped(config: Config) -> bool:
    """Grouped-query attention: fewer key/value heads than query heads."""
    return config.groups != config.heads


def rigid_qk(config: Config) -> bool:
    """Whether queries and keys move in whole heads (rotary positions, or grouped queries)."""
    return config.position == "rotary" or grouped(config)


def attention_groups(config: Config, k: int) -> tuple[str, str, str]:
    """Block ``k``'s groups of queries, keys and values: one ``P_qk_k`` for queries and keys sharing each
    head's τ, else ``P_q_k`` and ``P_k_k`` of whole heads (tied, so one σ moves both)."""
    q, key = (f"P_qk_{k}", f"P_qk_{k}") if not rigid_qk(config) else (f"P_q_{k}", f"P_k_{k}")
    return q, key, f"P_vo_{k}"


def _norm(config: Config, name: str) -> dict:
    """A norm over the stream: its weight, and LayerNorm's bias."""
    return norm(name, STREAM, running_stats=False) if config.norm == "layernorm" else {f"{name}.weight": (STREAM,)}


def _rows(config: Config, group: str, count: int, rigid: bool) -> Entry:
    """The axis entry of ``count`` heads' features: the group itself while each head's features are free,
    else whole heads — key/value heads as units, ``count/kv_heads`` heads per unit (module docstring)."""
    if not rigid:
        return group
    per_unit = count // config.groups if grouped(config) else 1
    return (Segment(group, count * config.head_size, block=per_unit * config.head_size),)


def head_groups(config: Config) -> dict[str, Heads]:
    """Per block the attention's groups are headed, one head order ``P_heads_k``: ``heads`` heads of free
    features, or whole heads of one unit each (``kv_heads`` of them with grouped queries)."""
    out = {}
    for k in range(config.depth):
        for g in dict.fromkeys(attention_groups(config, k)):
            out[g] = Heads(config.groups, f"P_heads_{k}")
    return out


def permutation_spec(config: Config) -> PermutationSpec:
    """The stream on every channel axis; per block the tied attention groups and the MLP's hidden group."""
    parts = [{"embed.weight": (None, STREAM)}]
    if config.position == "learned":
        parts.append({"pos_embed.weight": (None, STREAM)})
    parts += [block_spec(config, k) for k in range(config.depth)]
    parts.append(_norm(config, "norm"))
    parts.append({"head.weight": (None, STREAM)})
    return build_spec(*parts, heads=head_groups(config))


def activation_points(config: Config) -> dict[str, list[str]]:
    """Units on the last axis (``@-1``): the stream at every norm's output; queries and keys for ``P_qk_k``
    (or ``P_q_k`` and ``P_k_k``) and values for ``P_vo_k``, whole heads in runs of their features (``:run``,
    one unit per key/value head: :func:`_rows`); the MLP's hidden units at ``fc1`` (and SwiGLU's ``gate``)."""
    names = [f"blocks.{k}" for k in range(config.depth)]
    points = {STREAM: [f"{b}.norm{i}@-1" for b in names for i in (1, 2)] + ["norm@-1"]}
    for k, b in enumerate(names):
        q, key, vo = attention_groups(config, k)
        qk = [(q, "q", config.heads), (key, "k", config.groups)]
        for group, part, count in qk + [(vo, "v", config.groups)]:
            rows = _rows(config, group, count, rigid_qk(config) if part != "v" else grouped(config))
            run = "" if isinstance(rows, str) else f":{rows[0].block}"
            points.setdefault(group, []).append(f"{b}.attn.{part}@-1{run}")
        points[f"P_mlp_{k}"] = ([f"{b}.gate@-1"] if config.mlp == "swiglu" else []) + [f"{b}.fc1@-1"]
    return points
