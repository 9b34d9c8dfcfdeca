"""N models merged into one (the n-model methods of :mod:`lmclab.search.many_methods`), and the repair of
a merged model's statistics (Jordan et al. 2023), on any ``nn.Module``s or state dicts.

>>> import torch, lmclab
>>> from torch import nn
>>> from lmclab.core.spec import apply_permutation, random_permutation
>>> torch.manual_seed(0)
<torch._C.Generator object at ...>
>>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> x = torch.randn(64, 4)
>>> spec = lmclab.find_permutation(net, net, example_inputs=x).spec        # traced
>>> sizes = spec.group_sizes(net.state_dict())
>>> copies = [net.state_dict()] + [
...     apply_permutation(spec, random_permutation(sizes, torch.Generator().manual_seed(s)), net.state_dict())
...     for s in (1, 2)
... ]                                                                      # three permuted copies of one net
>>> res = lmclab.merge_many(copies, method="c2m3", model=net, spec=spec)
>>> res
ManyMerge(method='c2m3', 3 models, 1 group {P_0: 8}, ...)
>>> merged = torch.func.functional_call(net, res.merged, (x,))
>>> bool(torch.allclose(merged, net(x), atol=1e-5))                       # the copies' function recovered
True
>>> fixed = lmclab.repair(net, res.merged, res.aligned, data=(x, torch.zeros(64)), repair="repair")
>>> sorted(fixed) == sorted(net.state_dict())
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.api.alignment import short_groups, short_stats
from lmclab.api.functions import checked_options, training_data
from lmclab.api.inputs import Data, Model, as_split, on_device, open_models, read_weights, resolve, skeleton
from lmclab.api.symmetries import check_symmetry, in_symmetry
from lmclab.api.widths import differ, embedded_all
from lmclab.core.bn_repair import repair_bn, repair_subset
from lmclab.core.canonical import fold_gains
from lmclab.core.device import resolve_device
from lmclab.core.options import keyed_errors
from lmclab.core.repair import merged_targets, repair_to
from lmclab.core.repairs import REPAIRS, resolved_repair
from lmclab.core.spec import Params, Permutation, PermutationSpec
from lmclab.search import needs_data, needs_model
from lmclab.search.many_methods import UNIVERSE, check_many, run_many


@dataclass(frozen=True, repr=False)
class ManyMerge:
    """What :func:`merge_many` found. Universe methods (MergeMany, C2M3, sync, star): ``perms`` (one
    permutation per model) and ``aligned`` (each model permuted into the common frame; ``merged`` is
    their mean). Transform methods (CCA Merge, ZipIt!): ``merges``/``unmerges`` (per model, group →
    matrix; ``merged = Σ_i M_i θ_i U_i``) and no ``aligned``; a partial zip has ``merged = None`` and
    one network per model in ``heads``. ``repair``: the repair applied to ``merged`` (``bn``,
    ``repair``) or None; ``stats``: what the method recorded; ``widths``: for models of different widths, each
    one's units where it is narrower than ``models[0]``, in whose widths it was embedded (:mod:`lmclab.core.widths`;
    ``perms`` then act on the embedded models; empty when all have one width)."""

    method: str
    merged: Params | None
    aligned: list[Params] = field(default_factory=list)
    perms: list[Permutation] = field(default_factory=list)
    merges: list[dict[str, Tensor]] = field(default_factory=list)
    unmerges: list[dict[str, Tensor]] = field(default_factory=list)
    heads: list[Params] = field(default_factory=list)
    repair: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    widths: list[dict[str, int]] = field(default_factory=list)  # per model, its units where narrower than models[0]

    def __repr__(self) -> str:
        n = len(self.perms or self.merges)
        frame = self.perms[0] if self.perms else {g: m.shape[0] for g, m in (self.merges or [{}])[0].items()}
        sizes = {g: p if isinstance(p, int) else len(p) for g, p in frame.items()}
        repaired = f", repair={self.repair!r}" if self.repair else ""
        return (
            f"ManyMerge(method={self.method!r}, {n} models, {short_groups(sizes)}{repaired}{short_stats(self.stats)})"
        )


ORTHOGONAL_MANY = (
    "merge_many",
    "star",
    "sync",
    "c2m3",
)  # the n-model methods whose steps are weight matching's (C2M3's Frank–Wolfe steps): orthogonal too


def _check_call(models: Sequence[Model], method: str, options, data, repair, symmetry) -> dict[str, Any]:
    if isinstance(models, Mapping | nn.Module) or not isinstance(models, Sequence) or len(models) < 2:
        raise ValueError("models: expected a list of at least 2 models (nn.Modules, state dicts or checkpoint paths)")
    options = checked_options(method, options, check=check_many)
    check_symmetry(symmetry, method, ORTHOGONAL_MANY)
    if needs_data(method) and data is None:
        raise ValueError(f"data: method {method!r} reads the models' activations and needs training data")
    if repair not in REPAIRS:
        raise ValueError(f"repair must be one of {list(REPAIRS)}, got {repair!r}")
    if repair != "none" and data is None:
        raise ValueError(f"data: repair={repair!r} needs training data to measure the statistics on")
    return options


def merge_many(  # size: the signature lists each keyword of the API (the body is short)
    models: Sequence[Model],
    *,
    method: str = "merge_many",
    symmetry: str = "permutation",
    spec: PermutationSpec | None = None,
    example_inputs: Tensor | Sequence[Any] | Mapping[str, Any] | None = None,
    data: Data | None = None,
    model: nn.Module | None = None,
    factory: str | Callable[..., nn.Module] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    points: Mapping[str, Sequence[str]] | None = None,
    repair: str = "none",
    repair_samples: int | None = 500,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    device: str = "auto",
    partial: bool = False,
    progress: bool = False,
) -> ManyMerge:
    """Merge N ≥ 2 models by ``method`` (a name of :data:`lmclab.search.many_methods.MANY_METHODS`;
    ``options``: its own, checked before anything runs), as the pipeline's ``merge_many`` stage does.

    The models are modules, state dicts or checkpoint paths, as :func:`lmclab.find_permutation` takes them.
    ``spec`` defaults to an lmclab checkpoint's own, else the one traced from the module (``model``,
    ``factory(**kwargs)``, else ``models[0]``) on ``example_inputs`` (one tensor, a sequence or a mapping of
    keyword inputs, as :func:`lmclab.find_permutation` takes them) or ``data``'s first batch
    (``partial=True``: what the tracer cannot prove stays unpermuted); ``data`` (training batches) is needed
    by the transform methods (which stream a ``DataLoader`` batch by batch) and by ``repair`` (which holds
    it in memory, a fixed subset of ``repair_samples`` inputs, None: all): ``bn`` recomputes BatchNorm
    statistics, ``repair`` rescales units to the endpoints' mean statistics (REPAIR,
    :func:`lmclab.core.repair.repair_merged`), ``auto`` the one that fits the model
    (:mod:`lmclab.core.repairs`); ``progress``: a tqdm bar over the method's steps on stderr. Returns a
    :class:`ManyMerge` (tensors on the CPU). ``symmetry="orthogonal"`` (``method`` ``"merge_many"``, ``"star"``,
    ``"sync"`` or ``"c2m3"``): the models' steps are weight matching over the groups the tracer proves orthogonal
    (:func:`lmclab.align`'s), and the models, their merge and its repair are in the canonical form, gains folded."""
    options = _check_call(models, method, options, data, repair, symmetry)
    names = [f"models[{i}]" for i in range(len(models))]
    opened = open_models(models, names, model=model, factory=factory, kwargs=kwargs)
    weights = read_weights(opened.models, names, torch.device("cpu"), same_shapes=False)  # widths: lmclab.api.widths
    other = differ(weights.params)
    if other and spec is not None:
        raise ValueError("spec: the models differ in width; they are traced to prove which groups may")
    problem = resolve(
        opened.models[0],
        spec=spec if spec is not None else opened.spec if symmetry == "permutation" and not other else None,
        model=opened.model,
        example_inputs=example_inputs,
        data=data,
        device=device,
        needs_forward=needs_model(method) or repair != "none",
        partial=partial,
        symmetry=symmetry,
    )
    problem = in_symmetry(problem, symmetry, type(problem.model or opened.model or opened.models[0]).__name__)
    weights = weights._replace(params=[{k: v.to(problem.device) for k, v in p.items()} for p in weights.params])
    params = [fold_gains(problem.spec, p, name) for p, name in zip(weights.params, names, strict=True)]
    params, widths = embedded_all(problem, opened.modules, params, names, symmetry) if other else (params, [])
    for p, name in zip(params, names, strict=True):
        problem.spec.check(p, name)
    points = points if points is not None else opened.points if opened.spec is not None else problem.points
    # REPAIR and the BatchNorm reset revisit a fixed subset: with a repair the data is held in memory
    held = repair != "none"
    train = as_split(data).to(problem.device) if held else training_data(method, data, problem.device)
    fix = _repair_of(repair, problem.model, repair_subset(train, repair_samples) if held else None)
    result = run_many(
        method,
        problem.spec,
        params,
        seed=seed,
        options=options,
        model=problem.model,
        points=dict(points) if points is not None else None,
        data=train,
        progress=progress,
    )
    return dataclasses.replace(_collected(method, problem, weights, params, result, fix), widths=widths)


def _repair_of(repair: str, net: nn.Module | None, train: Any) -> tuple[str, Any, Any] | None:
    """``repair`` resolved for ``net``, the pipeline's merge of aligned endpoints under it
    (:func:`lmclab.analysis.many_models.repaired_merge`) and its data, checked before any search."""
    from lmclab.analysis.many_models import repaired_merge

    if repair == "none":
        return None
    with keyed_errors(lambda name: "data" if name == "repair_data" else name):
        kind = resolved_repair(repair, net)
        return kind, repaired_merge(kind, net, train), train


def _collected(method, problem, weights, params, result, fix) -> ManyMerge:
    """The :class:`ManyMerge` of ``result`` on ``params`` (the models as searched, gains folded), its merge
    repaired by ``fix`` (the pipeline's repairs of :mod:`lmclab.analysis.many_models`, and its data), every
    tensor on the CPU; each model in its input's own dtype (the merged one in ``models[0]``'s)."""
    from lmclab.search.features import repair_transformed
    from lmclab.search.universe import aligned_models

    train = fix and fix[2]

    def cpu(p, index=0):
        return {k: v.cpu() for k, v in weights.own(index, p).items()}

    aligned = aligned_models(problem.spec, result.perms, params) if method in UNIVERSE else []
    merged, kind = result.merged, None
    if fix is not None and merged is not None:
        kind, merge, _ = fix
        if method in UNIVERSE:
            merged = merge(aligned)
        elif kind == "bn":
            merged = repair_bn(problem.model, merged, train)
        else:  # REPAIR to the transformed endpoints' statistics
            merged = repair_transformed(problem.model, problem.spec, params, result, train)
    transforms = {"merges": [], "unmerges": [], "heads": []}
    if method not in UNIVERSE:
        heads = [cpu(h, i) for i, h in enumerate(result.heads)]
        transforms = {"merges": result.merges, "unmerges": result.unmerges, "heads": heads}
    return ManyMerge(
        method,
        cpu(merged) if merged is not None else None,
        [cpu(a, i) for i, a in enumerate(aligned)],
        [{g: p.cpu() for g, p in perm.items()} for perm in getattr(result, "perms", [])],
        repair=kind,
        stats=dict(result.stats),
        **transforms,
    )


def repair(
    model: nn.Module,
    merged_params: Model,
    endpoints: Sequence[Model] = (),
    *,
    data: Data,
    repair: str = "auto",
    weights: Sequence[float] | None = None,
    repair_samples: int | None = 500,
    device: str = "auto",
) -> Params:
    """``merged_params`` (of the module ``model``) with its statistics repaired on a fixed subset of
    ``repair_samples`` inputs of ``data`` (None: all; Jordan et al. 2023). ``repair="bn"`` recomputes every
    BatchNorm's running statistics; ``repair="repair"`` (REPAIR, for networks without BatchNorm) rescales
    each unit of every Linear/Conv2d with a bias but the last so that its mean and std are ``Σ_i w_i μ_i`` and
    ``Σ_i w_i σ_i`` of the ``endpoints`` (the models merged, in one frame; ``weights`` default 1/N each:
    for ``θ(λ)`` of a pair give ``[θa, π(θb)]`` and ``[λ, 1 − λ]``); ``auto``: ``bn`` for a network with
    BatchNorm, else ``repair`` (:mod:`lmclab.core.repairs`). Returns a new state dict on the CPU; the
    arguments are not changed."""
    net = skeleton(model, model, "repair")
    if repair == "none":
        raise ValueError("repair: 'none' repairs nothing; expected bn, repair or auto")
    with keyed_errors(str):
        kind = resolved_repair(repair, net)
    if kind == "repair" and not endpoints:
        raise ValueError("endpoints: repair='repair' needs the merged models (their statistics are the targets)")
    dev = resolve_device(device)
    names = [f"endpoints[{i}]" for i in range(len(endpoints))]
    found = read_weights([merged_params, *endpoints], ["merged_params", *names], dev)  # in one dtype
    merged, *ends = found.params
    with keyed_errors(str):
        split = repair_subset(as_split(data).to(dev), repair_samples)
    net = on_device(net, dev)
    if kind == "bn":
        fixed = repair_bn(net, merged, split)
    else:
        _, targets = merged_targets(net, ends, split, weights=weights)
        fixed = repair_to(net, merged, split, targets)
    return {k: v.cpu() for k, v in found.own(0, fixed).items()}
