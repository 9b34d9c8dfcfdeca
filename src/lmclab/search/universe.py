"""What every n-model method shares (issue 30)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lmclab.core.spec import Params, PermutationSpec


def mean_params(params: Sequence[Mapping[str, Tensor]]) -> Params:
    """Element-wise mean; integer buffers are taken from the first model."""
    return {
        k: torch.stack([p[k] for p in params]).mean(0) if v.is_floating_point() else v.clone()
        for k, v in params[0].items()
    }


def summed_distance(spec: PermutationSpec, params: Sequence[Mapping[str, Tensor]]) -> float:
    """``D = Σ_i ‖θ_i − θ̄‖²`` over the matched entries (running statistics excluded)."""
    mean = mean_params([spec.matched(p) for p in params])
    return sum(float((p[k].double() - m.double()).pow(2).sum()) for p in params for k, m in mean.items())
