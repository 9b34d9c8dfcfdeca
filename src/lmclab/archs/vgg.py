"""VGG with BatchNorm for CIFAR-10 (the paper's settings: VGG11, width ×4).

``layers`` is the layer list (channel counts at width ×1, ``"M"`` = 2×2 max-pool), so VGG13/16
are one line of config; every channel count is multiplied by ``width_multiplier``. Each conv
layer ℓ (conv 3×3 → BN → ReLU) carries group ``P_ℓ``; the linear read-out after global average
pooling reads the last group. 28-pixel inputs are zero-padded to 32 (in normalised units) so
the five pools of VGG11 fit.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from pydantic import model_validator
from torch import Tensor, nn

from lmclab.archs.base import ArchConfig, tuple_of
from lmclab.core.options import Count, OptionError, Positive, got, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import conv_bn, dense

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
VGG13 = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class Config(ArchConfig):
    """``input_shape`` (C, H, W) with H and W from 28 to 32 (the forward pads them to 32); paper: VGG11,
    ``width_multiplier`` 4."""

    layers: tuple_of(Count | Literal["M"]) = option(
        VGG11, "conv 3×3 + BatchNorm + ReLU per channel count, M = 2×2 max-pool (VGG11)"
    )
    width_multiplier: Positive = option(1.0, "multiplies every channel count (paper: 4)")

    @model_validator(mode="after")
    def _fits(self) -> Config:
        if not any(isinstance(c, int) for c in self.layers):
            raise OptionError(f"{{layers}}: expected at least one channel count, got {got(list(self.layers))}")
        if max(self.input_shape[1:]) > 32 or min(self.input_shape[1:]) < 28:
            raise OptionError(
                f"{{input_shape}}: vgg takes images of 28 to 32 pixels a side (padded to 32), "
                f"got {got(self.input_shape)}"
            )
        if 32 >> self.layers.count("M") < 1:
            raise OptionError(f"{{layers}}: {self.layers.count('M')} max-pools do not fit 32 pixels")
        return self

    def channels(self) -> list[int]:
        """Output channels of each conv layer at this width."""
        return [max(1, round(c * self.width_multiplier)) for c in self.layers if c != "M"]


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        c_in = config.input_shape[0]
        widths = iter(config.channels())
        for item in config.layers:
            if item == "M":
                modules.append(nn.MaxPool2d(2))
                continue
            c_out = next(widths)
            modules += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
            c_in = c_out
        self.features = nn.Sequential(*modules)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        pad_h, pad_w = 32 - x.shape[2], 32 - x.shape[3]
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))  # (B, C, 32, 32)
        return self.fc(self.pool(self.features(x)).flatten(1))


def group(layer: int) -> str:
    return f"P_{layer}"


def _conv_indices(config: Config) -> list[int]:
    """Index in ``features`` of each conv module (conv, BN, ReLU take three slots, pools one)."""
    out, at = [], 0
    for item in config.layers:
        if item == "M":
            at += 1
        else:
            out.append(at)
            at += 3
    return out


def permutation_spec(config: Config) -> PermutationSpec:
    """Conv ℓ: kernel ``(P_ℓ, P_{ℓ-1}, ·, ·)``, BN ℓ over ``P_ℓ``; read-out ``(·, P_last)``."""
    idx = _conv_indices(config)
    parts = [
        conv_bn(f"features.{i}", f"features.{i + 1}", group(k), group(k - 1) if k else None) for k, i in enumerate(idx)
    ]
    parts.append(dense("fc", None, group(len(idx) - 1)))
    return build_spec(*parts)


def activation_points(config: Config) -> dict[str, list[str]]:
    """Each conv layer's ReLU output carries its group."""
    return {group(k): [f"features.{i + 2}"] for k, i in enumerate(_conv_indices(config))}
