"""Multi-layer perceptron of the paper's MNIST/FashionMNIST experiments (the paper's settings).

``z_ℓ = ReLU(W_ℓ z_{ℓ-1} + b_ℓ)`` for ``hidden`` layers of ``width`` units, then a linear
read-out. Hidden layer ℓ carries permutation group ``P_ℓ``; inputs and logits are fixed.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from lmclab.archs.base import ArchConfig
from lmclab.core.options import Count, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import dense


class Config(ArchConfig):
    """``input_shape`` is (channels, height, width) of one image; paper: 3 hidden × 512."""

    hidden: Count = option(3, "hidden layers (paper: 3)")
    width: Count = option(512, "units per hidden layer (paper: 512)")


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        sizes = [math.prod(config.input_shape)] + [config.width] * config.hidden
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:], strict=True))
        self.acts = nn.ModuleList(nn.ReLU() for _ in range(config.hidden))
        self.out = nn.Linear(sizes[-1], config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        z = x.flatten(1)  # (batch, C·H·W)
        for layer, act in zip(self.layers, self.acts, strict=True):
            z = act(layer(z))
        return self.out(z)


def group(layer: int) -> str:
    return f"P_{layer}"


def permutation_spec(config: Config) -> PermutationSpec:
    """Layer ℓ: ``W_ℓ → P_ℓ W_ℓ P_{ℓ-1}ᵀ``, ``b_ℓ → P_ℓ b_ℓ``."""
    parts = [dense(f"layers.{i}", group(i), group(i - 1) if i else None) for i in range(config.hidden)]
    parts.append(dense("out", None, group(config.hidden - 1)))
    return build_spec(*parts)


def activation_points(config: Config) -> dict[str, list[str]]:
    """For activation matching: the modules whose outputs are the units of each group."""
    return {group(i): [f"acts.{i}"] for i in range(config.hidden)}
