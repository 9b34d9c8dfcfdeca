"""The ``model`` block of params.yaml (``lmclab.pipeline.schema``): the architecture and each one's own block,
``model.<arch>``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from lmclab.archs import ARCHS
from lmclab.archs.vit import POOLS as VIT_POOLS
from lmclab.archs.vit import POSITIONS as VIT_POSITIONS
from lmclab.core.options import Count, Positive, one_of
from lmclab.pipeline.block import Block, key


class Mlp(Block):
    hidden: Count = key(3, "hidden layers (paper: 3)")
    width: Count = key(512, "units per hidden layer (paper: 512)")


class Vgg(Block):
    layers: Annotated[list[Count | Literal["M"]], Field(min_length=1)] = key(
        [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
        "conv 3×3 + BatchNorm + ReLU per channel count, M = 2×2 max-pool (VGG11)",
    )
    width_multiplier: Positive = key(4, "multiplies every channel count (paper: 4)")


class Resnet20(Block):
    width_multiplier: Positive = key(16, "multiplies the 16/32/64 channels of the three stages (paper: 16)")
    blocks: Count = key(3, "basic blocks per stage (3 = ResNet20)")


class Resnet50(Block):
    width_multiplier: Positive = key(1, "multiplies the inner width of every bottleneck (1 = standard)")


class Mixer(Block):
    patch_size: Count = key(
        7, "mixer: side of the square patches (must divide the image: 7 → 16 tokens of a 28-pixel digit)"
    )
    hidden: Count = key(64, "mixer: channels of the residual stream")
    token_mlp: Count = key(32, "mixer: hidden units of each token-mixing MLP")
    channel_mlp: Count = key(128, "mixer: hidden units of each channel-mixing MLP")
    depth: Count = key(2, "mixer: blocks")


class Vit(Block):
    patch_size: Count = key(
        4, "vit: side of the square patches (must divide the image: 4 → 49 tokens of a 28-pixel digit)"
    )
    width: Count = key(64, "vit: channels of the residual stream (a multiple of heads; of 4 with sincos)")
    depth: Count = key(4, "vit: transformer blocks")
    heads: Count = key(4, "vit: attention heads per block")
    mlp_ratio: Count = key(2, "vit: hidden units of each MLP per channel of the stream")
    pool: one_of(VIT_POOLS) = key("cls", "vit: cls (a learned class token) or mean (the mean over tokens)")
    position: one_of(VIT_POSITIONS) = key(
        "learned", "vit: position embedding, learned or sincos (MAE's fixed 2-D sine-cosine table)"
    )


class Traced(Block):
    factory: str = key(
        "torchvision.models:resnet18",
        "traced: module:callable building the nn.Module (spec derived by torch.fx tracing, src/lmclab/trace/)",
    )
    kwargs: dict[str, int | float | str | bool | None] = key(
        {},
        "traced: keyword arguments of the factory (num_classes is added when it takes it)",
        json_schema_extra={"expected": "a mapping of names to numbers, strings, booleans or null"},
    )
    in_channels: Count | None = key(
        3, "traced: input channels the network expects; the data's are repeated (null: the data's own)"
    )
    partial: bool = key(False, "traced: leave what tracing cannot prove unpermuted instead of refusing")


MODEL_ARCHS = [a for a in ARCHS if a != "mae"]  # an MAE is reached by train.objective: mae


class Model(Block):
    arch: one_of(MODEL_ARCHS) = key("mlp", "architecture (registry: src/lmclab/archs); its block model.<arch> is used")
    mlp: Mlp
    vgg: Vgg
    resnet20: Resnet20
    resnet50: Resnet50
    traced: Traced
    mixer: Mixer
    vit: Vit
