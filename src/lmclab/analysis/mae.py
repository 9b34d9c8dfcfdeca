"""Masked autoencoders (:mod:`lmclab.archs.mae`) along the segment between two MAE-pretrained ViTs: the
reconstruction error on masked and on visible patches apart (:func:`masked_visible_error`); the encoder's
evaluation (linear probe, kNN) is :mod:`lmclab.analysis.mae_probe`.

The masks are drawn once (:func:`fixed_masks`) and the same masks are used at every λ, so the errors
measure the models, not the masking noise. The convention is the project's
(:func:`lmclab.core.merge.lerp_params`): ``θ(λ) = λ θa + (1 − λ) θb``, θa at λ = 1 and θb at λ = 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lmclab.archs.masking import pixel_targets, random_masks
from lmclab.core.objective import functional_method


def fixed_masks(n: int, patches: int, mask_ratio: float, seed: int) -> Tensor:
    """The ``n`` masks of a curve, drawn from ``seed`` alone. (n, patches)."""
    return random_masks(n, patches, mask_ratio, torch.Generator().manual_seed(seed))


@torch.no_grad()
def masked_visible_error(
    model: nn.Module, params: Mapping[str, Tensor], images: Tensor, masks: Tensor, *, batch_size: int = 256
) -> dict[str, float]:
    """``{masked, visible}``: the mean squared error per pixel of the decoder's predictions
    (:meth:`~lmclab.archs.mae.Model.predict`) against the loss's targets, over the masked patches (the MAE
    loss) and over the visible patches (which the loss never trains: how much the decoder copies its input)."""
    if masks.shape[0] != images.shape[0]:
        raise ValueError(f"masks: {masks.shape[0]} masks for {images.shape[0]} images")
    config = model.config
    sums, counts = {True: 0.0, False: 0.0}, {True: 0, False: 0}
    for start in range(0, images.shape[0], batch_size):
        x, mask = images[start : start + batch_size], masks[start : start + batch_size].to(images.device)
        pred = functional_method(model, params, "predict", x, mask)
        per_patch = (pred - pixel_targets(x, config.patch_size, config.norm_pix)).pow(2).mean(-1)  # (n, patches)
        for hidden in (True, False):
            chosen = mask if hidden else ~mask
            sums[hidden] += float(per_patch[chosen].sum())
            counts[hidden] += int(chosen.sum())
    return {"masked": sums[True] / counts[True], "visible": sums[False] / counts[False]}
