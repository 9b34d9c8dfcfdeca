"""Sinkhorn STE, "MidLoss" (Guerrero-Peña et al. 2023; SPEC.md §3).

``min_scores L((θa + π_soft(θb)) / 2)`` on training minibatches: the soft permutations of
:mod:`lmclab.search.sinkhorn` are trained with Adam on the task loss of the merged midpoint
model (paper: batch 512, 5 epochs). The hard permutation is the linear assignment on the final
scores; after every epoch the monitor (if any) records its L2 distance and merged test metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from lmclab.data import Split
from lmclab.search.midpoint import Monitor, midpoint_loss, minibatches
from lmclab.search.options import check_batch, check_options, positive_int
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import RULES as SINKHORN_RULES
from lmclab.search.sinkhorn import hard_permutation, init_scores, soft_apply, soft_permutation
from lmclab.spec import PermutationSpec

RULES = {**SINKHORN_RULES, "batch_size": positive_int}


def ste_sinkhorn(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor],
                 *, model: nn.Module, data: Split, generator: torch.Generator, lr: float = 1.0,
                 epochs: int = 5, batch_size: int = 512, tau: float = 1.0, sinkhorn_iters: int = 20,
                 monitor: Monitor | None = None) -> SearchResult:
    """Adam on the Sinkhorn scores against the midpoint loss; ``stats['curve']``: one row per epoch."""
    check_options("ste_sinkhorn", RULES, {"lr": lr, "epochs": epochs, "batch_size": batch_size,
                                          "tau": tau, "sinkhorn_iters": sinkhorn_iters})
    check_batch("ste_sinkhorn", batch_size, len(data))
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    params_a = {k: v.detach() for k, v in params_a.items()}
    params_b = {k: v.detach() for k, v in params_b.items()}
    scores = {g: s.requires_grad_() for g, s in init_scores(spec.group_sizes(params_a), generator,
                                                              device).items()}
    optimizer = torch.optim.Adam(scores.values(), lr=lr)
    data = data.to(device)
    curve = [{"epoch": 0, "train_loss": None, **(monitor(hard_permutation(scores)) if monitor else {})}]
    for epoch in range(1, epochs + 1):
        total, batches = 0.0, minibatches(len(data), batch_size, generator)
        for idx in batches:
            permuted_b = soft_apply(spec, soft_permutation(scores, tau=tau, n_iter=sinkhorn_iters),
                                    params_b)
            loss = midpoint_loss(model, spec, params_a, permuted_b, data.x[idx], data.y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        row = {"epoch": epoch, "train_loss": total / len(batches)}
        curve.append({**row, **(monitor(hard_permutation(scores)) if monitor else {})})
    return SearchResult(hard_permutation(scores), {"curve": curve, "epochs": epochs,
                                                   "seconds": time.perf_counter() - start})
