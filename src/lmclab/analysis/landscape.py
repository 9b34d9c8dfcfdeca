"""Loss/accuracy landscape on the plane through three models (the paper's Figure 17).

Affine coordinates ``(u, v)``: ``θ(u, v) = θa + u (θb' − θa) + v (θc' − θa)``, so θa, θb' = π_b(θb)
and θc' = π_c(θc) sit at (0, 0), (1, 0) and (0, 1). For drawing, ``(x, y)`` are orthonormal
coordinates of the same points in the plane (Gram–Schmidt on the two directions), so distances and
angles in the figure are the true ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World, evaluate_sharded
from lmclab.core.options import OptionError
from lmclab.core.spec import Params

Repair = Callable[[Params], Params]


def plane_grid(resolution: int, margin: float) -> list[float]:
    """Coordinates ``linspace(−margin, 1 + margin, resolution)`` plus 0 and 1 exactly."""
    if resolution < 2:
        raise OptionError(f"{{resolution}} must be at least 2 points per axis, got {resolution}")
    if margin < 0:
        raise OptionError(f"{{margin}} must be non-negative, got {margin}")
    return sorted(set(np.linspace(-margin, 1 + margin, resolution).round(12).tolist()) | {0.0, 1.0})


def plane_point(
    params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], params_c: Mapping[str, Tensor], u: float, v: float
) -> Params:
    """``θa + u (θb − θa) + v (θc − θa)``, computed as ``(1−u−v) θa + u θb + v θc`` so that the
    three models are reproduced bit-exactly at their coordinates; integer buffers from θa."""
    w = 1.0 - u - v
    return {
        k: w * a + u * params_b[k] + v * params_c[k] if a.is_floating_point() else a.clone()
        for k, a in params_a.items()
    }


def plane_frame(
    params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], params_c: Mapping[str, Tensor], keys: list[str]
) -> tuple[float, float, float]:
    """``(‖d_b‖, d_c·ê_b, ‖d_c⊥‖)`` for ``d_b = θb − θa``, ``d_c = θc − θa`` over ``keys``."""

    def dot(x, y):
        return sum(
            float((x[k] - params_a[k]).double().flatten() @ (y[k] - params_a[k]).double().flatten()) for k in keys
        )

    bb, bc, cc = dot(params_b, params_b), dot(params_b, params_c), dot(params_c, params_c)
    norm_b = math.sqrt(bb)
    along = bc / norm_b if norm_b > 0 else 0.0
    return norm_b, along, math.sqrt(max(cc - along**2, 0.0))


def landscape(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    params_c: Mapping[str, Tensor],
    grid: list[float],
    split: Split,
    *,
    keys: list[str],
    repair: Repair | None = None,
    world: World = ALONE,
) -> list[dict]:
    """Loss and accuracy at every ``(u, v)`` of ``grid × grid``, with orthonormal ``(x, y)``;
    ``world``: each data-parallel process evaluates its shard of ``split`` (the same numbers)."""
    norm_b, along, perp = plane_frame(params_a, params_b, params_c, keys)
    rows = []
    for u in grid:
        for v in grid:
            params = plane_point(params_a, params_b, params_c, u, v)
            if repair is not None:
                params = repair(params)
            ev = evaluate_sharded(model, params, split, world)
            rows.append({"u": u, "v": v, "x": u * norm_b + v * along, "y": v * perp, "loss": ev.loss, "acc": ev.acc})
    return rows
