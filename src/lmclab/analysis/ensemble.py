"""MergeMany's merged model against the output ensemble and the individual models."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate, evaluate_ensemble
from lmclab.core.spec import Params
from lmclab.search.merge_many import MergeManyResult, merge_many
from lmclab.search.universe import mean_params

Repair = Callable[[Params], Params]


def merge_and_compare(
    ckpts: Sequence[Checkpoint],
    splits: Mapping[str, Split],
    *,
    max_iter: int,
    tol: float,
    seed: int,
    device: torch.device,
    repair: Repair | None = None,
) -> tuple[MergeManyResult, list[dict]]:
    """Run MergeMany on ``ckpts`` and evaluate, on every split: each model, the ensemble of their
    outputs (mean softmax), the naive average (no alignment) and the MergeMany average."""
    first = ckpts[0]
    spec = get_arch(first.arch).permutation_spec(first.config)
    params = [{k: v.to(device) for k, v in c.state_dict.items()} for c in ckpts]
    result = merge_many(spec, params, max_iter=max_iter, tol=tol, generator=torch.Generator().manual_seed(seed))
    model = build_model(first.arch, first.config).to(device)
    fix = repair or (lambda p: p)
    candidates = {f"seed{c.seed}": p for c, p in zip(ckpts, params, strict=True)}
    candidates["naive average"] = fix(mean_params(params))
    candidates["MergeMany average"] = fix(result.merged)
    rows = []
    for split, data in splits.items():
        for name, p in candidates.items():
            ev = evaluate(model, p, data)
            rows.append({"model": name, "split": split, "loss": ev.loss, "acc": ev.acc})
        ev = evaluate_ensemble(model, params, data)
        rows.append({"model": "ensemble", "split": split, "loss": ev.loss, "acc": ev.acc})
    return result, rows
