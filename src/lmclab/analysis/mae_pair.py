"""What a pair of masked autoencoders shares along θ(λ) = λ θa + (1 − λ) π(θb) beyond the reconstruction
loss (which :func:`lmclab.core.evaluate.evaluate` measures on the model's fixed masks like any loss): the
encoder as a representation (linear probe and kNN test accuracy at each λ, :mod:`lmclab.analysis.mae_probe`),
the decoder's error on masked and on visible patches, and how far each block moves the residual stream
at θb, the midpoint and θa. The measure stage runs it for every method on MAE endpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor, nn

from lmclab.analysis.mae import fixed_masks, masked_visible_error
from lmclab.analysis.mae_probe import probe_curve, residual_change
from lmclab.core.data import Split
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import midpoint_barrier

ENDS = (1.0, 0.5, 0.0)  # θa, the midpoint, π(θb): where the residual change is measured


def mae_pair(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    train: Split,
    test: Split,
    lams: Sequence[float],
) -> tuple[list[dict], list[dict], dict[str, float]]:
    """``(rows, residual rows, summary)`` of an MAE pair (``model``: :class:`lmclab.archs.mae.Model`).

    rows: per λ, :func:`~lmclab.analysis.mae_probe.probe_curve`'s probe and kNN test accuracy (the probe
    fitted afresh on ``train`` at each λ) and the masked and visible patch error on the test split under the
    model's fixed masks (``config.mask_seed``). residual rows: ``{lam, block, change}``
    at λ = 1, ½, 0, :func:`~lmclab.analysis.mae_probe.residual_change` on all test patches. summary: the
    probe and kNN accuracies (percent) at θa, θb and the midpoint and their midpoint barriers (points; the
    paper's accuracy convention: positive = the midpoint is worse), the masked and visible error at ½."""
    if not set(ENDS) <= {float(lam) for lam in lams}:
        raise ValueError("lams: the λ grid must contain 0, ½ and 1")
    config = model.config
    masks = fixed_masks(len(test), config.patches, config.mask_ratio, config.mask_seed).to(test.x.device)
    rows, residual = probe_curve(model, params_a, permuted_b, train, test, lams), []
    for row in rows:
        lam = row["lam"]
        params = lerp_params(params_a, permuted_b, lam)
        errors = masked_visible_error(model, params, test.x, masks)
        row |= {"masked_error": errors["masked"], "visible_error": errors["visible"]}
        if lam in ENDS:
            changes = residual_change(model, params, test.x)
            residual += [{"lam": float(lam), "block": k, "change": v} for k, v in changes.items()]
    at = {r["lam"]: r for r in rows}
    summary: dict[str, float] = {}
    for q in ("probe_acc", "knn_acc"):
        a, b, mid = (100 * at[lam][q] for lam in (1.0, 0.0, 0.5))
        summary |= {f"{q}_a": a, f"{q}_b": b, f"{q}_mid": mid}
        summary[f"{q}_barrier_mid"] = midpoint_barrier(mid, a, b, higher_is_better=True)
    summary |= {"masked_error_mid": at[0.5]["masked_error"], "visible_error_mid": at[0.5]["visible_error"]}
    return rows, residual, summary
