"""Training one endpoint model θ from a seed (the paper's settings: Adam 1e-3, batch 512).

Deterministic on CPU: the initialisation, the minibatch order and the augmentation are drawn
from generators seeded by ``seed`` alone, so the same seed gives bit-identical parameters.
Options for the paper's appendix H.5 studies: ``weight_decay``, the optimiser (Adam, or SGD with
``momentum``) and a per-step learning-rate ``schedule`` with linear warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from tqdm import tqdm

from lmclab.analysis.collapse import neural_collapse
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World, evaluate_sharded
from lmclab.core.objective import correct_of, per_position
from lmclab.core.options import (
    Count,
    Fraction,
    NonNegative,
    OptionError,
    Options,
    Positive,
    one_of,
    option,
    takes,
)
from lmclab.train.augment import AUGMENTATIONS, Mixup, augment_batch

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("fp32", "bf16")
CPU = torch.device("cpu")  # the default device of train()
AUGMENT_STREAM = 2**32  # the augmentation generator is seeded with seed + this: its own stream


class TrainOptions(Options):
    """Options of :func:`train` (defaults: the paper's, Adam 1e-3 at batch 512 for 100 epochs)."""

    epochs: Count = option(100, "full passes over the training split (paper: 100)")
    lr: Positive = option(1e-3, "learning rate (paper: 1e-3)")
    batch_size: Count = option(512, "images per step (paper: 512)")
    optimizer: one_of(OPTIMIZERS) = option("adam", "adam (paper) or sgd with momentum")
    momentum: Fraction = option(0.9, "SGD momentum (ignored by adam)")
    weight_decay: NonNegative = option(0.0, "L2 penalty coefficient added to the gradient (paper: 0)")
    schedule: one_of(SCHEDULES) = option("constant", "learning-rate schedule per step (linear: decay to 0)")
    warmup_epochs: Annotated[int, Field(ge=0)] = option(0, "epochs of linear warm-up to lr (at most epochs)")
    augment: one_of(AUGMENTATIONS) = option("none", "augmentation of each training batch")
    mixup_alpha: NonNegative = option(0.0, "mixup: inputs and one-hot targets mixed with λ ~ Beta(α, α) (0 = off)")
    precision: one_of(PRECISIONS) = option("fp32", "fp32, or bf16 autocast of the forward pass (for GPUs)")

    @model_validator(mode="after")
    def _warmup_within_training(self) -> TrainOptions:
        if self.warmup_epochs > self.epochs:
            raise OptionError(
                f"{{warmup_epochs}} must be between 0 and {{epochs}} ({self.epochs}), got {self.warmup_epochs}"
            )
        return self


def check_training_options(n_train: int, **options: Any) -> TrainOptions:
    """``options`` validated by :class:`TrainOptions`, and ``batch_size`` within the ``n_train`` training
    samples: one-line :class:`OptionError` s naming the arguments, raised before any training starts."""
    checked = TrainOptions.check(options)
    if checked.batch_size > n_train:
        raise OptionError(
            f"{{batch_size}} must be between 1 and the {n_train} training samples, got {checked.batch_size}"
        )
    return checked


def lr_factor(schedule: str, step: int, total_steps: int, warmup_steps: int = 0) -> float:
    """Multiplier of the base learning rate at optimiser ``step`` (0-based): linear warm-up from
    ~0 over ``warmup_steps``, then constant, cosine decay to 0, or linear decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)  # 0 → 1
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1 - progress
    return 1.0


def make_optimizer(
    params: Any, *, optimizer: str, lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """Adam (paper) or SGD with (Nesterov-free) momentum; ``weight_decay`` is the L2 penalty
    coefficient added to the gradient (PyTorch's coupled weight decay)."""
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


@takes(TrainOptions)
def train(
    arch: str,
    config: Any,
    seed: int,
    train_split: Split,
    test_split: Split,
    *,
    options: TrainOptions,
    device: torch.device = CPU,
    world: World = ALONE,
    progress: bool = False,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> tuple[Checkpoint, list[dict[str, float]]]:
    """Train with cross-entropy; return the checkpoint and one history row per epoch.

    History rows: ``epoch``, ``lr`` (after the epoch), ``train_loss``/``train_acc``
    (running means over the epoch's minibatches, augmented images) and ``test_loss``/``test_acc``
    (full test split, eval mode, after the epoch). ``world``: data-parallel processes under torchrun
    (:mod:`lmclab.core.distributed`), each on its shard of every global batch of ``batch_size``;
    ``precision="bf16"``: forward and loss under bfloat16 autocast; ``mixup_alpha > 0``: mixup
    (:class:`lmclab.train.augment.Mixup`). The last row also holds the neural-collapse statistics of the
    final model's last-layer features on the training split (:mod:`lmclab.analysis.collapse`).
    ``on_epoch(row)``: called with a copy of each epoch's row as soon as it is measured, in every process
    (a caller under torchrun passes it on rank 0 only); the train stage feeds DVCLive with it.
    """
    o = check_training_options(len(train_split), **options.model_dump())
    model = build_model(arch, config, seed=seed).to(device)
    step = _stepper(model, o, seed, train_split, device, world)
    order = torch.Generator().manual_seed(seed)
    history = []
    bar = tqdm(
        range(1, o.epochs + 1), desc=f"train seed {seed}", disable=not progress or not world.is_main, leave=False
    )
    for epoch in bar:
        loss, acc = step.epoch(torch.randperm(len(train_split), generator=order).split(o.batch_size))
        test = evaluate_sharded(model, dict(model.state_dict()), test_split, world)
        row = {
            "epoch": epoch,
            "lr": step.opt.param_groups[0]["lr"],
            "train_loss": loss,
            "train_acc": acc,
            "test_loss": test.loss,
            "test_acc": test.acc,
        }
        history.append(row)
        if on_epoch is not None:
            on_epoch(dict(row))
        bar.set_postfix(loss=f"{loss:.3f}", test_acc=f"{test.acc:.3f}")
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    spec = get_arch(arch).permutation_spec(config)
    history[-1].update(neural_collapse(spec, model, dict(model.state_dict()), train_split))
    return Checkpoint(arch, config, seed, state), history


def _stepper(
    model: torch.nn.Module, o: TrainOptions, seed: int, train_split: Split, device: torch.device, world: World
) -> Step:
    """The optimiser, learning-rate schedule and minibatch steps of ``model`` (wrapped for ``world``) under
    the options ``o``; augmentation and mixup draw from their own streams of ``seed``."""
    wrapped = world.wrap(model)
    opt = make_optimizer(
        wrapped.parameters(), optimizer=o.optimizer, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay
    )
    steps_per_epoch = math.ceil(len(train_split) / o.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(o.schedule, step, o.epochs * steps_per_epoch, o.warmup_epochs * steps_per_epoch)
    )
    return Step(
        wrapped,
        opt,
        sched,
        train_split.to(device),
        o.augment,
        torch.Generator().manual_seed(seed + AUGMENT_STREAM),
        world,
        o.precision,
        Mixup(o.mixup_alpha, seed) if o.mixup_alpha > 0 else None,
    )


@dataclass
class Step:
    """The optimiser steps of one process; with ``world.size > 1`` on its shard of each global batch."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    data: Split
    augment: str
    augmentation: torch.Generator
    world: World
    precision: str
    mixup: Mixup | None = None

    def epoch(self, batches: tuple[torch.Tensor, ...]) -> tuple[float, float]:
        """One pass in training mode; the running-mean loss and accuracy of its minibatches (over all
        processes). A trailing minibatch with a shard of one image is skipped (BatchNorm needs two)."""
        self.model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        for idx in batches:
            if len(idx) < 2 * self.world.size and seen:
                continue
            loss, n_correct, n = self.one(idx.to(self.data.x.device))
            loss_sum, correct, seen = loss_sum + loss, correct + n_correct, seen + n
        loss_sum, correct, seen = self.world.all_sum(loss_sum, correct, seen)
        return loss_sum / seen, correct / seen

    def one(self, idx: torch.Tensor) -> tuple[float, int, int]:
        """One step on global batch ``idx``; this process's summed loss, correct count and images."""
        x, y = augment_batch(self.data.x[idx], self.augment, self.augmentation), self.data.y[idx]  # alike everywhere
        partner, lam = y, 1.0
        if self.mixup is not None:
            x, partner, lam = self.mixup.mix(x, y)
        mine = self.world.shard(torch.arange(len(idx), device=idx.device))
        x, y, partner = x[mine], y[mine], partner[mine]
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            logits = self.model(x)
            loss = self.loss(logits, y, len(idx))
            if self.mixup is not None:
                loss = lam * loss + (1 - lam) * self.loss(logits, partner, len(idx))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        summed = loss.item() * (len(idx) / self.world.size if self.world.size > 1 else len(idx))
        return summed, correct_of(logits, y), len(y)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, batch: int) -> torch.Tensor:
        """Cross-entropy (targets per position, a language model's: the mean over a sample's positions, each
        sample's with equal weight); DDP averages gradients over processes, so there each shard's sum is
        scaled to make it the global batch's mean."""
        if per_position(logits, y):  # every sample has as many positions: the mean over all of them
            logits, y, batch = logits.flatten(0, -2), y.flatten(), batch * y[0].numel()
        if self.world.size == 1:
            return F.cross_entropy(logits, y)
        return F.cross_entropy(logits, y, reduction="sum") * (self.world.size / batch)
