"""Straight-through estimator, STE (Ainsworth et al. 2023, Algorithm 3).

``argmin_π L((θa + π(θb)) / 2)`` on training data. A trainable copy ``θ̃`` starts at θa. Each
minibatch: project ``θ̃`` to its nearest permutation of θb by weight matching (warm-started from
the previous permutation, so usually one or two sweeps), form ``θ̂ = θ̃ + sg(π(θb) − θ̃)`` — its
value is ``π(θb)``, its gradient flows to ``θ̃`` — and take an optimiser step on the midpoint loss
``L((θa + θ̂) / 2)``; ``optimizer`` is ``adam`` or ``sgd`` with ``momentum`` (the original STE v2:
SGD lr 0.01, momentum 0.9). Which permutation is returned (``select``):

- ``best_batch`` — the original's: the projection whose minibatch midpoint loss (at the step that
  used it) was the lowest of the whole run; needs no held-out data (``holdout: 0``);
- ``holdout`` — lmclab's: after every epoch the projection of the current ``θ̃`` is scored by the
  midpoint loss on a held-out ``holdout`` fraction of the training split and the best epoch wins
  (epoch 0 is the first projection, i.e. plain WM from θa), which is less noisy than one minibatch.

Only matched entries are trained; running statistics follow π.

**Orthogonal groups** (a spec with kinds, ``symmetry="orthogonal"``): the projection is weight matching over
the mixed group (:mod:`lmclab.search.wm_orthogonal`), so each orthogonal group of θ̃ is projected to the
polar factor of its cost (orthogonal Procrustes) beside the assignments of the permutation groups, and the
first projection is that search's data-free start from θa — Theus et al. (2025), Algorithm 1: a latent
matrix per group, projected to the group, trained on the task loss of the merge from weight matching's
solution. Their loss is the merge's at λ drawn from U(0.4, 0.6) each step (``lam_spread: 0.1``); the default is
the midpoint's, as Ainsworth et al.'s (``lam_spread: 0``). The held-out score is always the midpoint's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial

import torch
from pydantic import model_validator
from torch import Tensor, nn

from lmclab.core.assignment import AssignmentOptions
from lmclab.core.data import Split
from lmclab.core.options import Count, Fraction, HalfWidth, OptionError, Positive, one_of, option, takes
from lmclab.core.spec import Params, Permutation, PermutationSpec, apply_permutation
from lmclab.search.midpoint import (
    Monitor,
    check_batch,
    drawn_lam,
    heldout_loss,
    midpoint_loss,
    minibatches,
    split_holdout,
)
from lmclab.search.result import SearchResult
from lmclab.search.weight_matching import weight_matching

OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
Projector = Callable[[Mapping[str, Tensor], Permutation | None], Permutation]  # (θ̃, previous π) ↦ π
SELECTIONS = ("holdout", "best_batch")


class STEOptions(AssignmentOptions):
    """Options of :func:`ste`."""

    optimizer: one_of(OPTIMIZERS) = option("adam", "STE: optimiser of the continuous copy θ̃")
    lr: Positive = option(0.001, "STE: learning rate of θ̃")
    momentum: Fraction = option(0.0, "STE: SGD momentum (original STE v2: 0.9; ignored by adam)")
    epochs: Count = option(5, "STE: passes over the training split minus the held-out part (paper: 5)")
    batch_size: Count = option(512, "STE: images per step (paper: 512)", per_step=True)
    holdout: Fraction = option(0.1, "STE: fraction of the training split held out (select: holdout)", held_out=True)
    select: one_of(SELECTIONS) = option("holdout", "STE: best epoch on held-out data, or best_batch (original)")
    wm_max_iter: Count = option(100, "STE: WM sweeps at most per projection")
    lam_spread: HalfWidth = option(
        0.0, "STE: each step's loss is the merge's at λ ~ U(½ − s, ½ + s) (0: the midpoint; Theus et al.: 0.1)"
    )

    @model_validator(mode="after")
    def _selection_has_heldout_data(self) -> STEOptions:
        if self.select == "holdout" and self.holdout == 0:
            raise OptionError(
                "{holdout} must be above 0 when {select} is 'holdout' (or choose select: best_batch), got 0"
            )
        return self


@takes(STEOptions)
def ste(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    model: nn.Module,
    data: Split,
    generator: torch.Generator,
    options: STEOptions,
    monitor: Monitor | None = None,
) -> SearchResult:
    """STE search (options: :class:`STEOptions`); ``stats['curve']`` has one row per epoch: mean and
    lowest minibatch loss, held-out midpoint loss of the epoch's projection (None without held-out data)."""
    holdout, batch_size, epochs = options.holdout, options.batch_size, options.epochs
    train, held = split_holdout(data, holdout, generator)
    check_batch(batch_size, len(train))
    start = time.perf_counter()
    params_a = {k: v.detach() for k, v in params_a.items()}
    params_b = {k: v.detach() for k, v in params_b.items()}
    train, held = train.like(params_a), held.like(params_a)
    tilde = {k: v.clone().requires_grad_() for k, v in spec.matched(params_a).items()}
    opt = make_optimizer(options.optimizer, tilde.values(), lr=options.lr, momentum=options.momentum)
    project = projector(spec, params_b, options.wm_max_iter, generator, lap_backend=options.lap_backend)
    common = {"model": model, "spec": spec, "params_a": params_a, "params_b": params_b}
    score = partial(_score, **common, held=held, batch_size=batch_size, monitor=monitor)
    step = partial(ste_step, opt, tilde, project, **common, lam=partial(drawn_lam, options.lam_spread, generator))
    epoch_perms = [project(tilde, None)]
    curve, batch_best = [score(0, epoch_perms[0], None)], (float("inf"), epoch_perms[0], 0)
    for epoch in range(1, epochs + 1):
        perm, losses, batch_best = _epoch(step, epoch_perms[-1], train, batch_size, generator, epoch, batch_best)
        epoch_perms.append(project(tilde, perm))
        row = score(epoch, epoch_perms[-1], sum(losses) / len(losses))
        curve.append({**row, "best_batch_loss": min(losses)})
    if options.select == "best_batch":
        best_perm, best_epoch = batch_best[1], batch_best[2]
    else:
        best_epoch = min(curve, key=lambda row: row["heldout_loss"])["epoch"]
        best_perm = epoch_perms[best_epoch]
    stats = {"curve": curve, "epochs": epochs, "best_epoch": best_epoch, "lap_backend": options.lap_backend}
    return SearchResult(best_perm, stats | {"seconds": time.perf_counter() - start})


