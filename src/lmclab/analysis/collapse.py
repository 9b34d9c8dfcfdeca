"""Neural collapse of the last-layer features (Papyan, Han & Donoho 2020), measured on the
training split at the end of training: the features are the inputs of the logits layer (read off the
:class:`lmclab.core.spec.PermutationSpec`: the last layer whose output axis is never permuted).

- ``nc1 = tr(Σ_W Σ_B⁺) / C``: within-class variability relative to between-class (→ 0 under collapse);
- ``nc2_etf``: distance of the centred class means from a simplex equiangular tight frame,
  ``‖G/‖G‖_F − (I − 11ᵀ/C)/‖I − 11ᵀ/C‖_F‖_F`` with ``G`` the Gram matrix of the normalised centred means;
- ``nc_equinorm``: coefficient of variation of the centred class means' norms (→ 0 under collapse).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.analysis.alignment import layer_names, output_layer
from lmclab.core.data import Split
from lmclab.core.spec import PermutationSpec


def collapse_stats(features: Tensor, labels: Tensor) -> dict[str, float]:
    """NC1, the ETF distance and the equinorm CV of ``features`` (samples × dims) grouped by ``labels``; NaN
    each when the class means are not finite (a diverged model, whose loss is NaN too)."""
    h, present = features.double(), torch.unique(labels)
    if len(present) < 2:
        raise ValueError(f"neural collapse needs at least 2 classes among the samples, got {len(present)}")
    means = torch.stack([h[labels == c].mean(0) for c in present])
    centred = means - h.mean(0)
    within = sum((h[labels == c] - m).T @ (h[labels == c] - m) for c, m in zip(present, means, strict=True)) / len(h)
    between = centred.T @ centred / len(present)
    if not bool(torch.isfinite(between).all()):  # NaN features (a diverged model): pinv's solvers fail on them
        return dict.fromkeys(("nc1", "nc2_etf", "nc_equinorm"), float("nan"))
    nc1 = float(torch.trace(within @ torch.linalg.pinv(between, hermitian=True)) / len(present))
    unit = centred / centred.norm(dim=1, keepdim=True)
    gram, c = unit @ unit.T, len(present)
    etf = torch.eye(c, dtype=h.dtype) - torch.full((c, c), 1.0 / c, dtype=h.dtype)
    norms = centred.norm(dim=1)
    return {
        "nc1": nc1,
        "nc2_etf": float((gram / gram.norm() - etf / etf.norm()).norm()),
        "nc_equinorm": float(norms.std() / norms.mean()),
    }


@torch.no_grad()
def last_layer_features(
    model: nn.Module, params: Mapping[str, Tensor], split: Split, layer: str, *, batch_size: int = 1024
) -> Tensor:
    """The inputs of module ``layer`` on ``split`` (eval mode), one flattened row per sample."""
    rows: list[Tensor] = []
    hook = model.get_submodule(layer).register_forward_pre_hook(lambda _m, args: rows.append(args[0].flatten(1).cpu()))
    device, was_training = next(iter(params.values())).device, model.training
    model.eval()
    try:
        for start in range(0, len(split), batch_size):
            functional_call(model, dict(params), (split.x[start : start + batch_size].to(device),), tie_weights=False)
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(rows)


def neural_collapse(
    spec: PermutationSpec, model: nn.Module, params: Mapping[str, Tensor], split: Split
) -> dict[str, float]:
    """:func:`collapse_stats` of the logits layer's input features on ``split``; none (``{}``) for targets per
    position (a language model's next tokens: features per token, not per sample)."""
    if split.y.dim() > 1:
        return {}
    weight = output_layer(spec, layer_names(spec, params))
    features = last_layer_features(model, params, split, weight[: -len(".weight")])
    return collapse_stats(features, split.y.cpu())
