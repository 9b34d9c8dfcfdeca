"""N models merged by every n-model method, side by side: what each method's universe frame
gives and what it costs.

Per method (:data:`lmclab.search.many_methods.MANY_METHODS`): the shared objective
``F = Σ_{i<j} ⟨π_i(θ_i), π_j(θ_j)⟩`` of its permutations and MergeMany's ``D = Σ_i ‖π_i(θ_i) − θ̄‖²``
(:mod:`lmclab.search.universe`), the **cycle error** of its pairwise maps ``π_{ij} = π_j ∘ π_i⁻¹`` over
every ordered triple (0 for a universe: measured, not assumed), the merged model's loss and accuracy
with and without repair, the test barriers at λ = ½ between ``θ_i`` and ``π_{ij}(θ_j)`` for every pair,
its wall time and the assignments it solved. The references: each model, the output ensemble, the
unaligned average, and **direct pairwise WM** (an independent ``WM(θ_i, θ_j)`` per pair: its barriers
are what each pair could reach alone, its cycle error what independence costs).

Repair of a merge (``repair``): ``none``; ``bn``, BatchNorm running statistics recomputed on
``repair_data``; ``repair``, REPAIR of the N endpoints (:func:`lmclab.core.repair.repair_merged`), its
targets the statistics of the *aligned* endpoints (the unaligned average is repaired with its own,
unaligned, endpoints: that is what naive merging is); ``auto``, ``bn`` for a network with BatchNorm
and ``repair`` for one without.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lmclab.core.bn_repair import repair_bn
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate, evaluate_ensemble
from lmclab.core.interpolation import barriers_from_curve, interpolation_curve
from lmclab.core.options import OptionError
from lmclab.core.repair import repair_merged
from lmclab.core.repairs import resolved_repair
from lmclab.core.spec import Params, Permutation, PermutationSpec, apply_permutation
from lmclab.core.transform import TransformResult
from lmclab.search.features import repair_transformed
from lmclab.search.many_methods import UNIVERSE, check_many, run_many
from lmclab.search.universe import UniverseResult, aligned_models, cycle_error, mean_params, pairwise_maps
from lmclab.search.weight_matching import weight_matching

PAIRWISE = "pairwise WM"  # the reference row of independent pairwise matchings
Merge = Callable[[Sequence[Mapping[str, Tensor]]], Params]  # aligned endpoints -> their repaired merge


class ManyComparison(NamedTuple):
    """What :func:`compare_many` measured (long-format rows for Parquet)."""

    results: dict[str, UniverseResult | TransformResult]  # per method
    evaluation: list[dict]  # method, model, repaired, split, loss, acc
    methods: list[dict]  # one row per method and the pairwise reference
    pairwise: list[dict]  # method, pair, test barriers at λ = ½ of θ_i and π_ij(θ_j)


def repaired_merge(repair: str, model: nn.Module, data: Split | None) -> Merge | None:
    """The merge of aligned endpoints under ``repair`` (module docstring); None for ``none``."""
    repair = resolved_repair(repair, model)
    if repair == "none":
        return None
    if data is None:
        raise OptionError(f"{{repair_data}}: repair {repair!r} needs training data, got None")
    if repair == "bn":
        return lambda aligned: repair_bn(model, mean_params(aligned), data)
    return lambda aligned: repair_merged(model, aligned, data)


def pair_barriers(
    model: nn.Module, params: Sequence[Mapping[str, Tensor]], maps: Mapping[tuple[int, int], Permutation], spec, test
) -> list[dict]:
    """Per pair i < j: the test barriers at λ = ½ between ``θ_i`` and ``π_{ij}(θ_j)`` (loss; accuracy in points)."""
    rows = []
    for i, j in combinations(range(len(params)), 2):
        permuted = apply_permutation(spec, maps[(i, j)], params[j])
        out = barriers_from_curve(interpolation_curve(model, params[i], permuted, [0.0, 0.5, 1.0], {"test": test}))
        rows.append({"i": i, "j": j, **{k: out[f"test_{k}"] for k in ("loss_barrier_mid", "acc_barrier_mid")}})
    return rows


def _method_row(method: str, stats: Mapping[str, Any], maps, n_models: int, barriers: list[dict]) -> dict:
    mean = {k: sum(b[k] for b in barriers) / len(barriers) for k in ("loss_barrier_mid", "acc_barrier_mid")}
    return {
        "method": method,
        "objective": stats.get("objective_final", float("nan")),
        "distance": stats.get("distance_final", float("nan")),
        "cycle_error": cycle_error(maps, n_models) if n_models >= 3 else float("nan"),
        "pair_test_loss_barrier_mid": mean["loss_barrier_mid"],
        "pair_test_acc_barrier_mid": mean["acc_barrier_mid"],
        "seconds": stats["seconds"],
        "assignments": stats.get("assignments", 0),
        "iterations": stats.get("iterations", 1),
    }


def direct_pairwise(spec: PermutationSpec, params: Sequence[Mapping[str, Tensor]], *, seed: int):
    """Independent ``WM(θ_i, θ_j)`` for every pair i < j (``π_{ji}`` its inverse): the maps and the
    searches' ``seconds`` and ``assignments``."""
    start, generator, maps, solves = time.perf_counter(), torch.Generator().manual_seed(seed), {}, 0
    for i, j in combinations(range(len(params)), 2):
        found = weight_matching(spec, params[i], params[j], generator=generator, restarts=1)
        maps[(i, j)] = found.perm
        maps[(j, i)] = {g: p.argsort() for g, p in found.perm.items()}
        solves += found.stats["assignments"]
    return maps, {"seconds": time.perf_counter() - start, "assignments": solves, "iterations": 1}