def _epoch(
    step: Callable[..., tuple[Permutation, float]],
    perm: Permutation,
    train: Split,
    batch_size: int,
    generator: torch.Generator,
    epoch: int,
    batch_best: tuple[float, Permutation, int],
) -> tuple[Permutation, list[float], tuple[float, Permutation, int]]:
    """Epoch ``epoch`` of Algorithm 3, one pass over ``train`` from the projection ``perm``: the last
    projection, the minibatch losses, and ``batch_best`` (the loss, projection and epoch of the lowest
    minibatch loss so far: ``select: best_batch``) updated."""
    losses = []
    for idx in minibatches(len(train), batch_size, generator):
        perm, loss = step(perm, x=train.x[idx], y=train.y[idx])
        losses.append(loss)
        batch_best = (loss, perm, epoch) if loss < batch_best[0] else batch_best
    return perm, losses, batch_best


def make_optimizer(name: str, params: Iterable[Tensor], *, lr: float, momentum: float) -> torch.optim.Optimizer:
    """Adam, or SGD with heavy-ball ``momentum`` (torch's: ``b ← m·b + g``, ``θ ← θ − lr·b``)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    return OPTIMIZERS[name](params, lr=lr)


def straight_through(tilde: Mapping[str, Tensor], permuted_b: Mapping[str, Tensor]) -> Params:
    """``θ̂ = θ̃ + sg(π(θb) − θ̃)``: the value of π(θb), the gradient of θ̃ (entries that are not
    trained, the running statistics, are π(θb)'s)."""
    return {k: tilde[k] + (v - tilde[k]).detach() if k in tilde else v for k, v in permuted_b.items()}


def ste_step(
    opt: torch.optim.Optimizer,
    tilde: Mapping[str, Tensor],
    project: Projector,
    previous: Permutation | None,
    *,
    model: nn.Module,
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    lam: Callable[[], float] = lambda: 0.5,
) -> tuple[Permutation, float]:
    """One minibatch of Algorithm 3: project ``θ̃`` (warm-started from ``previous``), evaluate the
    merge's loss at ``θ̂`` (at the weight ``lam()``: the midpoint by default), back-propagate to ``θ̃`` and
    take one optimiser step on it. Returns the projection and the loss."""
    perm = project(tilde, previous)
    hat = straight_through(tilde, apply_permutation(spec, perm, params_b))
    loss = midpoint_loss(model, spec, params_a, hat, x, y, lam=lam())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return perm, loss.item()


def projector(
    spec: PermutationSpec,
    params_b: Mapping[str, Tensor],
    max_iter: int,
    generator: torch.Generator,
    *,
    lap_backend: str = "scipy",
) -> Projector:
    """``θ̃ ↦ argmin_π ‖θ̃ − π(θb)‖`` by WM (assignments by ``lap_backend``), warm-started from the previous permutation.
    (Running statistics only give WM the group sizes; they never enter its cost.)"""
    stats = {k: v for k, v in params_b.items() if k in spec.stats}

    def project(tilde: Mapping[str, Tensor], previous: Permutation | None) -> Permutation:
        with torch.no_grad():
            return weight_matching(
                spec,
                {**stats, **{k: v.detach() for k, v in tilde.items()}},
                params_b,
                max_iter=max_iter,
                tol=0.0,
                generator=generator,
                init_perm=previous,
                lap_backend=lap_backend,
                restarts=1,  # a projection warm-started from the last one
            ).perm

    return project


def _score(
    epoch: int,
    perm: Permutation,
    train_loss: float | None,
    *,
    model: nn.Module,
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    held: Split,
    batch_size: int,
    monitor: Monitor | None,
) -> dict:
    permuted_b = apply_permutation(spec, perm, params_b)
    held_loss = heldout_loss(model, spec, params_a, permuted_b, held, batch_size) if len(held) else None
    row = {"epoch": epoch, "train_loss": train_loss, "heldout_loss": held_loss}
    return {**row, **(monitor(perm) if monitor else {})}
