"""Weight matching via Sinkhorn, "DistL2Loss" (Guerrero-Peña et al. 2023; SPEC.md §3).

``min_scores ‖θa − π_soft(θb)‖²`` over the matched entries (running statistics excluded), with
``π_soft`` the per-group doubly-stochastic matrices of :mod:`lmclab.search.sinkhorn`, optimised
by Adam on the free scores for ``epochs × iterations`` steps (paper: lr 1, 10 × 100). Data-free.
The hard permutation is the linear assignment on the final scores. After every epoch the
monitor (if any) records the current hard permutation's L2 distance and merged test metrics
(the paper's Figure 6).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.search.midpoint import Monitor
from lmclab.search.options import check_options, positive_int
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import RULES as SINKHORN_RULES
from lmclab.search.sinkhorn import hard_permutation, init_scores, soft_apply, soft_permutation
from lmclab.spec import PermutationSpec

RULES = {**SINKHORN_RULES, "iterations": positive_int}


def distance_loss(spec: PermutationSpec, scores: Mapping[str, Tensor], params_a: Mapping[str, Tensor],
                  matched_b: Mapping[str, Tensor], *, tau: float, n_iter: int) -> Tensor:
    """``Σ ‖θa − π_soft(θb)‖²`` over the matched entries."""
    permuted = soft_apply(spec, soft_permutation(scores, tau=tau, n_iter=n_iter), matched_b)
    return sum((params_a[k] - v).pow(2).sum() for k, v in permuted.items())


def wm_sinkhorn(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor],
                *, generator: torch.Generator, lr: float = 1.0, epochs: int = 10,
                iterations: int = 100, tau: float = 1.0, sinkhorn_iters: int = 20,
                monitor: Monitor | None = None) -> SearchResult:
    """Adam on the Sinkhorn scores; ``stats['curve']`` has one row per epoch (epoch 0: the start)."""
    check_options("wm_sinkhorn", RULES, {"lr": lr, "epochs": epochs, "iterations": iterations,
                                         "tau": tau, "sinkhorn_iters": sinkhorn_iters})
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    matched_b = {k: v.detach() for k, v in spec.matched(params_b).items()}
    params_a = {k: v.detach() for k, v in params_a.items()}
    scores = {g: s.requires_grad_() for g, s in init_scores(spec.group_sizes(params_a), generator,
                                                              device).items()}
    optimizer = torch.optim.Adam(scores.values(), lr=lr)
    curve = [_row(0, None, scores, monitor)]
    for epoch in range(1, epochs + 1):
        total = 0.0
        for _ in range(iterations):
            loss = distance_loss(spec, scores, params_a, matched_b, tau=tau, n_iter=sinkhorn_iters)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        curve.append(_row(epoch, total / iterations, scores, monitor))
    return SearchResult(hard_permutation(scores), {"curve": curve, "epochs": epochs,
                                                   "seconds": time.perf_counter() - start})


def _row(epoch: int, soft_loss: float | None, scores: Mapping[str, Tensor],
         monitor: Monitor | None) -> dict:
    """``soft_loss``: the epoch's mean ‖θa − π_soft(θb)‖² (None before training)."""
    row = {"epoch": epoch, "soft_loss": soft_loss}
    return {**row, **(monitor(hard_permutation(scores)) if monitor else {})}
