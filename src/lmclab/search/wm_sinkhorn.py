"""Weight matching via Sinkhorn, "DistL2Loss" (Guerrero-Peña et al. 2023; the paper's Appendix D.2).

``min_scores ‖θa − π_soft(θb)‖² / N`` — the squared distance *averaged* over the N matched entries,
as the authors' ``DistL2Loss`` computes it — with ``π_soft`` the per-group doubly-stochastic
matrices of :mod:`lmclab.search.sinkhorn`, optimised by Adam on the free scores for
``epochs × iterations`` steps (paper: lr 1, 10 × 100; here 100 × 10 by default: the same 1,000 steps,
scored every 10). Data-free.

Why the mean: Adam is invariant to the loss's scale except through its ε, so the mean is Adam on the
sum with ε·N, and that damping keeps the scores of near-zero entries from growing without bound
(with the sum the soft permutations sharpen all at once and the search falls to a worse permutation).
The same ε makes ``lr`` depend on the model's size: the mean's gradient falls with N and the group
width, and below ε an Adam step is ≈ lr·g/ε, so a wide model at lr 1 may never change its hard
permutation (:func:`start_gradients` measures it; the paper raises lr to 10 for ResNet50).
:func:`stalled` detects that case; ``wm_sinkhorn`` then warns (:class:`StalledSearchWarning`) and
records ``stats["stalled"]``.

After every epoch the current hard permutation (linear assignment on the scores; the structured one
of :func:`~lmclab.search.sinkhorn.hard_permutation` for headed groups) is scored by
``⟨θa, π(θb)⟩``, the quantity DistL2 minimises over hard permutations; ``select='best'`` returns
the best scored one, ``'last'`` the final one (the authors' code). ``patience`` (default 10: a hundred
steps) stops the search once that many consecutive epochs have not raised the best objective (a few
units keep swapping while the objective plateaus, so a stop on an unchanged permutation alone would
rarely fire); ``patience=None`` runs the fixed schedule, and ``epochs=10, iterations=100, patience=None``
is the paper's. How the steps are grouped into epochs does not change them (one Adam trajectory), only
where they are scored. The
monitor (if any) records the merged test metrics of each epoch's permutation (the paper's Figure 6).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import torch
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions
from lmclab.core.callers import caller_level
from lmclab.core.options import Count, Positive, one_of, option, takes
from lmclab.core.spec import Permutation, PermutationSpec
from lmclab.search.midpoint import Monitor
from lmclab.search.result import SearchResult
from lmclab.search.sinkhorn import hard_permutation, soft_apply, soft_permutation
from lmclab.search.soft_orthogonal import start_mixed
from lmclab.search.weight_matching import matching_objective

SELECTIONS = ("best", "last")
INITS = ("identity", "wm")  # where the scores start: the authors' noisy identity, or moved to coordinate-descent WM's
ADAM_EPS = 1e-8  # Adam's ε (torch's default, the authors' code): it sets the step below it (module doc)


class StalledSearchWarning(RuntimeWarning):
    """A Sinkhorn search whose hard permutation never left its start: it returned no alignment."""


def stalled(curve: Sequence[Mapping]) -> bool:
    """Whether a search's per-epoch ``curve`` (rows with ``changed``: units moved since the last
    epoch; the first row is the start) never changed its hard permutation. A curve without
    ``changed`` counts (coordinate descent, STE) or with no epoch after the start is not stalled."""
    after = curve[1:]
    return bool(after) and all(row.get("changed") == 0 for row in after)


class WMSinkhornOptions(AssignmentOptions):
    """Options of :func:`wm_sinkhorn` (defaults: the paper's 1,000 Adam steps at lr 1, scored every 10, stopped
    after 10 scores without a better one; the paper's schedule: ``epochs=10, iterations=100, patience=None``)."""

    lr: Positive = option(1.0, "Sinkhorn WM: Adam learning rate on the score matrices (paper: 1)")
    epochs: Count = option(100, "Sinkhorn WM: epochs, each scored by its hard permutation (paper: 10 × 100 steps)")
    iterations: Count = option(10, "Sinkhorn WM: Adam steps per epoch (paper: 100)")
    tau: Positive = option(1.0, "Sinkhorn WM: temperature (smaller = closer to a hard permutation)")
    sinkhorn_iters: Count = option(20, "Sinkhorn WM: column+row normalisations per soft permutation")
    select: one_of(SELECTIONS) = option("best", "Sinkhorn WM: best epoch by ⟨θa, π(θb)⟩, or last (authors' code)")
    patience: Count | None = option(
        10, "Sinkhorn WM: stop after this many epochs without a better ⟨θa, π(θb)⟩ (null: never, the paper's)"
    )
    init: one_of(INITS) = option(
        "identity", "Sinkhorn WM: initial scores at the identity (authors) or at weight matching's permutation"
    )


def distance_loss(
    spec: PermutationSpec,
    scores: Mapping[str, Tensor],
    params_a: Mapping[str, Tensor],
    matched_b: Mapping[str, Tensor],
    *,
    tau: float,
    n_iter: int,
) -> Tensor:
    """``Σ ‖θa − π_soft(θb)‖² / N`` over the N matched entries (the authors' ``DistL2Loss``)."""
    permuted = soft_apply(spec, soft_permutation(scores, tau=tau, n_iter=n_iter, heads=spec.heads), matched_b)
    total = sum((params_a[k] - v).pow(2).sum() for k, v in permuted.items())
    return total / sum(v.numel() for v in permuted.values())


@takes(WMSinkhornOptions)
def wm_sinkhorn(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    generator: torch.Generator,
    options: WMSinkhornOptions,
    monitor: Monitor | None = None,
) -> SearchResult:
    """Adam on the Sinkhorn scores (options: :class:`WMSinkhornOptions`); ``stats['curve']`` has one
    row per epoch (epoch 0: the start)."""
    iterations, tau, n_iter, patience = options.iterations, options.tau, options.sinkhorn_iters, options.patience
    start = time.perf_counter()
    device = next(iter(params_a.values())).device
    params_a, matched_b, scores = _start(
        spec, params_a, params_b, generator, device, init=options.init, lap_backend=options.lap_backend
    )
    start_scores = {g: s.detach().clone() for g, s in scores.items()}
    hard = partial(hard_permutation, scores, tau=tau, n_iter=n_iter, heads=spec.heads, lap_backend=options.lap_backend)
    optimizer = torch.optim.Adam(scores.values(), lr=options.lr, eps=ADAM_EPS)
    track = _Tracker(spec, params_a, params_b, monitor, start)
    track(0, None, hard())
    loss = partial(distance_loss, spec, scores, params_a, matched_b, tau=tau, n_iter=n_iter)
    for epoch in range(1, options.epochs + 1):
        track(epoch, _descend(optimizer, loss, iterations) / iterations, hard())
        if patience is not None and track.stale >= patience:
            break
    best, perm = (track.best, track.best_perm) if options.select == "best" else (track.curve[-1], track.last_perm)
    if stuck := stalled(track.curve):
        _warn_stalled(_stall_message(track.curve, options, scores, start_scores))
    return SearchResult(
        perm,
        {
            "curve": track.curve,
            "stalled": stuck,
            "epochs": track.curve[-1]["epoch"],
            "best_epoch": best["epoch"],
            "lap_backend": options.lap_backend,
            "seconds": time.perf_counter() - start,
        },
    )


def _descend(optimizer: torch.optim.Optimizer, loss: Callable[[], Tensor], iterations: int) -> float:
    """``iterations`` Adam steps on the DistL2 ``loss`` (one epoch); the sum of their losses."""
    total = 0.0
    for _ in range(iterations):
        value = loss()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        total += value.item()
    return total


def start_gradients(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    generator: torch.Generator,
    tau: float = 1.0,
    n_iter: int = 20,
) -> dict[str, dict[str, float]]:
    """Per group, the gradient of the mean DistL2 loss at the search's start scores (the seeded
    noisy identity): its RMS and largest entry, the RMS over Adam's ε, and the RMS of Adam's first
    step at lr 1 (``g / (|g| + ε)`` elementwise: bias-corrected moments of one step), against which
    the start's diagonal margin of 1 must be crossed for the hard permutation to change."""
    device = next(iter(params_a.values())).device
    params_a, matched_b, scores = _start(spec, params_a, params_b, generator, device, init="identity")
    distance_loss(spec, scores, params_a, matched_b, tau=tau, n_iter=n_iter).backward()
    out = {}
    for g, s in scores.items():
        grad = s.grad.double()
        rms = float(grad.pow(2).mean().sqrt())
        step = grad / (grad.abs() + ADAM_EPS)
        out[g] = {
            "n": s.shape[-1],
            "rms_grad": rms,
            "max_grad": float(grad.abs().max()),
            "rms_over_eps": rms / ADAM_EPS,
            "first_step_rms": float(step.pow(2).mean().sqrt()),
        }
    return out


def _start(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    generator: torch.Generator,
    device: torch.device,
    *,
    init: str,
    lap_backend: str = "auto",
) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """θa and θb's matched entries detached, and the start scores requiring grad (:func:`start_scores`)."""
    matched_b = {k: v.detach() for k, v in spec.matched(params_b).items()}
    params_a = {k: v.detach() for k, v in params_a.items()}
    scores = start_scores(
        spec, params_a, params_b, init=init, generator=generator, device=device, lap_backend=lap_backend
    )
    dtype = next((v.dtype for v in matched_b.values() if v.is_floating_point()), torch.float32)  # float64 in, out
    return params_a, matched_b, {g: s.to(dtype).requires_grad_() for g, s in scores.items()}


def start_scores(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    init: str,
    generator: torch.Generator,
    device: torch.device | str,
    lap_backend: str,
) -> dict[str, Tensor]:
    """The noisy identity of :func:`~lmclab.search.sinkhorn.init_scores`; for ``init="wm"`` moved
    (:func:`~lmclab.search.sinkhorn.scores_at`) to the permutation of coordinate-descent weight matching
    (one start, ``generator`` drawn after the scores), whose hard permutation it then is."""
    options = {"init": init, "generator": generator, "device": device, "lap_backend": lap_backend}
    return start_mixed(spec, params_a, params_b, **options)[0]


def _warn_stalled(message: str) -> None:
    warnings.warn(message, StalledSearchWarning, stacklevel=caller_level())


def _stall_message(curve: list[dict], options: WMSinkhornOptions, scores: Mapping, start: Mapping) -> str:
    steps = curve[-1]["epoch"] * options.iterations
    drift = max(float((scores[g].detach() - start[g]).abs().max()) for g in scores)
    found = "no alignment was found" if options.init == "identity" else "it returned weight matching's permutation"
    return (
        f"wm_sinkhorn: the hard permutation never left its start in {steps} Adam steps (scores moved at most "
        f"{drift:.2g}): the mean DistL2 gradients are below Adam's ε for a model this size, so a step is "
        f"≈ lr·gradient/ε; {found} — raise lr (it was {options.lr:g})"
    )


class _Tracker:
    """The curve of hard permutations: one row per epoch with ``soft_loss`` (the epoch's mean
    DistL2 loss), ``objective`` ⟨θa, π(θb)⟩, ``changed`` (units whose position moved since the last
    epoch), ``seconds`` since the start (monitoring of earlier rows included) and the monitor's
    columns; keeps the best row by objective and counts the epochs since it was last raised (``stale``)."""

    def __init__(
        self,
        spec: PermutationSpec,
        params_a: Mapping[str, Tensor],
        params_b: Mapping[str, Tensor],
        monitor: Monitor | None,
        start: float,
    ) -> None:
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
        row = {
            "epoch": epoch,
            "soft_loss": soft_loss,
            "objective": objective,
            "changed": changed,
            "seconds": time.perf_counter() - self.start,
        }
        self.curve.append({**row, **(self.monitor(perm) if self.monitor else {})})
        self.last_perm = perm
        if not self.best or objective > self.best["objective"]:
            self.best, self.best_perm, self.stale = self.curve[-1], perm, 0
        else:
            self.stale += 1
