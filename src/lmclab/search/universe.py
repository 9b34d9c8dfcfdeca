"""What every n-model method shares: a permutation ``π_i`` of each of N models into one
*universe* frame, the pairwise maps it implies, their cycle consistency, and the shared objective.

Convention (as :func:`lmclab.core.spec.apply_permutation`): ``π_i[g][k]`` is the unit of model i that
lands on universe unit ``k``. The map of model j into model i's frame is then
``π_{ij} = π_j ∘ π_i⁻¹`` (``π_{ij}[q] = π_j[π_i⁻¹[q]]``), the permutation WM(θ_i, θ_j) would return.
Maps derived from one universe are *cycle-consistent*, ``π_{ij} ∘ π_{jk} = π_{ik}``, by construction;
independent pairwise matchings are not.

The **shared objective** of MergeMany, C2M3, sync and star is the summed pairwise matching objective
``F = Σ_{i<j} ⟨π_i(θ_i), π_j(θ_j)⟩ = ((N − 1) Σ_i ‖θ_i‖² − N·D) / 2`` with MergeMany's
``D = Σ_i ‖π_i(θ_i) − θ̄‖²`` (permutations keep norms), so maximising F is minimising D.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import permutations
from typing import NamedTuple

import torch
from torch import Tensor

from lmclab.core.spec import Params, Permutation, PermutationSpec, apply_permutation


class UniverseResult(NamedTuple):
    """The result of every n-model method (:func:`lmclab.search.merge_many.merge_many` returns the same
    three fields)."""

    perms: list[Permutation]  # π_i for every model, in input order
    merged: Params  # mean of the aligned models (running statistics averaged too: repair them)
    stats: dict  # per method: the objective trace, "seconds", "assignments", ...


def mean_params(params: Sequence[Mapping[str, Tensor]]) -> Params:
    """Element-wise mean; integer buffers are taken from the first model."""
    return {
        k: torch.stack([p[k] for p in params]).mean(0) if v.is_floating_point() else v.clone()
        for k, v in params[0].items()
    }


def summed_distance(spec: PermutationSpec, params: Sequence[Mapping[str, Tensor]]) -> float:
    """``D = Σ_i ‖θ_i − θ̄‖²`` over the matched entries (running statistics excluded)."""
    mean = mean_params([spec.matched(p) for p in params])
    return sum(float((p[k].double() - m.double()).pow(2).sum()) for p in params for k, m in mean.items())


def shared_objective(spec: PermutationSpec, aligned: Sequence[Mapping[str, Tensor]]) -> float:
    """``F = Σ_{i<j} ⟨θ_i, θ_j⟩`` of models already in one frame, over the matched entries (float64)."""
    matched = [spec.matched(p) for p in aligned]
    total = {k: sum(p[k].double() for p in matched) for k in matched[0]}
    square = sum(float(v.pow(2).sum()) for v in total.values())
    return (square - sum(float(p[k].double().pow(2).sum()) for p in matched for k in p)) / 2


def aligned_models(spec: PermutationSpec, perms: Sequence[Permutation], params: Sequence[Mapping[str, Tensor]]):
    return [apply_permutation(spec, perm, p) for perm, p in zip(perms, params, strict=True)]


def universe_result(
    spec: PermutationSpec, perms: Sequence[Permutation], params: Sequence[Mapping[str, Tensor]], stats: dict
) -> UniverseResult:
    """The result of ``perms``: the merged model and, in ``stats``, the shared objective and D."""
    aligned = aligned_models(spec, perms, params)
    stats = {
        **stats,
        "objective_final": shared_objective(spec, aligned),
        "distance_final": summed_distance(spec, aligned),
    }
    return UniverseResult(list(perms), mean_params(aligned), stats)


def pairwise_maps(perms: Sequence[Permutation]) -> dict[tuple[int, int], Permutation]:
    """``π_{ij} = π_j ∘ π_i⁻¹`` for every ordered pair i ≠ j (module docstring)."""
    return {
        (i, j): {g: perms[j][g][perms[i][g].argsort()] for g in perms[i]} for i, j in permutations(range(len(perms)), 2)
    }


def cycle_error(maps: Mapping[tuple[int, int], Permutation], n_models: int) -> float:
    """The fraction of units, over every ordered triple (i, j, k) of distinct models and every group,
    that ``π_{ij} ∘ π_{jk}`` sends elsewhere than ``π_{ik}`` (θ_k → frame j → frame i, against θ_k →
    frame i). 0 for maps derived from one universe; None-free: needs N ≥ 3."""
    if n_models < 3:
        raise ValueError(f"n_models: a cycle needs at least 3 models, got {n_models}")
    wrong = total = 0
    for i, j, k in permutations(range(n_models), 3):
        for g, ik in maps[(i, k)].items():
            wrong += int((maps[(j, k)][g][maps[(i, j)][g]] != ik).sum())
            total += len(ik)
    return wrong / total
