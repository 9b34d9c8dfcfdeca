"""Multi-layer perceptron of the paper's MNIST/FashionMNIST experiments (the paper's settings).

``z_ℓ = ReLU(W_ℓ z_{ℓ-1} + b_ℓ)`` for ``hidden`` layers of ``width`` units, then a linear
read-out. Hidden layer ℓ carries permutation group ``P_ℓ``; inputs and logits are fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from lmclab.core.spec import PermutationSpec, build_spec, dense


@dataclass(frozen=True)
class Config:
    """``input_shape`` is (channels, height, width) of one image; paper: 3 hidden × 512."""

    input_shape: tuple[int, int, int]
    num_classes: int
    hidden: int = 3
    width: int = 512

    def __post_init__(self) -> None:
        if self.hidden < 1:
            raise ValueError(f"model.mlp.hidden must be a positive number of layers, got {self.hidden}")
        if self.width < 1:
            raise ValueError(f"model.mlp.width must be a positive number of units, got {self.width}")


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
