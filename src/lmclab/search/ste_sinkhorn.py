"""Sinkhorn STE, "MidLoss" (Guerrero-Peña et al. 2023; SPEC.md §3).

``min_scores L((θa + π_soft(θb)) / 2)`` on training minibatches: the soft permutations of
:mod:`lmclab.search.sinkhorn` are trained on the task loss of the merged midpoint model (paper:
Adam lr 1, batch 512, 5 epochs). ``optimizer`` is ``adam`` (the paper) or ``adamw`` (the authors'
MLP example: AdamW lr 0.1, weight decay 0.01), ``weight_decay`` its coefficient (L2 added to the
gradient for Adam, decoupled for AdamW, as in torch). Each epoch visits every training sample once:
the last, smaller batch is kept as the authors' ``DataLoader`` keeps it (``drop_last`` drops it).
The hard permutation is the linear assignment on the final scores (the authors' choice: the
midpoint loss has no data-free score to select an epoch by); after every epoch the monitor (if any)
records its L2 distance and merged test metrics.

``precision="bf16"`` runs π_soft(θb) and the midpoint model's forward (and so their backward) under
bfloat16 autocast: the matrix products in bfloat16 with float32 accumulation; Sinkhorn, the loss and
the optimiser stay float32. On a CPU with native bfloat16 (AVX512-BF16, AMX) or a GPU the products
run several times faster (README "Sinkhorn methods"); elsewhere they are emulated and slower.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.search.midpoint import Monitor, midpoint_loss, minibatches
from lmclab.search.options import boolean, check_batch, check_options, non_negative, one_of, positive_int
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import RULES as SINKHORN_RULES
from lmclab.search.sinkhorn import hard_permutation, init_scores, soft_apply, soft_permutation
from lmclab.core.spec import PermutationSpec

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
PRECISIONS = ("fp32", "bf16")
RULES = {**SINKHORN_RULES, "batch_size": positive_int, "optimizer": one_of(*OPTIMIZERS),
         "weight_decay": non_negative, "drop_last": boolean, "precision": one_of(*PRECISIONS)}


def ste_sinkhorn(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor],
                 *, model: nn.Module, data: Split, generator: torch.Generator, optimizer: str = "adam",
                 lr: float = 1.0, weight_decay: float = 0.0, epochs: int = 5, batch_size: int = 512,
                 drop_last: bool = False, tau: float = 1.0, sinkhorn_iters: int = 20, precision: str = "fp32",
                 monitor: Monitor | None = None) -> SearchResult:
    """Optimise the Sinkhorn scores against the midpoint loss; ``stats['curve']``: one row per epoch
    (``steps``: optimiser steps so far)."""
    check_options("ste_sinkhorn", RULES, {
        "optimizer": optimizer, "lr": lr, "weight_decay": weight_decay, "epochs": epochs,
        "batch_size": batch_size, "drop_last": drop_last, "tau": tau, "sinkhorn_iters": sinkhorn_iters,
        "precision": precision})
    check_batch("ste_sinkhorn", batch_size, len(data))
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    params_a = {k: v.detach() for k, v in params_a.items()}
    params_b = {k: v.detach() for k, v in params_b.items()}
    scores = {g: s.requires_grad_() for g, s in init_scores(spec.group_sizes(params_a), generator,
                                                              device).items()}
    opt = make_optimizer(optimizer, scores.values(), lr=lr, weight_decay=weight_decay)
    data = data.to(device)
    curve = [{"epoch": 0, "train_loss": None, "steps": 0,
              **(monitor(hard_permutation(scores)) if monitor else {})}]
    for epoch in range(1, epochs + 1):
        batches = minibatches(len(data), batch_size, generator, drop_last=drop_last)
        total = sum(_step(opt, spec, scores, model, params_a, params_b, data.x[i], data.y[i],
                          tau=tau, n_iter=sinkhorn_iters, bf16=precision == "bf16") * len(i) for i in batches)
        row = {"epoch": epoch, "train_loss": total / sum(len(i) for i in batches),
               "steps": curve[-1]["steps"] + len(batches)}
        curve.append({**row, **(monitor(hard_permutation(scores)) if monitor else {})})
    return SearchResult(hard_permutation(scores), {"curve": curve, "epochs": epochs,
                                                   "seconds": time.perf_counter() - start})


def make_optimizer(name: str, params: Iterable[Tensor], *, lr: float,
                   weight_decay: float) -> torch.optim.Optimizer:
    """Adam with ``weight_decay·θ`` added to the gradient, or AdamW with ``θ ← θ(1 − lr·wd)`` first."""
    return OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay)


def _step(opt: torch.optim.Optimizer, spec: PermutationSpec, scores: Mapping[str, Tensor],
          model: nn.Module, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor],
          x: Tensor, y: Tensor, *, tau: float, n_iter: int, bf16: bool = False) -> float:
    """One optimiser step on the minibatch's midpoint loss; returns the loss."""
    soft = soft_permutation(scores, tau=tau, n_iter=n_iter)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = midpoint_loss(model, spec, params_a, soft_apply(spec, soft, params_b), x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()
