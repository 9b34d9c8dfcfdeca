"""Vision Transformer (Dosovitskiy et al. 2021), pre-LN, small enough for the offline digits.

Patches of ``patch_size`` pixels are embedded into ``width`` channels (a strided conv), giving
``(batch, tokens, width)``; with ``pool = "cls"`` a learned class token is prepended. A position
embedding is added: ``"learned"`` (a parameter) or ``"sincos"`` (the fixed 2-D sine-cosine table of
MAE, a buffer kept in the ``state_dict`` so that a permuted model carries its permuted table). Each of
``depth`` blocks adds multi-head self-attention (LayerNorm, separate ``q``/``k``/``v`` Linears of
``heads`` heads, softmax(q kᵀ/√d) v, an output Linear) and an MLP (LayerNorm, ``Linear(width →
mlp_ratio·width) → GELU → Linear``) to the residual stream; a final LayerNorm, the class token (or the
mean over tokens) and a linear head give the logits.

Permutation symmetries (:mod:`lmclab.core.heads`): one residual-stream group ``P_res`` on every
channel axis (embedding, class token, position embedding, every LayerNorm, the inputs of q/k/v and
fc1, the outputs of the attention's ``out`` and of fc2, the head's input); per block the headed groups
``P_qk_k`` (rows of W_Q and W_K) and ``P_vo_k`` (rows of W_V, columns of W_O), tied by one head order
``P_heads_k``, and the MLP's hidden group ``P_mlp_k``.
"""

from __future__ import annotations

import math

import torch
from pydantic import model_validator
from torch import Tensor, nn

from lmclab.archs.base import ArchConfig, check_patches_tile
from lmclab.core.heads import Heads
from lmclab.core.options import Count, OptionError, one_of, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import dense, norm

STREAM = "P_res"
SHAPES = "data"  # its patches must tile the data's own image (lmclab.archs.base.Interface)
POOLS = ("cls", "mean")
POSITIONS = ("learned", "sincos")


class Config(ArchConfig):
    """``input_shape`` (C, H, W) with H and W multiples of ``patch_size``; ``width`` a multiple of ``heads``
    (unless ``head_dim`` sets the features per head)."""

    patch_size: Count = option(
        4, "side of the square patches (must divide the image: 4 → 49 tokens of a 28-pixel digit)"
    )
    width: Count = option(64, "channels of the residual stream (a multiple of heads; of 4 with sincos)")
    depth: Count = option(4, "transformer blocks")
    heads: Count = option(4, "attention heads per block")
    head_dim: Count | None = option(None, "features per head of q, k and v (null: width/heads)")
    mlp_ratio: Count = option(2, "hidden units of each MLP per channel of the stream")
    pool: one_of(POOLS) = option("cls", "cls (a learned class token) or mean (the mean over tokens)")
    position: one_of(POSITIONS) = option(
        "learned", "position embedding, learned or sincos (MAE's fixed 2-D sine-cosine table)"
    )

    @model_validator(mode="after")
    def _shapes_fit(self) -> Config:
        if self.head_dim is None and self.width % self.heads:
            raise OptionError(f"{{heads}}: {self.heads} heads do not divide the width {self.width}")
        if self.position == "sincos" and self.width % 4:
            raise OptionError(f"{{width}}: a sin-cos position embedding needs a multiple of 4, got {self.width}")
        check_patches_tile(self.input_shape, self.patch_size)
        return self

    @property
    def head_size(self) -> int:
        return self.head_dim or self.width // self.heads

    @property
    def grid(self) -> tuple[int, int]:
        return self.input_shape[1] // self.patch_size, self.input_shape[2] // self.patch_size

    @property
    def tokens(self) -> int:
        """Sequence length: the patches, plus the class token with ``pool = "cls"``."""
        return self.grid[0] * self.grid[1] + (self.pool == "cls")


