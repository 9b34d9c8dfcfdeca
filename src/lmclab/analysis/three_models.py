"""Three-model linear mode connectivity (the paper's Section 6.3 and Table 3).

θb and θc are each aligned to θa (π_b, π_c, same method); the headline is the barrier between
π_b(θb) and π_c(θc), which were never matched to each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lmclab.analysis.alignment import alignment_r, layer_names, model_factors
from lmclab.analysis.compose import r_key
from lmclab.analysis.landscape import landscape, plane_grid
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.bn_repair import repair_subset
from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World
from lmclab.core.interpolation import Repair, RepairAt, barriers_from_curve, interpolation_curve
from lmclab.core.metrics import l2_distance
from lmclab.core.spec import Params, Permutation, PermutationSpec, apply_permutation, check_permutation
from lmclab.search import SearchProblem, run_search
from lmclab.search.registered import search_problem
from lmclab.search.result import SearchResult

EDGES = (("a", "b"), ("a", "c"), ("b", "c"))  # b–c is the pair never matched directly


def three_model_barriers(
    spec: PermutationSpec,
    model: nn.Module,
    models: Mapping[str, Mapping[str, Tensor]],
    lams: Sequence[float],
    splits: Mapping[str, Split],
    *,
    gammas: Sequence[float] = (0.3,),
    repair: Repair | None = None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
) -> tuple[list[dict], list[dict]]:
    """Curves and barriers for every pair of ``models`` = {"a": θa, "b": π_b(θb), "c": π_c(θc)}.

    Along edge (x, y), ``λ = 1`` is model x and ``λ = 0`` model y. Returns (curve rows, one
    summary row per edge with every barrier of :func:`barriers_from_curve`, the L2 distance and
    ``R_γ`` for each γ (Theorem 4.1, kernels reshaped; the paper's Figure 5 uses γ = 0.3)).
    With ``repair`` (BN repair) or ``repair_at`` (REPAIR), as in
    :func:`lmclab.core.interpolation.measure_pair_with_repair`: each edge is measured without and with
    it (curve rows carry ``repair``), its barriers are the repaired ones and the plain ones are kept as
    ``norepair_<key>``; ``bn_repair`` and ``ln_repair`` say which case it is."""
    if repair is not None and repair_at is not None:
        raise ValueError("repair, repair_at: expected at most one of them")
    layers = layer_names(spec, models["a"])
    factors = {k: model_factors(p, layers) for k, p in models.items()}
    flags = {"bn_repair": repair is not None, "ln_repair": repair_at is not None}
    curves, summaries = [], []
    for x, y in EDGES:
        edge = f"{x}-{y}"
        plain = interpolation_curve(model, models[x], models[y], lams, splits, world=world)
        curves += [{"edge": edge, **r, "repair": False} for r in plain]
        barriers = barriers_from_curve(plain)
        if repair is not None or repair_at is not None:
            fixed = interpolation_curve(
                model, models[x], models[y], lams, splits, repair=repair, repair_at=repair_at, world=world
            )
            curves += [{"edge": edge, **r, "repair": True} for r in fixed]
            barriers = {**barriers_from_curve(fixed), **{f"norepair_{k}": v for k, v in barriers.items()}}
        summaries.append(
            {
                "edge": edge,
                **barriers,
                "l2": l2_distance(spec, models[x], models[y]),
                **{r_key(g): alignment_r(factors[x], factors[y], g) for g in gammas},
                **flags,
            }
        )
    return curves, summaries


def _check_aligned(key: str, perm: Permutation, spec: PermutationSpec, params: Mapping[str, Tensor]) -> None:
    try:
        check_permutation({g: p.cpu() for g, p in perm.items()}, spec.group_sizes(params), spec.heads, spec.kinds)
    except ValueError as err:
        raise ValueError(f"aligned[{key!r}]: {err}") from None


class TripleResult(NamedTuple):
    perms: dict[str, Permutation]  # "b", "c" -> the permutation aligning it to θa
    edges: list[dict]  # one summary row per edge
    curves: list[dict]  # long-format interpolation rows with an "edge" column
    landscape: list[dict]  # (u, v, x, y, loss, acc) on the test split
    search: dict[str, dict]  # search stats of π_b and π_c


def _curves_train(train: Split, train_samples: int | None) -> Split:
    """The fixed random subset of ``train`` the edges' train curves are measured on (None: all of it)."""
    return repair_subset(train, train_samples, key="train_samples")


def _align_to_a(
    method: str,
    ckpts: Mapping[str, Checkpoint],
    train: Split,
    options: Mapping,
    seed: int,
    device: torch.device,
    aligned: dict[str, SearchResult],
    symmetry: Mapping[str, Any],
) -> tuple[SearchProblem, dict[str, Params], dict[str, Permutation], dict[str, dict]]:
    """θb and θc aligned to θa by ``method`` (or as ``aligned`` gives them, checked): the search problem
    of the last, the three endpoints on ``device`` (π_b(θb), π_c(θc)), the permutations and search stats."""
    a = ckpts["a"]
    if set(aligned) - {"b", "c"}:
        raise ValueError(f"aligned: expected keys among 'b', 'c', got {sorted(aligned)}")
    on = {k: {n: v.to(device) for n, v in c.state_dict.items()} for k, c in ckpts.items()}
    models, perms, search = {"a": on["a"]}, {}, {}
    for k in "bc":
        problem = search_problem(a.arch, a.config, on["a"], on[k], device=device, train=train, **symmetry)
        if k in aligned:
            _check_aligned(k, aligned[k].perm, problem.spec, on[k])
        result = aligned.get(k) or run_search(method, problem, seed=seed, options=options)
        perms[k], search[k] = {g: p.to(device) for g, p in result.perm.items()}, result.stats
        models[k] = apply_permutation(problem.spec, result.perm, on[k])
    return problem, models, perms, search


def connect_triple(
    method: str,
    ckpts: Mapping[str, Checkpoint],
    train: Split,
    test: Split,
    *,
    options: Mapping,
    seed: int,
    lams: Sequence[float],
    resolution: int,
    margin: float,
    device: torch.device,
    gammas: Sequence[float] = (0.3,),
    repair: Repair | None = None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
    aligned: Mapping[str, SearchResult] | None = None,
    train_samples: int | None = None,
    spec: PermutationSpec | None = None,
    points: Mapping[str, Any] | None = None,
) -> TripleResult:
    """Align θb and θc to θa with ``method``; barriers on all edges (with BN ``repair`` or REPAIR
    ``repair_at`` too, :func:`three_model_barriers`); the plane's landscape (BN-repaired with ``repair``;
    REPAIR's targets are defined between two endpoints, so the plane is not REPAIRed) (with
    ``world``, every process searches alike and evaluates its shard of the data).

    ``aligned`` holds alignments to θa already found for "b" and/or "c" (the pipeline passes the
    permute stage's θb → θa, found by the same method, options and seed: the search it replaces is
    deterministic, so the triple is the same); those are checked against the spec, not searched again.
    ``train_samples``: the edges' train curves on a fixed random subset of that many samples (None: all; the
    search reads all of ``train``). ``spec`` and ``points`` replace the architecture's (the tracer's, with the
    kinds of orthogonal groups, for canonical forms: :func:`lmclab.archs.canonical.symmetric_forms`)."""
    grid, curve_train = plane_grid(resolution, margin), _curves_train(train, train_samples)  # before any search
    symmetry = {"spec": spec, "points": points}
    problem, models, perms, search = _align_to_a(
        method, ckpts, train, options, seed, device, dict(aligned or {}), symmetry
    )
    spec, model, measured = problem.spec, problem.model, {"repair": repair, "world": world}
    splits = {"train": curve_train, "test": test}
    curves, edges = three_model_barriers(
        spec, model, models, lams, splits, gammas=gammas, repair_at=repair_at, **measured
    )
    keys = sorted(spec.matched(models["a"]))
    plane = landscape(model, models["a"], models["b"], models["c"], grid, test, keys=keys, **measured)
    return TripleResult(
        {k: {g: p.cpu() for g, p in perm.items()} for k, perm in perms.items()}, edges, curves, plane, search
    )
