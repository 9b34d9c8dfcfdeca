"""Linear mode connectivity of masked autoencoders: the reconstruction loss along the segment between two
MAE-pretrained ViTs (:mod:`lmclab.archs.mae`) and its barriers (the paper's Definition 2.1 with the MAE loss
in place of the classification loss).

Also the reconstruction error on masked and on visible patches apart (:func:`masked_visible_error`);
the encoder's evaluation (linear probe, kNN) is :mod:`lmclab.analysis.mae_probe`.

The masks are drawn once (:func:`fixed_masks`) and the same masks are used at every λ, so the curve
measures the models, not the masking noise. The convention is the project's
(:func:`lmclab.core.merge.lerp_params`): ``θ(λ) = λ θa + (1 − λ) θb``, θa at λ = 1 and θb at λ = 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.archs.masking import pixel_targets, random_masks
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import barrier, midpoint_barrier
from lmclab.core.objective import functional_method


def fixed_masks(n: int, patches: int, mask_ratio: float, seed: int) -> Tensor:
    """The ``n`` masks of a curve, drawn from ``seed`` alone. (n, patches)."""
    return random_masks(n, patches, mask_ratio, torch.Generator().manual_seed(seed))


@torch.no_grad()
def reconstruction_loss(
    model: nn.Module, params: Mapping[str, Tensor], images: Tensor, masks: Tensor, *, batch_size: int = 256
) -> float:
    """The MAE loss of ``params`` over all ``images`` (n, C, H, W) under ``masks`` (n, patches): the mean
    squared error over every masked patch of the set (batches weighted by their masked patches)."""
    if masks.shape[0] != images.shape[0]:
        raise ValueError(f"masks: {masks.shape[0]} masks for {images.shape[0]} images")
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    total, count = 0.0, 0
    for start in range(0, images.shape[0], batch_size):
        x, mask = images[start : start + batch_size], masks[start : start + batch_size]
        masked = int(mask.sum())
        total += float(functional_call(model, dict(params), (x, mask))) * masked
        count += masked
    return total / count


def reconstruction_curve(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    images: Tensor,
    lams: Sequence[float],
    masks: Tensor,
    *,
    batch_size: int = 256,
) -> list[dict]:
    """Rows ``{lam, loss}``: the MAE loss of ``θ(λ) = λθa + (1−λ)θb`` on ``images`` under the same ``masks``."""
    rows = []
    for lam in lams:
        params = lerp_params(params_a, params_b, lam)
        loss = reconstruction_loss(model, params, images, masks, batch_size=batch_size)
        rows.append({"lam": float(lam), "loss": loss})
    return rows


def reconstruction_barriers(rows: Sequence[dict]) -> dict[str, float]:
    """Max-over-λ barrier (:func:`~lmclab.core.metrics.barrier`), midpoint barrier and the endpoint and
    midpoint losses of a :func:`reconstruction_curve` (its λ grid must hold 0, ½ and 1)."""
    at = {r["lam"]: r["loss"] for r in rows}
    if not {0.0, 0.5, 1.0} <= set(at):
        raise ValueError("lams: the λ grid must contain 0, ½ and 1")
    lams = sorted(at)
    return {
        "mae_loss_barrier_max": barrier(lams, [at[lam] for lam in lams]),
        "mae_loss_barrier_mid": midpoint_barrier(at[0.5], at[1.0], at[0.0]),
        "mae_loss_a": at[1.0],
        "mae_loss_b": at[0.0],
        "mae_loss_mid": at[0.5],
    }


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
