"""Random patch masks, patchify/unpatchify and the masked reconstruction loss of MAE (He et al. 2022, §3).

A *mask* is a bool tensor ``(n, patches)``, ``True`` where a patch is removed (hidden from the encoder
and reconstructed by the decoder). Patches are numbered row-major over the ``grid`` of the image, the
order of a strided conv's ``flatten(2)``; a patch's pixels are flattened as ``(row, column, channel)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_count(patches: int, mask_ratio: float) -> int:
    """``round(mask_ratio · patches)``, the patches masked per sample; one is kept visible and one masked."""
    count = round(mask_ratio * patches)
    if not 0 < count < patches:
        raise ValueError(
            f"mask_ratio: {mask_ratio} masks {count} of {patches} patches; at least one must be masked and one visible"
        )
    return count


def random_masks(n: int, patches: int, mask_ratio: float, generator: torch.Generator) -> Tensor:
    """``n`` independent uniform masks with exactly ``round(mask_ratio · patches)`` patches masked each
    (MAE's per-sample shuffle: mask the first ones of a random order), drawn from ``generator`` only. (n, patches)."""
    count = masked_count(patches, mask_ratio)
    order = torch.argsort(torch.rand(n, patches, generator=generator, dtype=torch.float64), dim=1)
    mask = torch.zeros(n, patches, dtype=torch.bool)
    return mask.scatter(1, order[:, :count], True)


def visible_indices(mask: Tensor) -> Tensor:
    """The indices of the visible patches of each row of ``mask``, in increasing order. (n, visible)."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask: expected a bool tensor (n, patches), got {mask.dtype} of shape {tuple(mask.shape)}")
    counts = mask.sum(1)
    if mask.shape[0] and not bool((counts == counts[0]).all()):
        raise ValueError(f"mask: every sample must mask the same number of patches, got {sorted(set(counts.tolist()))}")
    visible = mask.shape[1] - (int(counts[0]) if mask.shape[0] else 0)
    return torch.argsort(mask.to(torch.uint8), dim=1, stable=True)[:, :visible]


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """``(n, C, H, W)`` → ``(n, patches, p·p·C)``, patches row-major, pixels as (row, column, channel)."""
    n, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"patch_size: {p} does not divide the image {h} × {w}")
    x = images.reshape(n, c, h // p, p, w // p, p)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(n, (h // p) * (w // p), p * p * c)


def unpatchify(patches: Tensor, patch_size: int, image_shape: tuple[int, int, int]) -> Tensor:
    """The inverse of :func:`patchify`: ``(n, patches, p·p·C)`` → ``(n, C, H, W)`` for ``image_shape`` (C, H, W)."""
    c, h, w = image_shape
    p = patch_size
    if patches.shape[1:] != ((h // p) * (w // p), p * p * c):
        raise ValueError(f"patches: shape {tuple(patches.shape)} is not that of {image_shape} in {p}-pixel patches")
    x = patches.reshape(-1, h // p, w // p, p, p, c)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(-1, c, h, w)


def pixel_targets(images: Tensor, patch_size: int, norm_pix: bool) -> Tensor:
    """The reconstruction targets: the patches' pixels, each patch normalised by its own mean and
    (unbiased) variance with ``norm_pix`` (MAE's ``norm_pix_loss``, ``(t − μ)/√(σ² + 10⁻⁶)``)."""
    target = patchify(images, patch_size)
    if not norm_pix:
        return target
    mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
    return (target - mean) / (var + 1e-6).sqrt()


def masked_mse(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """MAE's loss: the squared error per pixel, averaged within each patch, then over the masked patches
    only ``Σ_{i,j} m_ij ‖pred_ij − target_ij‖² / (p²C) / Σ m_ij``; visible patches do not count."""
    per_patch = (pred - target).pow(2).mean(-1)  # (n, patches)
    weights = mask.to(per_patch.dtype)
    return (per_patch * weights).sum() / weights.sum()
