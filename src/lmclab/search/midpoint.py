"""The midpoint objective of the data-driven searches (STE, Sinkhorn STE):
``L((θa + π(θb)) / 2)`` on training minibatches, and the per-epoch monitor hook.

The loss runs the model in training mode, so a BatchNorm network normalises with the batch
statistics of the merged model itself (what statistics repair would restore) and the stale,
interpolated running statistics never enter the objective. The running-statistic entries are
passed as detached copies, because training-mode BatchNorm updates them in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.core.merge import lerp_params
from lmclab.core.objective import batch_loss
from lmclab.core.options import OptionError
from lmclab.core.spec import Permutation, PermutationSpec

Monitor = Callable[[Permutation], dict[str, float]]  # one learning-curve row per call


def midpoint_loss(
    model: nn.Module,
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    lam: float = 0.5,
) -> Tensor:
    """Mean loss of the merged model ``λ θa + (1 − λ) π(θb)`` (Eq. 1; the midpoint by default) on ``(x, y)``,
    training mode (classifiers: cross-entropy; :mod:`lmclab.core.objective`)."""
    merged = lerp_params(params_a, permuted_b, lam)
    merged = {k: v.detach().clone() if k in spec.stats else v for k, v in merged.items()}
    model.train()
    return batch_loss(model, merged, x, y)


@torch.no_grad()
def heldout_loss(
    model: nn.Module,
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    data: Split,
    batch_size: int,
) -> float:
    """:func:`midpoint_loss` averaged over ``data`` in chunks of ``batch_size``."""
    total = 0.0
    for lo in range(0, len(data), batch_size):
        x, y = data.x[lo : lo + batch_size], data.y[lo : lo + batch_size]
        total += float(midpoint_loss(model, spec, params_a, permuted_b, x, y)) * len(y)
    return total / len(data)


def drawn_lam(spread: float, generator: torch.Generator) -> float:
    """The merge weight of one step's loss: λ ~ U(½ − ``spread``, ½ + ``spread``) (Theus et al. 2025: spread
    0.1); exactly ½ for spread 0, drawing nothing from ``generator`` (the original midpoint objective)."""
    if spread == 0:
        return 0.5
    return 0.5 + spread * (2 * torch.rand((), generator=generator, dtype=torch.float64).item() - 1)


def n_heldout(n: int, fraction: float) -> int:
    """Samples held out of ``n`` for a ``fraction`` (at least one unless the fraction is 0)."""
    return max(1, round(fraction * n)) if fraction > 0 else 0


def split_holdout(data: Split, fraction: float, generator: torch.Generator) -> tuple[Split, Split]:
    """A random ``fraction`` of ``data`` held out for model selection; the rest for training."""
    order = torch.randperm(len(data), generator=generator)
    n_hold = n_heldout(len(data), fraction)
    hold, rest = order[:n_hold], order[n_hold:]
    return Split(data.x[rest], data.y[rest]), Split(data.x[hold], data.y[hold])


def check_batch(batch_size: int, n_samples: int) -> None:
    """The batch must fit in the data it is drawn from (known only once the data is loaded)."""
    if batch_size > n_samples:
        raise OptionError(
            f"{{batch_size}} must be at most the {n_samples} training samples available for "
            f"the search, got {batch_size}"
        )


def minibatches(n: int, batch_size: int, generator: torch.Generator, *, drop_last: bool = True) -> list[Tensor]:
    """One epoch of shuffled index batches; with ``drop_last`` the last, smaller batch is dropped
    unless it is the only one (kept, it is a smaller step, as in a ``DataLoader``)."""
    batches = list(torch.randperm(n, generator=generator).split(batch_size))
    short = len(batches) > 1 and len(batches[-1]) < batch_size
    return batches[:-1] if drop_last and short else batches
