"""MLP-Mixer (Tolstikhin et al. 2021), small enough for the offline digits.

Patches of ``patch_size`` pixels are embedded into ``hidden`` channels (a strided conv), giving
``(batch, tokens, hidden)``. Each of ``depth`` blocks adds a token-mixing MLP (LayerNorm over channels,
then ``Linear(tokens → token_mlp) → GELU → Linear(token_mlp → tokens)`` along the token axis) and a
channel-mixing MLP (LayerNorm, ``Linear(hidden → channel_mlp) → GELU → Linear(channel_mlp → hidden)``)
to the residual stream; a final LayerNorm, the mean over tokens and a linear head give the logits.

Permutation symmetries: one residual-stream group ``P_stream`` over the ``hidden`` channels, shared by
the embedding, every LayerNorm, every channel MLP's input and output and the head's input; per block a
token-hidden group ``P_token_k`` (the token MLP's hidden units; it acts along the token axis, the same for
every channel) and a channel-hidden group ``P_channel_k``. The token axis itself is never permuted (the
patches have positions). :func:`lmclab.trace.trace_spec` derives the same spec from the graph (the
tests check it equal to :func:`permutation_spec`).
"""

from __future__ import annotations

from pydantic import model_validator
from torch import Tensor, nn

from lmclab.archs.base import ArchConfig, check_patches_tile
from lmclab.core.options import Count, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import dense, norm

STREAM = "P_stream"
SHAPES = "data"  # its patches must tile the data's own image (lmclab.archs.base.Interface)


class Config(ArchConfig):
    """``input_shape`` (C, H, W) with H and W multiples of ``patch_size``."""

    patch_size: Count = option(
        7, "side of the square patches (must divide the image: 7 → 16 tokens of a 28-pixel digit)"
    )
    hidden: Count = option(64, "channels of the residual stream")
    token_mlp: Count = option(32, "hidden units of each token-mixing MLP")
    channel_mlp: Count = option(128, "hidden units of each channel-mixing MLP")
    depth: Count = option(2, "blocks")

    @model_validator(mode="after")
    def _patches_tile(self) -> Config:
        check_patches_tile(self.input_shape, self.patch_size)
        return self

    @property
    def tokens(self) -> int:
        return (self.input_shape[1] // self.patch_size) * (self.input_shape[2] // self.patch_size)


class MixerBlock(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(config.hidden), nn.LayerNorm(config.hidden)
        self.token_fc1 = nn.Linear(config.tokens, config.token_mlp)
        self.token_fc2 = nn.Linear(config.token_mlp, config.tokens)
        self.channel_fc1 = nn.Linear(config.hidden, config.channel_mlp)
        self.channel_fc2 = nn.Linear(config.channel_mlp, config.hidden)
        self.token_act, self.channel_act = nn.GELU(), nn.GELU()

    def forward(self, x: Tensor) -> Tensor:  # x: (batch, tokens, hidden)
        y = self.token_act(self.token_fc1(self.norm1(x).transpose(1, 2)))  # (batch, hidden, token_mlp)
        x = x + self.token_fc2(y).transpose(1, 2)
        return x + self.channel_fc2(self.channel_act(self.channel_fc1(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        p = config.patch_size
        self.embed = nn.Conv2d(config.input_shape[0], config.hidden, p, stride=p)
        self.blocks = nn.ModuleList(MixerBlock(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)  # (batch, tokens, hidden)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


def permutation_spec(config: Config) -> PermutationSpec:
    """The stream on every channel axis; per block its token-hidden and channel-hidden groups."""
    parts = [{"embed.weight": (STREAM, None, None, None), "embed.bias": (STREAM,)}]
    for k in range(config.depth):
        b = f"blocks.{k}"
        parts += [
            norm(f"{b}.norm1", STREAM, running_stats=False),
            norm(f"{b}.norm2", STREAM, running_stats=False),
            dense(f"{b}.token_fc1", f"P_token_{k}", None),
            dense(f"{b}.token_fc2", None, f"P_token_{k}"),
            dense(f"{b}.channel_fc1", f"P_channel_{k}", STREAM),
            dense(f"{b}.channel_fc2", STREAM, f"P_channel_{k}"),
        ]
    parts += [norm("norm", STREAM, running_stats=False), dense("head", None, STREAM)]
    return build_spec(*parts)


def activation_points(config: Config) -> dict[str, list[str]]:
    """Units on the last axis (``@-1``): the stream at every channel-mixing LayerNorm and the final one
    (each normalises the stream per token, like BatchNorm after a conv), the hidden groups at their GELUs."""
    points: dict[str, list[str]] = {STREAM: [f"blocks.{k}.norm2@-1" for k in range(config.depth)] + ["norm@-1"]}
    for k in range(config.depth):
        points[f"P_token_{k}"] = [f"blocks.{k}.token_act@-1"]
        points[f"P_channel_{k}"] = [f"blocks.{k}.channel_act@-1"]
    return points
