"""The barrier in circuit space: each attention head replaced by its circuits, as Theus et al. (2025, *Generalized
Linear Mode Connectivity for Transformers*, Section 5) measure the heads' part of a transformer's barrier.

A head computes its logits through ``W_QKʰ = W_Qʰᵀ W_Kʰ`` and writes through ``W_OVʰ = W_Oʰ W_Vʰ`` alone, so the
maps inside a head (``R`` on its queries and keys, ``R'`` on its values) leave both circuits unchanged. Along
the circuit-space path each head's circuits are interpolated instead of its factors,
``W_QKʰ(λ) = λ W_QKʰ(θa) + (1 − λ) W_QKʰ(π(θb))`` and ``W_OVʰ(λ)`` alike, and every other parameter as in Eq. 1.
The interpolated circuits have rank up to ``2d``: they are the circuits of a head of ``2d`` features holding both
models' heads side by side, ``W_Q = √2 [λ W_Qᵃ; (1 − λ) W_Qᵇ]``, ``W_K = [W_Kᵃ; W_Kᵇ]``, ``W_V = [W_Vᵃ; W_Vᵇ]``,
``W_O = [λ W_Oᵃ, (1 − λ) W_Oᵇ]`` (the √2 keeps the softmax's ``1/√d``: the wide head divides by ``√(2d)``).
:func:`circuit_params` builds that wide model's parameters from the spec's headed groups — a group read by no
later layer (queries and keys: both on the rows of their projections) scales its first projection, a group read
by a later layer (values: the output projection's columns) scales its reader — on the architecture's model of
heads twice as wide (``circuit_config``, :mod:`lmclab.archs`). At λ = 1 and 0 it computes θa and π(θb) exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmclab.analysis.temperature import logits_on
from lmclab.core.data import Split
from lmclab.core.heads import head_size
from lmclab.core.merge import lerp_params
from lmclab.core.spec import Params, PermutationSpec


def circuit_params(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], lam: float
) -> Params:
    """The parameters of the wide model whose heads' circuits are ``λ`` θa's plus ``1 − λ`` θb's (module
    docstring; ``params_b`` aligned to ``params_a``); every entry outside the heads as Eq. 1's ``θ(λ)``. ``spec``'s
    headed groups have each head's features as units, as :func:`lmclab.trace.trace_spec` with
    ``symmetry="orthogonal"`` gives them (under grouped queries, a key head's features in copies on the queries'
    rows); a group of whole heads (a permutation spec's) is refused in one line."""
    out = lerp_params(params_a, params_b, lam)
    sizes = spec.group_sizes(params_a)
    for group, heads in spec.heads.items():
        d, places = head_size(group, sizes[group], heads), spec.groups[group]
        if any(isinstance(e := spec.axes[n][ax], tuple) and any(s.block > 1 for s in e) for n, ax in places):
            raise ValueError(f"spec: group {group!r} moves whole heads; circuits need each head's features as units")
        read = any(axis == 1 for _, axis in places)
        first = places[0][0].rsplit(".", 1)[0]
        for name, axis in places:
            scaled = axis == 1 if read else name.rsplit(".", 1)[0] == first
            gain = 1.0 if read else math.sqrt(2)  # the √2 keeps the softmax's 1/√d
            weights = (gain * lam, gain * (1 - lam)) if scaled else (1.0, 1.0)
            out[name] = side_by_side(params_a[name] * weights[0], params_b[name] * weights[1], axis, d)
    return out


def side_by_side(a: Tensor, b: Tensor, axis: int, d: int) -> Tensor:
    """``a`` and ``b`` with their heads of ``d`` entries along ``axis`` interleaved: head ``h`` of the result is
    ``a``'s head ``h`` followed by ``b``'s (``2d`` entries)."""
    heads = a.shape[axis] // d
    pair = torch.stack([a.unflatten(axis, (heads, d)), b.unflatten(axis, (heads, d))], dim=axis + 1)
    return pair.flatten(axis, axis + 2)


def circuit_barrier(
    spec: PermutationSpec,
    wide_model: nn.Module,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    test: Split,
) -> dict[str, float]:
    """``test_loss_barrier_mid_circuits``: the test loss of the circuit-space midpoint (``wide_model``: the
    architecture's model of heads twice as wide) minus the mean of the endpoints' (computed by the wide model at
    λ = 1 and 0, which are θa and π(θb)), and ``test_loss_mid_circuits``."""
    y = test.y.reshape(-1).cpu()
    loss = {
        lam: float(F.cross_entropy(logits_on(wide_model, circuit_params(spec, params_a, permuted_b, lam), test), y))
        for lam in (0.0, 0.5, 1.0)
    }
    return {
        "test_loss_barrier_mid_circuits": loss[0.5] - (loss[0.0] + loss[1.0]) / 2,
        "test_loss_mid_circuits": loss[0.5],
    }
