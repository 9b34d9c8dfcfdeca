"""Training-time data augmentation on normalised image batches, drawn from a generator.

``crop_flip`` is the paper's CIFAR-10 augmentation (the paper's settings): a random 32×32 (H×W) crop of
the image zero-padded by 4 pixels on each side (zero = the training-set mean colour, since images
are already normalised) and a horizontal flip with probability ½. MNIST/FashionMNIST: ``none``.
All randomness comes from the ``generator`` passed in, so training stays deterministic per seed.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lmclab.core.options import OptionError, got

AUGMENTATIONS = ("none", "crop_flip")
DEFAULT_FOR_DATA = {"cifar10": "crop_flip"}  # every other data set: none
PAD = 4
MIXUP_STREAM = 2**33  # the mixup draws are seeded with seed + this: a stream of their own


def resolve_augment(augment: str, data_name: str) -> str:
    """``auto`` -> the paper's choice for ``data_name``; otherwise checked and returned."""
    if augment == "auto":
        return DEFAULT_FOR_DATA.get(data_name, "none")
    if augment not in AUGMENTATIONS:
        raise OptionError(f"{{augment}}: expected auto or one of {got(AUGMENTATIONS)}, got {got(augment)}")
    return augment


def crop_flip(x: Tensor, generator: torch.Generator, pad: int = PAD) -> Tensor:
    """Random crop of the ``pad``-padded batch back to its size, and random horizontal flip."""
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))  # (n, c, h + 2 pad, w + 2 pad)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(x.device)
    flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
    rows = dy[:, None] + torch.arange(h, device=x.device)  # (n, h)
    cols = torch.arange(w, device=x.device).expand(n, w)
    cols = dx[:, None] + torch.where(flip[:, None], w - 1 - cols, cols)  # (n, w)
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def augment_batch(x: Tensor, augment: str, generator: torch.Generator) -> Tensor:
    if augment == "none":
        return x
    if augment == "crop_flip":
        return crop_flip(x, generator)
    raise OptionError(f"{{augment}}: expected one of {got(AUGMENTATIONS)}, got {got(augment)}")


class Mixup:
    """Mixup (Zhang et al. 2018): each batch becomes ``λ x + (1 − λ) x[partner]`` with ``λ ~ Beta(α, α)``
    and the one-hot targets mixed alike — trained as ``λ CE(y) + (1 − λ) CE(y[partner])``, the same loss.
    Drawn from ``seed`` alone (its own stream), so training stays deterministic per seed."""

    def __init__(self, mixup_alpha: float, seed: int) -> None:
        if mixup_alpha <= 0:
            raise OptionError(f"{{mixup_alpha}} must be positive to mix (0 = off), got {mixup_alpha}")
        self.alpha = mixup_alpha
        self.rng = np.random.default_rng(seed + MIXUP_STREAM)
        self.generator = torch.Generator().manual_seed(seed + MIXUP_STREAM)

    def mix(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float]:
        """The mixed batch, the partners' labels and ``λ``."""
        lam = float(self.rng.beta(self.alpha, self.alpha))
        partner = torch.randperm(len(x), generator=self.generator).to(x.device)
        return lam * x + (1 - lam) * x[partner], y[partner], lam