def sincos_table(width: int, grid: tuple[int, int], cls: bool) -> Tensor:
    """The fixed 2-D sine-cosine position embedding (MAE): half the channels encode the row, half the
    column, each as sin/cos at ``width/4`` frequencies; the class token's row is zero. (1, tokens, width)."""
    if width % 4:
        raise OptionError(f"{{width}}: a sin-cos position embedding needs a multiple of 4, got {width}")
    omega = 1.0 / 10000 ** (torch.arange(width // 4, dtype=torch.float64) / (width / 4))
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    parts = [f(pos.reshape(-1, 1).double() * omega) for pos in (rows, cols) for f in (torch.sin, torch.cos)]
    table = torch.cat(parts, dim=1)
    if cls:
        table = torch.cat([torch.zeros(1, width, dtype=torch.float64), table])
    return table[None].float()


class Attention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` (``heads`` heads of ``head_dim`` features
    each; None: ``width/heads``) and ``out`` Linears."""

    def __init__(self, width: int, heads: int, head_dim: int | None = None) -> None:
        super().__init__()
        self.heads, inner = heads, heads * (head_dim or width // heads)
        self.q, self.k, self.v = (nn.Linear(width, inner) for _ in range(3))
        self.out = nn.Linear(inner, width)

    def forward(self, x: Tensor) -> Tensor:  # x: (batch, tokens, width)
        b, t, _ = x.shape
        q, k, v = (f(x).reshape(b, t, self.heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.attn = Attention(config.width, config.heads, config.head_size)
        self.fc1 = nn.Linear(config.width, config.mlp_ratio * config.width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.mlp_ratio * config.width, config.width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.pool = config.pool
        self.embed = nn.Conv2d(config.input_shape[0], config.width, config.patch_size, stride=config.patch_size)
        if config.pool == "cls":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, config.width))
        if config.position == "learned":
            self.pos_embed = nn.Parameter(0.02 * torch.randn(1, config.tokens, config.width))
        else:
            self.register_buffer("pos_embed", sincos_table(config.width, config.grid, config.pool == "cls"))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.num_classes)

    def tokens(self, x: Tensor) -> Tensor:
        """The embedded patches (with the class token first) plus the position embedding."""
        x = self.embed(x).flatten(2).transpose(1, 2)  # (batch, patches, width)
        if self.pool == "cls":
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.pos_embed

    def forward(self, x: Tensor) -> Tensor:
        x = self.tokens(x)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(1))


def circuit_config(config: Config) -> Config:
    """The model of the circuit space (:mod:`lmclab.analysis.circuits`): heads of twice the features, to hold a
    pair's heads side by side."""
    return config.model_copy(update={"head_dim": 2 * config.head_size})


def block_spec(name: str, k: int, stream: str = STREAM, prefix: str = "P") -> dict:
    """One block's entries: the ``stream`` on its channel axes, its headed and MLP groups
    (``{prefix}_qk_k``, ``{prefix}_vo_k``, ``{prefix}_mlp_k``; another ``prefix`` for a second stack)."""
    qk, vo, mlp = f"{prefix}_qk_{k}", f"{prefix}_vo_{k}", f"{prefix}_mlp_{k}"
    return {
        **norm(f"{name}.norm1", stream, running_stats=False),
        **norm(f"{name}.norm2", stream, running_stats=False),
        **dense(f"{name}.attn.q", qk, stream),
        **dense(f"{name}.attn.k", qk, stream),
        **dense(f"{name}.attn.v", vo, stream),
        **dense(f"{name}.attn.out", stream, vo),
        **dense(f"{name}.fc1", mlp, stream),
        **dense(f"{name}.fc2", stream, mlp),
    }


def head_groups(depth: int, heads: int, prefix: str = "P") -> dict[str, Heads]:
    """Per block, ``P_qk_k`` and ``P_vo_k`` are headed and share the head order ``P_heads_k``."""
    return {f"{prefix}_{kind}_{k}": Heads(heads, f"{prefix}_heads_{k}") for k in range(depth) for kind in ("qk", "vo")}


def permutation_spec(config: Config) -> PermutationSpec:
    """The stream on every channel axis; per block the tied headed groups and the MLP's hidden group."""
    parts = [{"embed.weight": (STREAM, None, None, None), "embed.bias": (STREAM,), "pos_embed": (None, None, STREAM)}]
    if config.pool == "cls":
        parts.append({"cls_token": (None, None, STREAM)})
    parts += [block_spec(f"blocks.{k}", k) for k in range(config.depth)]
    parts += [norm("norm", STREAM, running_stats=False), dense("head", None, STREAM)]
    return build_spec(*parts, heads=head_groups(config.depth, config.heads))


def activation_points(config: Config) -> dict[str, list[str]]:
    """Units on the last axis (``@-1``): the stream at every LayerNorm's output (each normalises the
    stream per token), queries and keys together for ``P_qk_k``, values for ``P_vo_k``, the MLP's GELU."""
    return stack_points("blocks", "norm", config.depth)


def stack_points(blocks: str, final_norm: str, depth: int, stream: str = STREAM, prefix: str = "P") -> dict:
    """:func:`activation_points` of a stack of ``depth`` blocks under ``blocks`` with its final LayerNorm."""
    names = [f"{blocks}.{k}" for k in range(depth)]
    points = {stream: [f"{b}.norm{i}@-1" for b in names for i in (1, 2)] + [f"{final_norm}@-1"]}
    for k, b in enumerate(names):
        points[f"{prefix}_qk_{k}"] = [f"{b}.attn.q@-1", f"{b}.attn.k@-1"]
        points[f"{prefix}_vo_{k}"] = [f"{b}.attn.v@-1"]
        points[f"{prefix}_mlp_{k}"] = [f"{b}.act@-1"]
    return points
