"""A reference for the MAE tests: the MAE loss of a parameter set over many images, batch by batch, each batch
weighted by its masked patches (what the library's loss-evaluating code must reproduce)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call


@torch.no_grad()
def reconstruction_loss(
    model: nn.Module, params: Mapping[str, Tensor], images: Tensor, masks: Tensor, *, batch_size: int = 256
) -> float:
    """The mean squared error over every masked patch of ``images`` (n, C, H, W) under ``masks`` (n, patches)."""
    total, count = 0.0, 0
    for start in range(0, images.shape[0], batch_size):
        x, mask = images[start : start + batch_size], masks[start : start + batch_size]
        masked = int(mask.sum())
        total += float(functional_call(model, dict(params), (x, mask))) * masked
        count += masked
    return total / count
