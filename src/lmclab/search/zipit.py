"""ZipIt! (Stoica et al. 2024, "ZipIt! Merging Models from Different Tasks without Training") for N models.

For each group, the features of all N models at the group's activation points are concatenated
(``D = N·n`` features; the statistics activation matching reads, :mod:`lmclab.search.features`) and
their Pearson correlation ``C`` (D × D) computed. Starting from D singleton clusters, ZipIt! greedily
merges the pair of clusters with the highest correlation until ``n`` clusters remain; a merged
cluster's correlation with any other is the smallest over their members (complete linkage, as in the
authors' code). The merge matrix averages a cluster's members and the unmerge matrix copies the merged
feature back to each (Section 4):

    M_i[k, j] = 1/|c_k|,   U_i[j, k] = 1      for feature j of model i in cluster c_k,

and θ = Σ_i M_i θ_i U_i (:func:`lmclab.core.transform.transform_merge`).

``within_model`` (the paper's default): features of the same model may merge ("zip" redundant
features of one model); without it a cluster holds at most one feature per model (for N = 2: a greedy
maximum-correlation matching, a permutation per model). ``partial_zip = k`` (Section 4.3, "partial
zipping"): zip only the first k groups and keep each model's later layers, fed the zipped features through
``U_i`` (:func:`lmclab.core.transform.partial_merge`); the merged network needs REPAIR
(:func:`lmclab.search.features.repair_transformed`). ``alpha`` and ``beta`` (Section 4.3) steer the greedy
as in the authors' code (:class:`ZipItOptions`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from lmclab.core.batches import Batches
from lmclab.core.options import Count, Factor, NonNegative, OptionError, Options, option, takes
from lmclab.core.spec import PermutationSpec
from lmclab.core.transform import Transform, TransformResult, partial_merge, transform_merge
from lmclab.search.features import check_models, feature_statistics


class ZipItOptions(Options):
    """Options of :func:`zipit`.

    ``within_model`` false: a cluster holds at most one feature per model, and so that the
    greedy always ends with exactly n clusters for any N, every merge joins a cluster holding one of model
    0's features (n such clusters exist, and a feature of model i can always join one that lacks model i);
    for N = 2 that is every cross-model merge, the result is a permutation per model and the greedy is a
    greedy maximum-correlation matching (at most AM's optimum on the Pearson correlation).

    Section 4.3's two extra hyperparameters, with the semantics of the authors' code (gstoica27/ZipIt,
    ``match_tensors_zipit``):

    - ``alpha`` (α ∈ (0, 1], against repeated matching of one feature): the merged cluster's linkage to every
      other cluster is ``α · min(link_i, link_j)``; the links of i and j carry their own earlier factors, so
      the penalty compounds (a cluster grown by k merges carries up to k factors α: a feature merged twice is
      at α², not α) and a cluster that already absorbed features loses to a fresh pair of nearly the same
      correlation. The authors' default is α = 0.3; ours is 1 (no penalty, the plain greedy). A negative
      linkage moves towards 0 (favoured, not penalised), as in the authors' code; their α ≤ 0 (which instead
      forbids a merged cluster the models of its members) is not offered. Without ``within_model`` and N = 2
      a merged cluster holds both models and never merges again: α is moot there.
    - ``beta`` (β ≥ 0, the same-model budget): a merge is *same-model* when both clusters' representatives
      (their lowest-index features) belong to one model m, and each model may make at most
      ``b = ⌊β·⌊(D − n)/N⌋⌋`` of them (the authors use β = 0.125; ours defaults to null, no budget). Once m has
      spent b, no two clusters represented by m merge. The authors' code checks the budget only after a
      merge, so a model with b = 0 still makes one; here b = 0 means none (for b ≥ 1 both make exactly b).
      The budget counts representatives, not features: {x_0, y_1} (represented by model 0) may still take a
      second feature of model 1. Without ``within_model`` no same-model merge can happen and β is moot.
    """

    within_model: bool = option(True, "ZipIt!: features of one model may merge (false: only across models)")
    alpha: Factor = option(
        1.0,
        "ZipIt!: a merged cluster's correlations times α, compounding per merge (Section 4.3; authors: 0.3; 1: off)",
    )
    beta: NonNegative | None = option(
        None,
        "ZipIt!: same-model merges per model at most ⌊β·⌊(D−n)/N⌋⌋ (Section 4.3; authors: 0.125; null: no limit; "
        "moot if within_model is false)",
    )
    partial_zip: Count | None = option(
        None, "ZipIt!: zip only the first k groups (the spec's order), keep each model's later layers (null: all)"
    )
    batch_size: Count = option(1000, "ZipIt!: inputs per forward pass")
    max_samples: Count | None = option(None, "ZipIt!: training inputs used (null: all)")


def _budgets(beta: float | None, sizes: Sequence[int]) -> list[float]:
    """Each model's same-model merges ``⌊β·⌊(D − n)/N⌋⌋`` (:class:`ZipItOptions`; inf without β), the product
    rounded to 9 decimals first so that float noise (0.29 · 100 = 28.999…) costs no merge."""
    quota = (sum(sizes) - sizes[0]) // len(sizes)
    return [math.inf if beta is None else math.floor(round(beta * quota, 9))] * len(sizes)


def _admissible(models: Tensor, owner: Tensor, budget: Sequence[float], k: int, within_model: bool) -> Tensor:
    """Which clusters cluster ``k`` may merge with (``models``: (D, N) bool, each cluster's models; a
    cluster keeps the index of its lowest feature, its representative, so ``owner`` (D,) is the
    representative's model; ``budget``: same-model merges left per model)."""
    if within_model:
        m = int(owner[k])
        return owner != m if budget[m] <= 0 else torch.ones_like(owner, dtype=torch.bool)  # (D,)
    disjoint = ~(models & models[k]).any(1)  # excludes same-model merges (both clusters hold m): no budget
    return disjoint & (models[:, 0] ^ models[k, 0])  # anchored at model 0's features (:class:`ZipItOptions`)


def _spend(allowed: Tensor, owner: Tensor, alive: Tensor, budget: list[float], i: int, j: int) -> Tensor | None:
    """Charge the merge of cluster j into i to their model's budget if it is same-model; when that empties
    the budget, no two clusters the model represents may merge any more. Returns those clusters (D,) bool,
    whose cached row maxima may now be inadmissible, or None if no pair was closed."""
    m = int(owner[i])
    if int(owner[j]) != m:
        return None
    budget[m] -= 1
    if budget[m] > 0:
        return None
    closed = alive & (owner == m)
    rows = closed.nonzero()[:, 0]
    allowed[rows[:, None], rows] = False
    return closed


def _row_best(link: Tensor, allowed: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Each of ``rows``' first admissible maximum (value, column), in ``argmax``'s order (NaN above all)."""
    masked = link[rows].masked_fill(~allowed[rows], -torch.inf)  # (len(rows), D)
    column = masked.argmax(1)
    return masked.gather(1, column[:, None])[:, 0], column


def _update_best(
    link: Tensor, allowed: Tensor, value: Tensor, column: Tensor, i: int, j: int, closed: Tensor | None
) -> None:
    """Refresh the cached row maxima after cluster j merged into i. Only row i and columns i, j changed
    (and the pairs ``closed`` by a spent budget, :func:`_spend`): column j is inadmissible now (a lower
    entry elsewhere than a row's maximum keeps it), and column i takes α times the minimum of rows i and
    j, which on an asymmetric linkage (a float covariance) can exceed the old column. Rows whose maximum
    sat at i or j, or whose new entry is NaN (argmax ranks it above all), or in ``closed``, are
    rescanned; the rest compare their new entry at i with their maximum."""
    new = link[:, i].masked_fill(~allowed[:, i], -torch.inf)  # (D,)
    stale = (column == i) | (column == j) | new.isnan()
    if closed is not None:
        stale |= closed
    stale[i] = stale[j] = True
    better = ~stale & ((new > value) | ((new == value) & (column > i)))  # ties: the first column wins
    value[better], column[better] = new[better], i
    rows = stale.nonzero()[:, 0]
    value[rows], column[rows] = _row_best(link, allowed, rows)


def zip_merges(
    correlation: Tensor, sizes: Sequence[int], within_model: bool, *, alpha: float, beta: float | None
) -> list[tuple[int, int]]:
    """ZipIt!'s greedy (module docstring; ``alpha``, ``beta``: :class:`ZipItOptions`) on the correlation of the
    concatenated features (``sizes[i]`` features of model i, all equal): the merges in order, each
    ``(i, j)`` with i < j, cluster j into cluster i (a cluster keeps its lowest feature's index). Each step
    merges the first admissible maximum of the linkage in row-major order, found from a cache of each
    row's first maximum (:func:`_update_best`): O(D) per merge instead of O(D²). Until n clusters
    remain a merge is admissible: without ``within_model`` by the anchoring; with spent budgets because
    they close only pairs represented by one model, and model 0 represents at most n clusters, so with
    more left some cluster of another model may still merge with cluster 0 (which never dies). A step whose
    admissible pairs all have linkage −inf (a ``correlation`` with −inf entries; a Pearson correlation has
    none) is refused: the masked maximum cannot tell them from the inadmissible ones."""
    if len(set(sizes)) != 1:
        raise ValueError(f"ZipIt! merges models of equal width, got widths {list(sizes)}")
    total, owner = sum(sizes), torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    models = torch.nn.functional.one_hot(owner, len(sizes)).bool()  # (D, N)
    budget = _budgets(beta, sizes)  # same-model merges left per model
    link = correlation.double().clone()  # complete-linkage correlation of the current clusters
    allowed = torch.stack([_admissible(models, owner, budget, k, within_model) for k in range(total)])
    allowed.fill_diagonal_(False)
    alive, merges = torch.ones(total, dtype=torch.bool), []
    value, column = _row_best(link, allowed, torch.arange(total))  # (D,), (D,): each row's first maximum
    for _ in range(total - sizes[0]):
        row = int(value.argmax())  # the first row holding the maximum: with its column, the flat argmax
        i, j = sorted((row, int(column[row])))
        if not allowed[i, j]:
            raise ValueError(  # the cached maximum is a masked entry: every admissible linkage is -inf
                f"correlation: after {len(merges)} of {total - sizes[0]} merges every admissible pair has "
                "linkage -inf; expected entries above -inf"
            )
        merges.append((i, j))
        models[i] |= models[j]
        link[i] = link[:, i] = torch.minimum(link[i], link[j]) * alpha  # α compounds: α^k after k merges
        alive[j] = allowed[j] = allowed[:, j] = False
        closed = _spend(allowed, owner, alive, budget, i, j)
        allowed[i] = allowed[:, i] = _admissible(models, owner, budget, i, within_model) & alive
        allowed[i, i] = False
        _update_best(link, allowed, value, column, i, j, closed)
    return merges


def zip_clusters(
    correlation: Tensor, sizes: Sequence[int], within_model: bool, *, alpha: float, beta: float | None
) -> list[list[int]]:
    """ZipIt!'s clusters (:func:`zip_merges`): ``sizes[0]`` lists of feature indices, ordered by first member."""
    members = [[k] for k in range(sum(sizes))]
    for i, j in zip_merges(correlation, sizes, within_model, alpha=alpha, beta=beta):
        members[i] += members[j]
        members[j] = []
    return sorted(sorted(c) for c in members if c)


def cluster_transforms(clusters: Sequence[Sequence[int]], sizes: Sequence[int]) -> tuple[list[Tensor], list[Tensor]]:
    """ZipIt!'s ``M_i`` (average of a cluster's members) and ``U_i`` (copy back) of every model."""
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    unmerge = torch.zeros(sum(sizes), len(clusters), dtype=torch.float64)  # (D, n): [U_0; …; U_{N−1}]
    for k, cluster in enumerate(clusters):
        unmerge[list(cluster), k] = 1.0
    merge = (unmerge / unmerge.sum(0)).T  # (n, D): rows average their cluster
    return (
        [merge[:, o : o + n] for o, n in zip(offsets, sizes, strict=True)],
        [unmerge[o : o + n] for o, n in zip(offsets, sizes, strict=True)],
    )


@takes(ZipItOptions)
def zipit(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    model: nn.Module,
    points: Mapping[str, list[str]],
    data: Batches,
    options: ZipItOptions,
) -> TransformResult:
    """Merge ``params`` (N ≥ 2 models) by ZipIt! (module docstring; options: :class:`ZipItOptions`).
    With ``partial_zip`` the result has no ``merged`` model but one of ``heads`` per model;
    ``stats['correlation']``: per zipped group, the mean correlation of the pairs inside a cluster."""
    groups = list(spec.groups)
    if options.partial_zip is not None and options.partial_zip > len(groups):
        raise OptionError(f"{{partial_zip}} must be at most the spec's {len(groups)} groups, got {options.partial_zip}")
    zipped = groups[: options.partial_zip]
    check_models(spec, params, points, zipped)
    start = time.perf_counter()
    stats = feature_statistics(
        model,
        params,
        {g: points[g] for g in zipped},
        data,
        batch_size=options.batch_size,
        max_samples=options.max_samples,
    )
    merges: list[Transform] = [{} for _ in params]
    unmerges: list[Transform] = [{} for _ in params]
    correlation = {}
    for g, s in stats.items():
        corr = s.correlation()
        clusters = zip_clusters(corr, s.sizes, options.within_model, alpha=options.alpha, beta=options.beta)
        for i, (m, u) in enumerate(zip(*cluster_transforms(clusters, s.sizes), strict=True)):
            merges[i][g], unmerges[i][g] = m, u
        pairs = [corr[a, b] for c in clusters for a in c for b in c if a < b]
        correlation[g] = float(torch.stack(pairs).mean()) if pairs else float("nan")
    info = {"seconds": time.perf_counter() - start, "correlation": correlation, "zipped": zipped}
    if options.partial_zip is None:
        return TransformResult(merges, unmerges, transform_merge(spec, params, merges, unmerges), [], info)
    return TransformResult(merges, unmerges, None, partial_merge(spec, params, merges, unmerges, zipped), info)
