"""Pretraining one masked autoencoder (He et al. 2022, §3 and Appendix A.1) from a seed.

MAE's recipe: AdamW (β = (0.9, 0.95), weight decay 0.05 on the weight matrices only — biases and
LayerNorm parameters are not decayed), a cosine learning-rate schedule after a linear warm-up, and a
fresh random mask per image at every step (:func:`lmclab.archs.masking.random_masks`); the labels of
the images are never read. The schedule is the supervised loop's (:func:`lmclab.train.training.lr_factor`).

Deterministic on CPU: the initialisation, the minibatch order and the masks are drawn from generators
seeded by ``seed`` alone (masks from their own stream), so the same seed gives bit-identical parameters.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from pydantic import model_validator
from torch import nn
from tqdm import tqdm

from lmclab.archs import mae, seeded_model
from lmclab.archs.masking import random_masks
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.options import Count, Fraction, NonNegative, OptionError, Options, Positive, one_of, option, takes
from lmclab.core.spec import Params
from lmclab.train.training import CPU, SCHEDULES, lr_factor

MASK_STREAM = 2**33  # the mask generator is seeded with seed + this: apart from the order's and augmentation's


class MAETrainOptions(Options):
    """Options of :func:`train_mae` (defaults: MAE's, with its base lr 1.5e-4 at batch 256)."""

    epochs: Count = option(10, "MAE pretraining: passes over the training images")
    lr: Positive = option(1.5e-4, "MAE pretraining: peak AdamW learning rate (MAE: 1.5e-4 · batch_size / 256)")
    batch_size: Count = option(256, "MAE pretraining: images per step")
    weight_decay: NonNegative = option(0.05, "MAE pretraining: AdamW decoupled weight decay of weight matrices")
    beta1: Fraction = option(0.9, "MAE pretraining: AdamW β1")
    beta2: Fraction = option(0.95, "MAE pretraining: AdamW β2 (MAE: 0.95, not Adam's 0.999)")
    schedule: one_of(SCHEDULES) = option("cosine", "MAE pretraining: learning rate after the warm-up (MAE: cosine)")
    warmup_epochs: int = option(0, "MAE pretraining: epochs of linear learning-rate warm-up (MAE: 40 of 800)")

    @model_validator(mode="after")
    def _warmup_within_training(self) -> MAETrainOptions:
        if not 0 <= self.warmup_epochs <= self.epochs:
            raise OptionError(
                f"{{warmup_epochs}} must be between 0 and {{epochs}} ({self.epochs}), got {self.warmup_epochs}"
            )
        return self


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """MAE's parameter groups: weight decay on parameters of two or more axes, none on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]


@takes(MAETrainOptions)
def train_mae(
    config: mae.Config,
    seed: int,
    images: Split,
    *,
    options: MAETrainOptions,
    test: Split | None = None,
    device: torch.device = CPU,
    progress: bool = False,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> tuple[Params, list[dict[str, float]]]:
    """Minimise the masked reconstruction loss (:class:`lmclab.archs.mae.Model`) on ``images.x`` (labels
    unused; options: :class:`MAETrainOptions`). Returns the CPU ``state_dict`` and one history row per
    epoch: ``epoch``, ``lr`` (after the epoch), ``train_loss`` (the mean over the epoch's masked patches,
    i.e. over its minibatches weighted by size), ``seconds`` (wall time of the epoch's steps) and, with a
    ``test`` split, ``test_loss``: its reconstruction loss in eval mode under the fixed masks of
    ``config.mask_seed`` (:meth:`lmclab.archs.mae.Model.default_mask`). ``on_epoch(row)``: called with a
    copy of each row as soon as it is measured (the train stage feeds DVCLive with it)."""
    o = options
    if o.batch_size > len(images):
        raise OptionError(f"{{batch_size}} must be at most the {len(images)} training images, got {o.batch_size}")
    model = seeded_model(mae.Model, config, seed).to(device)
    opt = torch.optim.AdamW(decay_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2))
    steps_per_epoch = math.ceil(len(images) / o.batch_size)
    total, warmup = o.epochs * steps_per_epoch, o.warmup_epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(o.schedule, step, total, warmup))
    order = torch.Generator().manual_seed(seed)
    masking = torch.Generator().manual_seed(seed + MASK_STREAM)
    x_all = images.x.to(device)
    history = []
    model.train()
    for epoch in tqdm(range(1, o.epochs + 1), desc=f"mae seed {seed}", disable=not progress, leave=False):
        start = time.perf_counter()
        batches = torch.randperm(len(images), generator=order).split(o.batch_size)
        loss_sum = _epoch(model, opt, sched, x_all, batches, masking)
        seconds = time.perf_counter() - start
        row = {"epoch": epoch, "lr": opt.param_groups[0]["lr"], "train_loss": loss_sum / len(images)}
        if test is not None:
            row["test_loss"] = evaluate(model, dict(model.state_dict()), test).loss
            model.train()
        history.append(row | {"seconds": seconds})
        if on_epoch is not None:
            on_epoch(dict(history[-1]))
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return state, history


def _epoch(
    model: mae.Model,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    x_all: torch.Tensor,
    batches: tuple[torch.Tensor, ...],
    masking: torch.Generator,
) -> float:
    """One pass over ``batches`` of ``x_all``, an optimiser and a schedule step per minibatch, each image
    under a fresh random mask drawn from ``masking``; the sum over images of their masked-patch loss."""
    loss_sum = 0.0
    for idx in batches:
        mask = random_masks(len(idx), model.config.patches, model.config.mask_ratio, masking)  # fresh per step
        loss = model(x_all[idx.to(x_all.device)], mask.to(x_all.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        loss_sum += loss.item() * len(idx)  # every image has the same number of masked patches
    return loss_sum
