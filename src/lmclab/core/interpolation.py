"""Interpolation curves and barriers between θa and an aligned θb (the paper's Definition 2.1 and Section 3)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World, evaluate_sharded
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import barrier, l2_distance, midpoint_barrier, reduction_rate
from lmclab.core.spec import Params, PermutationSpec

Repair = Callable[[Params], Params]  # e.g. BatchNorm statistics repair of an interpolated model
# a repair that needs the endpoints and λ: the repaired θ(λ) of (θa, θb, λ), e.g. REPAIR (lmclab.core.repair)
RepairAt = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], float], Params]


def interpolation_curve(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    lams: Sequence[float],
    splits: Mapping[str, Split],
    *,
    repair: Repair | None = None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
) -> list[dict]:
    """Loss and accuracy of ``θ(λ) = λθa + (1−λ)θb`` for every λ and split (long format rows), and for a split
    of targets per position (a language model's next tokens) the perplexity ``exp(loss)``, loss being the mean
    cross-entropy over its tokens;
    ``repair``: applied to each θ(λ); ``repair_at``: gives each repaired θ(λ) from the endpoints and λ;
    ``world``: each data-parallel process evaluates its shard of every split (the same numbers)."""
    if repair is not None and repair_at is not None:
        raise ValueError("repair, repair_at: expected at most one of them")
    rows = []
    for lam in lams:
        params = lerp_params(params_a, params_b, lam) if repair_at is None else repair_at(params_a, params_b, lam)
        if repair is not None:
            params = repair(params)
        for split, data in splits.items():
            ev = evaluate_sharded(model, params, data, world)
            row = {"lam": float(lam), "split": split, "loss": ev.loss, "acc": ev.acc}
            rows.append(row | ({"ppl": math.exp(ev.loss)} if data.y.dim() > 1 else {}))
    return rows


def barriers_from_curve(rows: Sequence[dict]) -> dict[str, float]:
    """Max-over-λ and midpoint barriers of loss and accuracy (accuracy in percentage points), and of
    perplexity where the rows have it (a language model's)."""
    out: dict[str, float] = {}
    for split in sorted({r["split"] for r in rows}):
        curve = sorted((r for r in rows if r["split"] == split), key=lambda r: r["lam"])
        lams = [r["lam"] for r in curve]
        at = {r["lam"]: r for r in curve}
        measures = [("loss", 1.0, False), ("acc", 100.0, True)] + [("ppl", 1.0, False)] * all("ppl" in r for r in curve)
        for q, scale, hib in measures:
            vals = [scale * r[q] for r in curve]
            out[f"{split}_{q}_barrier_max"] = barrier(lams, vals, higher_is_better=hib)
            out[f"{split}_{q}_barrier_mid"] = midpoint_barrier(
                scale * at[0.5][q], scale * at[1.0][q], scale * at[0.0][q], higher_is_better=hib
            )
            out[f"{split}_{q}_a"], out[f"{split}_{q}_b"] = scale * at[1.0][q], scale * at[0.0][q]
            out[f"{split}_{q}_mid"] = scale * at[0.5][q]
    return out


def measure_pair(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    lams: Sequence[float],
    splits: Mapping[str, Split],
    *,
    repair: Repair | None = None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
) -> tuple[list[dict], dict[str, float]]:
    """Curve between θa and π(θb); barriers; ``‖θa−θb‖``, ``‖θa−π(θb)‖`` and the reduction %."""
    if 0.5 not in lams or 0.0 not in lams or 1.0 not in lams:
        raise ValueError("the λ grid must contain 0, ½ and 1")
    curve = interpolation_curve(
        model, params_a, permuted_b, lams, splits, repair=repair, repair_at=repair_at, world=world
    )
    summary = barriers_from_curve(curve)
    before, after = l2_distance(spec, params_a, params_b), l2_distance(spec, params_a, permuted_b)
    summary.update(l2_before=before, l2_after=after, l2_reduction_pct=reduction_rate(before, after))
    return curve, summary


def measure_pair_with_repair(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    lams: Sequence[float],
    splits: Mapping[str, Split],
    *,
    repair: Repair | None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
) -> tuple[list[dict], dict[str, float]]:
    """:func:`measure_pair` without and, if ``repair`` (BN repair) or ``repair_at`` (REPAIR) is given,
    with that repair at every λ.

    Curve rows carry ``repair`` (bool). With a repair, the summary's barriers are the repaired
    ones (what the paper reports for BN networks) and the unrepaired barriers are kept under
    ``norepair_<key>``; ``bn_repair`` and ``ln_repair`` say which case it is."""
    curve, summary = measure_pair(spec, model, params_a, params_b, permuted_b, lams, splits, world=world)
    rows = [{**r, "repair": False} for r in curve]
    flags = {"bn_repair": repair is not None, "ln_repair": repair_at is not None}
    if repair is None and repair_at is None:
        return rows, {**summary, **flags}
    fixed, fixed_summary = measure_pair(
        spec, model, params_a, params_b, permuted_b, lams, splits, repair=repair, repair_at=repair_at, world=world
    )
    stale = {f"norepair_{k}": v for k, v in summary.items() if not k.startswith("l2_")}
    return rows + [{**r, "repair": True} for r in fixed], {**fixed_summary, **stale, **flags}
