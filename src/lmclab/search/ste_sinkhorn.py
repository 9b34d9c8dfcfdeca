"""Sinkhorn STE, "MidLoss" (Guerrero-Peña et al. 2023; the paper's Appendix D.2).

``min_scores L((θa + π_soft(θb)) / 2)`` on training minibatches: the soft permutations of
:mod:`lmclab.search.sinkhorn` are trained on the task loss of the merged midpoint model (paper:
Adam lr 1, batch 512, 5 epochs). ``optimizer`` is ``adam`` (the paper) or ``adamw`` (the authors'
MLP example: AdamW lr 0.1, weight decay 0.01), ``weight_decay`` its coefficient (L2 added to the
gradient for Adam, decoupled for AdamW, as in torch). Each epoch visits every training sample once:
the last, smaller batch is kept as the authors' ``DataLoader`` keeps it (``drop_last`` drops it).
``init="wm"`` starts the scores at coordinate-descent weight matching's permutation
(:func:`lmclab.search.weight_matching.weight_matching`, default options) instead of the identity
(the authors' initialisation), so that STE inherits WM's alignment — the three-model study's
question whether that inheritance, not the midpoint loss, decides whether alignments compose.
The hard permutation is that of the final scores (the authors' choice: the midpoint loss has no
data-free score to select an epoch by): the linear assignment, the structured one for headed groups
(:func:`lmclab.search.sinkhorn.hard_permutation`); after every epoch the monitor (if any)
records its L2 distance and merged test metrics.

``precision="bf16"`` runs π_soft(θb) and the midpoint model's forward (and so their backward) under
bfloat16 autocast: the matrix products in bfloat16 with float32 accumulation; Sinkhorn, the loss and
the optimiser stay float32. On a CPU with native bfloat16 (AVX512-BF16, AMX) or a GPU the products
run several times faster (docs/methods.md); elsewhere they are emulated and slower.

**Orthogonal groups** (a spec with kinds, ``symmetry="orthogonal"``): each is an exact element of its kind,
differentiable in a latent matrix trained beside the scores at ``orthogonal_lr``
(:mod:`lmclab.search.soft_orthogonal`: the exponential of a skew-symmetric matrix; per rotary plane an angle);
inside heads the head order stays Sinkhorn's. ``init="wm"`` starts both at weight matching's element of the mixed
group, and ``lam_spread`` draws each step's λ from U(½ − s, ½ + s): Theus et al. (2025)'s Algorithm 1 (from weight
matching's solution, s = 0.1) with the paper's Sinkhorn relaxation of the permutations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial

import torch
from torch import Tensor, nn

from lmclab.core.assignment import AssignmentOptions
from lmclab.core.data import Split
from lmclab.core.options import Count, HalfWidth, NonNegative, Positive, one_of, option, takes
from lmclab.core.spec import PermutationSpec
from lmclab.search.midpoint import Monitor, check_batch, drawn_lam, midpoint_loss, minibatches
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import soft_apply
from lmclab.search.soft_orthogonal import hard_mixed, soft_mixed, start_mixed
from lmclab.search.wm_sinkhorn import INITS

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
PRECISIONS = ("fp32", "bf16")


class STESinkhornOptions(AssignmentOptions):
    """Options of :func:`ste_sinkhorn` (defaults: the paper's Adam, lr 1, batch 512, 5 epochs)."""

    optimizer: one_of(OPTIMIZERS) = option("adam", "Sinkhorn STE: adam (paper) or adamw (authors' example)")
    lr: Positive = option(1.0, "Sinkhorn STE: learning rate on the score matrices (paper: 1)")
    weight_decay: NonNegative = option(0.0, "Sinkhorn STE: weight decay of the scores (authors' AdamW: 0.01)")
    epochs: Count = option(5, "Sinkhorn STE: passes over the training split (paper: 5)")
    batch_size: Count = option(512, "Sinkhorn STE: images per step (paper: 512)", per_step=True)
    drop_last: bool = option(False, "Sinkhorn STE: drop the last, smaller batch of an epoch (authors: kept)")
    tau: Positive = option(1.0, "Sinkhorn STE: temperature")
    sinkhorn_iters: Count = option(20, "Sinkhorn STE: column+row normalisations per soft permutation")
    init: one_of(INITS) = option(
        "identity", "Sinkhorn STE: initial scores at the identity (authors) or at weight matching's permutation"
    )
    lam_spread: HalfWidth = option(
        0.0, "Sinkhorn STE: each step's loss is the merge's at λ ~ U(½ − s, ½ + s) (0: the midpoint; Theus et al.: 0.1)"
    )
    orthogonal_lr: Positive = option(
        0.01, "Sinkhorn STE: learning rate of the orthogonal groups' latent matrices (symmetry: orthogonal)"
    )
    precision: one_of(PRECISIONS) = option(
        "fp32", "Sinkhorn STE: fp32, or bf16 autocast of π_soft(θb) and the midpoint (CPUs with AVX512-BF16, GPUs)"
    )


@takes(STESinkhornOptions)
def ste_sinkhorn(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    model: nn.Module,
    data: Split,
    generator: torch.Generator,
    options: STESinkhornOptions,
    monitor: Monitor | None = None,
) -> SearchResult:
    """Optimise the Sinkhorn scores against the midpoint loss (options: :class:`STESinkhornOptions`);
    ``stats['curve']``: one row per epoch (``steps``: optimiser steps so far)."""
    epochs, batch_size = options.epochs, options.batch_size
    check_batch(batch_size, len(data))
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    params_a = {k: v.detach() for k, v in params_a.items()}
    params_b = {k: v.detach() for k, v in params_b.items()}
    data = data.like(params_a)  # on the model's device, floating inputs in its dtype
    relaxed, opt = _relaxation(spec, params_a, params_b, options, generator, device)
    sinkhorn = {"tau": options.tau, "n_iter": options.sinkhorn_iters}
    hard = partial(hard_mixed, *relaxed, **sinkhorn, lap_backend=options.lap_backend)
    data = data.to(device)
    curve = [{"epoch": 0, "train_loss": None, "steps": 0, **(monitor(hard()) if monitor else {})}]
    soft = partial(soft_mixed, *relaxed, **sinkhorn)
    lam = partial(drawn_lam, options.lam_spread, generator)
    step = partial(_step, opt, spec, soft, model, params_a, params_b, lam=lam, bf16=options.precision == "bf16")
    for epoch in range(1, epochs + 1):
        batches = minibatches(len(data), batch_size, generator, drop_last=options.drop_last)
        total = sum(step(data.x[i], data.y[i]) * len(i) for i in batches)
        row = {
            "epoch": epoch,
            "train_loss": total / sum(len(i) for i in batches),
            "steps": curve[-1]["steps"] + len(batches),
        }
        curve.append({**row, **(monitor(hard()) if monitor else {})})
    stats = {"curve": curve, "epochs": epochs, "lap_backend": options.lap_backend}
    return SearchResult(hard(), stats | {"seconds": time.perf_counter() - start})


def _relaxation(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    options: STESinkhornOptions,
    generator: torch.Generator,
    device: torch.device,
) -> tuple[tuple, torch.optim.Optimizer]:
    """``(spec, scores, bases, latents)`` at their start (:func:`~lmclab.search.soft_orthogonal.start_mixed`), in
    θa's float dtype, and the optimiser of the scores (``lr``, ``weight_decay``) and the latents (``orthogonal_lr``)."""
    scores, bases, latents = start_mixed(
        spec, params_a, params_b, init=options.init, generator=generator, device=device, lap_backend=options.lap_backend
    )
    dtype = next(v.dtype for v in params_a.values() if v.is_floating_point())  # a float64 model: float64 scores
    scores = {g: s.to(dtype).requires_grad_() for g, s in scores.items()}
    latents = {g: s.to(dtype).requires_grad_() for g, s in latents.items()}
    groups = [{"params": list(scores.values())}] if scores else []
    groups += [{"params": list(latents.values()), "lr": options.orthogonal_lr, "weight_decay": 0.0}] if latents else []
    opt = make_optimizer(options.optimizer, groups, lr=options.lr, weight_decay=options.weight_decay)
    return (spec, scores, {g: b.to(dtype) for g, b in bases.items()}, latents), opt


def make_optimizer(name: str, params: Iterable[Tensor], *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """Adam with ``weight_decay·θ`` added to the gradient, or AdamW with ``θ ← θ(1 − lr·wd)`` first."""
    return OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay)


def _step(
    opt: torch.optim.Optimizer,
    spec: PermutationSpec,
    soft: Callable[[], Mapping[str, Tensor]],
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    lam: Callable[[], float],
    bf16: bool = False,
) -> float:
    """One optimiser step on the minibatch's loss of the merge at ``lam()`` (the midpoint by default); returns it."""
    elements = soft()
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = midpoint_loss(model, spec, params_a, soft_apply(spec, elements, params_b), x, y, lam=lam())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()
