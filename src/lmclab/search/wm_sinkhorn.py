"""Weight matching via Sinkhorn, "DistL2Loss" (Guerrero-Peña et al. 2023; SPEC.md §3).

``min_scores ‖θa − π_soft(θb)‖² / N`` — the squared distance *averaged* over the N matched entries,
as the authors' ``DistL2Loss`` computes it — with ``π_soft`` the per-group doubly-stochastic
matrices of :mod:`lmclab.search.sinkhorn`, optimised by Adam on the free scores for
``epochs × iterations`` steps (paper: lr 1, 10 × 100). Data-free.

Why the mean matters: Adam is invariant to the scale of the loss except through its ε (1e-8), so
the mean is Adam on the sum with ε·N (≈ 0.0093 for the 3 × 512 MLP) — and that damping is what
keeps the search stable. Entries of a soft permutation that are nearly 0 have gradients far below
any real signal; with the sum and a negligible ε, Adam still moves each such score by ≈ lr per
step, the scores' range grows without bound (42 after 100 steps at lr 1 on the MNIST pair, 68 after
600, 121 after 800), the soft permutations sharpen all at once, and the search falls to a worse
permutation (⟨θa, π(θb)⟩ 111.0 → 86.3 in one epoch; README "Sinkhorn methods"). With the mean,
the same entries move by ≈ lr·g/ε and the range stays between 15 and 25 over the 1,000 steps.

After every epoch the current hard permutation (linear assignment on the scores) is scored by
``⟨θa, π(θb)⟩``, the quantity DistL2 minimises over hard permutations; ``select='best'`` returns
the best scored one, ``'last'`` the final one (the authors' code). ``patience`` stops the search
once that many consecutive epochs have not raised the best objective — in particular once the hard
permutation has stopped changing; at lr 1 a few units keep swapping (tens of 1,536 per 10 steps on
the MNIST pair) while the objective plateaus, so a stop on an unchanged permutation alone would
rarely fire. The monitor (if any) records the merged test metrics of each epoch's permutation
(the paper's Figure 6).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.search.midpoint import Monitor
from lmclab.search.options import check_options, one_of, optional, positive_int
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import RULES as SINKHORN_RULES
from lmclab.search.sinkhorn import hard_permutation, init_scores, soft_apply, soft_permutation
from lmclab.search.weight_matching import matching_objective
from lmclab.core.spec import Permutation, PermutationSpec


RULES = {**SINKHORN_RULES, "iterations": positive_int, "select": one_of("best", "last"),
         "patience": optional(positive_int)}


def distance_loss(spec: PermutationSpec, scores: Mapping[str, Tensor], params_a: Mapping[str, Tensor],
                  matched_b: Mapping[str, Tensor], *, tau: float, n_iter: int) -> Tensor:
    """``Σ ‖θa − π_soft(θb)‖² / N`` over the N matched entries (the authors' ``DistL2Loss``)."""
    permuted = soft_apply(spec, soft_permutation(scores, tau=tau, n_iter=n_iter), matched_b)
    total = sum((params_a[k] - v).pow(2).sum() for k, v in permuted.items())
    return total / sum(v.numel() for v in permuted.values())


def wm_sinkhorn(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor],
                *, generator: torch.Generator, lr: float = 1.0, epochs: int = 10,
                iterations: int = 100, tau: float = 1.0, sinkhorn_iters: int = 20,
                select: str = "best", patience: int | None = None,
                monitor: Monitor | None = None) -> SearchResult:
    """Adam on the Sinkhorn scores; ``stats['curve']`` has one row per epoch (epoch 0: the start)."""
    check_options("wm_sinkhorn", RULES, {"lr": lr, "epochs": epochs, "iterations": iterations,
                                         "tau": tau, "sinkhorn_iters": sinkhorn_iters,
                                         "select": select, "patience": patience})
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    matched_b = {k: v.detach() for k, v in spec.matched(params_b).items()}
    params_a = {k: v.detach() for k, v in params_a.items()}
    scores = {g: s.requires_grad_() for g, s in init_scores(spec.group_sizes(params_a), generator,
                                                              device).items()}
    optimizer = torch.optim.Adam(scores.values(), lr=lr)
    track = _Tracker(spec, params_a, params_b, monitor, start)
    track(0, None, hard_permutation(scores))
    for epoch in range(1, epochs + 1):
        total = 0.0
        for _ in range(iterations):
            loss = distance_loss(spec, scores, params_a, matched_b, tau=tau, n_iter=sinkhorn_iters)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        track(epoch, total / iterations, hard_permutation(scores))
        if patience is not None and track.stale >= patience:
            break
    best, perm = (track.best, track.best_perm) if select == "best" else (track.curve[-1], track.last_perm)
    return SearchResult(perm, {
        "curve": track.curve, "epochs": track.curve[-1]["epoch"], "best_epoch": best["epoch"],
        "seconds": time.perf_counter() - start})


class _Tracker:
    """The curve of hard permutations: one row per epoch with ``soft_loss`` (the epoch's mean
    DistL2 loss), ``objective`` ⟨θa, π(θb)⟩, ``changed`` (units whose position moved since the last
    epoch), ``seconds`` since the start (monitoring of earlier rows included) and the monitor's
    columns; keeps the best row by objective and counts the epochs since it was last raised (``stale``)."""

    def __init__(self, spec: PermutationSpec, params_a: Mapping[str, Tensor],
                 params_b: Mapping[str, Tensor], monitor: Monitor | None, start: float) -> None:
        self.spec, self.params_a, self.params_b, self.monitor = spec, params_a, params_b, monitor
        self.start = start
        self.curve: list[dict] = []
        self.last_perm: Permutation | None = None
        self.best_perm: Permutation | None = None
        self.best: dict = {}
        self.stale = 0

    def __call__(self, epoch: int, soft_loss: float | None, perm: Permutation) -> None:
        last = self.last_perm
        changed = None if last is None else sum(int((perm[g] != last[g]).sum()) for g in perm)
        objective = matching_objective(self.spec, perm, self.params_a, self.params_b)
        row = {"epoch": epoch, "soft_loss": soft_loss, "objective": objective, "changed": changed,
               "seconds": time.perf_counter() - self.start}
        self.curve.append({**row, **(self.monitor(perm) if self.monitor else {})})
        self.last_perm = perm
        if not self.best or objective > self.best["objective"]:
            self.best, self.best_perm, self.stale = self.curve[-1], perm, 0
        else:
            self.stale += 1
