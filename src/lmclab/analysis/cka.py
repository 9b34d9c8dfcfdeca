"""Functional similarity of two models: linear centred kernel alignment (CKA; Kornblith et al. 2019)
between their hidden representations on the same inputs, layer by layer.

``CKA(X, Y) = ‖Yᵀ X‖²_F / (‖Xᵀ X‖_F ‖Yᵀ Y‖_F)`` with ``X, Y`` the column-centred ``(samples × features)``
representations (Kornblith et al., eq. 5; HSIC with linear kernels). It is 1 for representations equal
up to an orthogonal transform and an isotropic scaling — a permutation of the units among them, so
``CKA(θa, θb) = CKA(θa, π(θb))`` at every layer: alignment changes which units face each other, not how
similar the representations are. What alignment changes is the *merged* model: ``CKA(θa, θ(½))``.

The layers are read off the :class:`lmclab.core.spec.PermutationSpec`: every Linear/Conv whose output axis
is permuted (the hidden layers), at its output (pre-activation), flattened per sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split
from lmclab.core.spec import PermutationSpec

PAIRS = (("a", "b"), ("a", "pi_b"), ("a", "mid"), ("pi_b", "mid"))  # θa, θb, π(θb), the merged midpoint


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA of two representations with one row per sample (any trailing shape, flattened)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"CKA needs the same ≥ 2 samples on both sides, got {len(x)} and {len(y)}")
    x, y = x.flatten(1).double(), y.flatten(1).double()
    x, y = x - x.mean(0), y - y.mean(0)
    if x.shape[1] + y.shape[1] > 2 * len(x):  # wide: the samples' Gram matrices are smaller
        gram_x, gram_y = x @ x.T, y @ y.T
        cross, norm_x, norm_y = (gram_x * gram_y).sum(), gram_x.norm(), gram_y.norm()
    else:
        cross, norm_x, norm_y = (y.T @ x).square().sum(), (x.T @ x).norm(), (y.T @ y).norm()
    if norm_x == 0 or norm_y == 0:
        return float("nan")  # a constant representation has no similarity to speak of
    return float(cross / (norm_x * norm_y))


def hidden_layers(spec: PermutationSpec, model: nn.Module) -> list[str]:
    """Modules (Linear/Conv) whose output units are permuted: the hidden layers, in spec order."""
    modules = dict(model.named_modules())
    names = [
        key[: -len(".weight")]
        for key, axes in spec.axes.items()
        if key.endswith(".weight") and axes and axes[0] is not None and key not in spec.stats
    ]
    return [n for n in names if isinstance(modules.get(n), (nn.Linear, nn.Conv2d))]


@torch.no_grad()
def representations(
    model: nn.Module, params: Mapping[str, Tensor], split: Split, layers: Sequence[str], *, batch_size: int = 1024
) -> dict[str, Tensor]:
    """Each layer's output on ``split`` (eval mode), one flattened row per sample, on the CPU."""
    modules, out = dict(model.named_modules()), {name: [] for name in layers}
    hooks = [
        modules[name].register_forward_hook(
            lambda _m, _i, value, name=name: out[name].append(value.flatten(1).float().cpu())
        )
        for name in layers
    ]
    device = next(iter(params.values())).device
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(split), batch_size):
            functional_call(model, dict(params), (split.x[start : start + batch_size].to(device),), tie_weights=False)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return {name: torch.cat(rows) for name, rows in out.items()}


def cka_rows(
    spec: PermutationSpec, model: nn.Module, models: Mapping[str, Mapping[str, Tensor]], split: Split
) -> list[dict]:
    """CKA at every hidden layer for every pair of :data:`PAIRS` (``models`` keyed a, b, pi_b, mid)."""
    layers = hidden_layers(spec, model)
    reps = {k: representations(model, p, split, layers) for k, p in models.items()}
    return [
        {"layer": name, "depth": depth, "pair": f"{x}-{y}", "cka": linear_cka(reps[x][name], reps[y][name])}
        for depth, name in enumerate(layers)
        for x, y in PAIRS
    ]


def cka_means(rows: Sequence[dict]) -> dict[str, float]:
    """Per pair, the mean CKA over the layers (``cka_a_b``, ``cka_a_pi_b``, ``cka_a_mid``, ``cka_pi_b_mid``)."""
    out = {}
    for x, y in PAIRS:
        values = [r["cka"] for r in rows if r["pair"] == f"{x}-{y}" and not math.isnan(r["cka"])]
        out[f"cka_{x}_{y}"] = sum(values) / len(values) if values else float("nan")
    return out
