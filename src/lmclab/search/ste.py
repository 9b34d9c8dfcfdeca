"""Straight-through estimator, STE (Ainsworth et al. 2023, Algorithm 3; SPEC.md §3).

``argmin_π L((θa + π(θb)) / 2)`` on training data. A trainable copy ``θ̃`` starts at θa. Each
minibatch: project ``θ̃`` to its nearest permutation of θb by weight matching (warm-started from
the previous permutation, so usually one or two sweeps), form ``θ̂ = θ̃ + sg(π(θb) − θ̃)`` — its
value is ``π(θb)``, its gradient flows to ``θ̃`` — and take an optimiser step on the midpoint loss
``L((θa + θ̂) / 2)``. After every epoch, the projection of the current ``θ̃`` is scored by the
midpoint loss on a held-out part of the training split; the best permutation is returned
(epoch 0 is the first projection, i.e. plain WM from θa). Only matched entries are trained;
running statistics follow π.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from lmclab.data import Split
from lmclab.search.midpoint import Monitor, heldout_loss, midpoint_loss, minibatches, split_holdout
from lmclab.search.options import check_batch, check_options, fraction, one_of, positive, positive_int
from lmclab.search.result import SearchResult
from lmclab.search.weight_matching import weight_matching
from lmclab.spec import Params, Permutation, PermutationSpec, apply_permutation

OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
Projector = Callable[[Mapping[str, Tensor], Permutation | None], Permutation]  # (θ̃, previous π) ↦ π
RULES = {"optimizer": one_of(*OPTIMIZERS), "lr": positive, "epochs": positive_int,
         "batch_size": positive_int, "holdout": fraction, "wm_max_iter": positive_int}


def ste(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], *,
        model: nn.Module, data: Split, generator: torch.Generator, optimizer: str = "adam",
        lr: float = 1e-3, epochs: int = 5, batch_size: int = 512, holdout: float = 0.1,
        wm_max_iter: int = 100, monitor: Monitor | None = None) -> SearchResult:
    """STE search; ``stats['curve']`` has one row per epoch with the held-out midpoint loss."""
    check_options("ste", RULES, {"optimizer": optimizer, "lr": lr, "epochs": epochs,
                                 "batch_size": batch_size, "holdout": holdout, "wm_max_iter": wm_max_iter})
    device = next(iter(params_a.values())).device
    train, held = split_holdout(data, holdout, generator)
    check_batch("ste", batch_size, len(train))
    start = time.perf_counter()
    params_a = {k: v.detach() for k, v in params_a.items()}
    params_b = {k: v.detach() for k, v in params_b.items()}
    train, held = train.to(device), held.to(device)
    tilde = {k: v.clone().requires_grad_() for k, v in spec.matched(params_a).items()}
    opt = OPTIMIZERS[optimizer](tilde.values(), lr=lr)
    project = projector(spec, params_b, wm_max_iter, generator)
    perm = project(tilde, None)
    best = _score(0, perm, model, spec, params_a, params_b, held, batch_size, None, monitor)
    curve = [best]
    best_perm = perm
    for epoch in range(1, epochs + 1):
        total, batches = 0.0, minibatches(len(train), batch_size, generator)
        for idx in batches:
            perm, loss = ste_step(opt, tilde, project, perm, model=model, spec=spec, params_a=params_a,
                                  params_b=params_b, x=train.x[idx], y=train.y[idx])
            total += loss
        perm = project(tilde, perm)
        curve.append(_score(epoch, perm, model, spec, params_a, params_b, held, batch_size,
                            total / len(batches), monitor))
        if curve[-1]["heldout_loss"] < best["heldout_loss"]:
            best, best_perm = curve[-1], perm
    return SearchResult(best_perm, {"curve": curve, "epochs": epochs, "best_epoch": best["epoch"],
                                    "seconds": time.perf_counter() - start})


def straight_through(tilde: Mapping[str, Tensor], permuted_b: Mapping[str, Tensor]) -> Params:
    """``θ̂ = θ̃ + sg(π(θb) − θ̃)``: the value of π(θb), the gradient of θ̃ (entries that are not
    trained, the running statistics, are π(θb)'s)."""
    return {k: tilde[k] + (v - tilde[k]).detach() if k in tilde else v for k, v in permuted_b.items()}


def ste_step(opt: torch.optim.Optimizer, tilde: Mapping[str, Tensor], project: Projector,
             previous: Permutation | None, *, model: nn.Module, spec: PermutationSpec,
             params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], x: Tensor,
             y: Tensor) -> tuple[Permutation, float]:
    """One minibatch of Algorithm 3: project ``θ̃`` (warm-started from ``previous``), evaluate the
    midpoint loss at ``θ̂``, back-propagate to ``θ̃`` and take one optimiser step on it.
    Returns the projection and the loss."""
    perm = project(tilde, previous)
    hat = straight_through(tilde, apply_permutation(spec, perm, params_b))
    loss = midpoint_loss(model, spec, params_a, hat, x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return perm, loss.item()


def projector(spec: PermutationSpec, params_b: Mapping[str, Tensor], max_iter: int,
              generator: torch.Generator) -> Projector:
    """``θ̃ ↦ argmin_π ‖θ̃ − π(θb)‖`` by WM, warm-started from the previous permutation.
    (Running statistics only give WM the group sizes; they never enter its cost.)"""
    stats = {k: v for k, v in params_b.items() if k in spec.stats}

    def project(tilde: Mapping[str, Tensor], previous: Permutation | None) -> Permutation:
        with torch.no_grad():
            return weight_matching(spec, {**stats, **{k: v.detach() for k, v in tilde.items()}},
                                   params_b, max_iter=max_iter, tol=0.0, generator=generator,
                                   init_perm=previous).perm

    return project


def _score(epoch: int, perm: Permutation, model: nn.Module, spec: PermutationSpec,
           params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], held: Split,
           batch_size: int, train_loss: float | None, monitor: Monitor | None) -> dict:
    permuted_b = apply_permutation(spec, perm, params_b)
    row = {"epoch": epoch, "train_loss": train_loss,
           "heldout_loss": heldout_loss(model, spec, params_a, permuted_b, held, batch_size)}
    return {**row, **(monitor(perm) if monitor else {})}