class _Run(NamedTuple):
    """What every method of one comparison shares."""

    model: nn.Module
    spec: PermutationSpec
    params: Sequence[Mapping[str, Tensor]]
    test: Split
    seed: int
    merge: Merge | None  # aligned endpoints -> their repaired merge
    repair: str
    repair_data: Split | None
    points: Mapping[str, list[str]] | None
    train: Split | None


def _universe(run: _Run, method: str, options: Mapping[str, Any]):
    """A universe method: its result, row, pair barriers and merges (plain, repaired) to evaluate."""
    result = run_many(method, run.spec, run.params, seed=run.seed, options=options)
    maps = pairwise_maps(result.perms)
    barriers = pair_barriers(run.model, run.params, maps, run.spec, run.test)
    merges = {False: result.merged}
    if run.merge is not None:
        merges[True] = run.merge(aligned_models(run.spec, result.perms, run.params))
    return result, _method_row(method, result.stats, maps, len(run.params), barriers), barriers, merges


def _transform(run: _Run, method: str, options: Mapping[str, Any]):
    """A transform method (CCA Merge, ZipIt!): no permutation, so no objective, cycle error or pair
    barriers; its merge plain and repaired (REPAIR to the transformed endpoints' statistics, or BatchNorm
    statistics recomputed). A partial zip is N networks sharing the zipped layers: their output ensemble."""
    result = run_many(
        method, run.spec, run.params, seed=run.seed, options=options, model=run.model, points=run.points, data=run.train
    )
    nan = float("nan")
    row = {"method": method, "objective": nan, "distance": nan, "cycle_error": nan, "iterations": 1}
    row |= {"pair_test_loss_barrier_mid": nan, "pair_test_acc_barrier_mid": nan, "assignments": 0}
    row["seconds"] = result.stats["seconds"]
    if result.merged is None:
        return result, row, [], {False: list(result.heads)}
    merges = {False: result.merged}
    if run.repair == "repair":
        merges[True] = repair_transformed(run.model, run.spec, run.params, result, run.repair_data)
    elif run.repair == "bn":
        merges[True] = repair_bn(run.model, result.merged, run.repair_data)
    return result, row, [], merges


def _evaluate_merges(model, method: str, merges: Mapping[bool, Any], splits: Mapping[str, Split]) -> list[dict]:
    rows = []
    for repaired, merged in merges.items():
        for split, data in splits.items():
            heads = isinstance(merged, list)  # a partial zip's networks: their output ensemble
            ev = evaluate_ensemble(model, merged, data) if heads else evaluate(model, merged, data)
            name = "heads ensemble" if heads else "merged"
            rows.append({"method": method, "model": name, "repaired": repaired, "split": split, **ev._asdict()})
    return rows


def _references(
    model: nn.Module,
    params: Sequence[Mapping[str, Tensor]],
    names: Sequence[str],
    merge: Merge | None,
    splits: Mapping[str, Split],
) -> list[dict]:
    """The evaluation rows of the references: the naive average (repaired too with ``merge``), each model
    and the output ensemble of all of them."""
    naive = {False: mean_params(params)} | ({True: merge(params)} if merge is not None else {})
    evaluation = [r | {"model": "average"} for r in _evaluate_merges(model, "naive", naive, splits)]
    for name, p in zip(names, params, strict=True):
        evaluation += [r | {"model": name} for r in _evaluate_merges(model, "models", {False: dict(p)}, splits)]
    ensemble = _evaluate_merges(model, "ensemble", {False: list(params)}, splits)  # the output ensemble
    return evaluation + [r | {"model": "ensemble"} for r in ensemble]


def compare_many(
    model: nn.Module,
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    names: Sequence[str],
    splits: Mapping[str, Split],
    *,
    methods: Mapping[str, Mapping[str, Any]],
    seed: int,
    repair: str = "none",
    repair_data: Split | None = None,
    points: Mapping[str, list[str]] | None = None,
    train: Split | None = None,
) -> ManyComparison:
    """Every method of ``methods`` (name -> its options) on the N models ``params`` (called ``names``),
    the references beside them (module docstring); ``splits`` must hold ``test``. The transform methods
    read activations at ``points`` (group -> module names) on ``train``."""
    if len(params) != len(names) or len(params) < 2:
        raise OptionError(
            f"{{params}}, {{names}}: expected as many names as models, at least 2; got {len(params)}, {len(names)}"
        )
    for method, options in methods.items():
        check_many(method, options)  # every bad option before any search
    repair = resolved_repair(repair, model)
    merge = repaired_merge(repair, model, repair_data)
    run = _Run(model, spec, params, splits["test"], seed, merge, repair, repair_data, points, train)
    evaluation = _references(model, params, names, merge, splits)
    maps, stats = direct_pairwise(spec, params, seed=seed)
    barriers = pair_barriers(model, params, maps, spec, splits["test"])
    rows, pairs, results = (
        [_method_row(PAIRWISE, stats, maps, len(params), barriers)],
        [{"method": PAIRWISE, **b} for b in barriers],
        {},
    )
    for method, options in methods.items():
        found = (_universe if method in UNIVERSE else _transform)(run, method, options)
        results[method], row, barriers, merges = found
        rows.append(row)
        pairs += [{"method": method, **b} for b in barriers]
        evaluation += _evaluate_merges(model, method, merges, splits)
    return ManyComparison(results, evaluation, rows, pairs)
