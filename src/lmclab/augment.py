"""Training-time data augmentation on normalised image batches, drawn from a generator.

``crop_flip`` is the paper's CIFAR-10 augmentation (SPEC.md §6): a random 32×32 (H×W) crop of
the image zero-padded by 4 pixels on each side (zero = the training-set mean colour, since images
are already normalised) and a horizontal flip with probability ½. MNIST/FashionMNIST: ``none``.
All randomness comes from the ``generator`` passed in, so training stays deterministic per seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

AUGMENTATIONS = ("none", "crop_flip")
DEFAULT_FOR_DATA = {"cifar10": "crop_flip"}  # every other data set: none
PAD = 4


def resolve_augment(augment: str, data_name: str) -> str:
    """``auto`` -> the paper's choice for ``data_name``; otherwise checked and returned."""
    if augment == "auto":
        return DEFAULT_FOR_DATA.get(data_name, "none")
    if augment not in AUGMENTATIONS:
        raise ValueError(f"train.augment: expected auto or one of {AUGMENTATIONS}, got {augment!r}")
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
    raise ValueError(f"train.augment: expected one of {AUGMENTATIONS}, got {augment!r}")
