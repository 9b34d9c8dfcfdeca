"""BatchNorm statistics repair of interpolated networks (Jordan et al. 2023).

The running mean/var of ``θ(λ)`` are not the interpolation of the endpoints' statistics: they
must be re-estimated. :func:`repair_bn` runs the network in training mode (each BN normalises
with its batch statistics, as during training) over ``repair_samples`` training images and replaces
every BN's running statistics by their cumulative average over the batches (PyTorch's
``momentum=None``: the mean of the batch means and of the unbiased batch variances). With one
batch they are exactly the mean and unbiased variance of that BN's input over the repair data.
Weights are untouched; the caller's model and parameters are never mutated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from lmclab.core.data import Split, inputs_like
from lmclab.core.distributed import ALONE, World
from lmclab.core.options import OptionError
from lmclab.core.spec import Params


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def repair_subset(data: Split, samples: int | None, seed: int = 0, *, key: str = "repair_samples") -> Split:
    """A fixed random subset of ``samples`` training images (all of them for ``None``); an error names the
    count as the caller's argument ``key`` (``repair_samples``, ``train_samples``)."""
    if samples is not None and samples < 1:
        raise OptionError(f"{{{key}}} must be a positive number of images or null, got {samples}")
    if samples is None or samples >= len(data):
        return data
    keep = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:samples]
    return Split(data.x[keep], data.y[keep])


@torch.no_grad()
def repair_bn(
    model: nn.Module, params: Mapping[str, Tensor], data: Split, *, batch_size: int = 500, world: World = ALONE
) -> Params:
    """``params`` with every BatchNorm's running statistics recomputed on ``data``. With ``world``
    (data-parallel processes) each process runs every ``world.size``-th batch and the averages over
    batches are combined, weighted by each process's number of batches: the same statistics."""
    if batch_size < 1:
        raise ValueError(f"BN repair batch_size must be positive, got {batch_size}")
    work = copy.deepcopy(model)
    work.load_state_dict(dict(params))
    norms = [m for m in work.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over the repair batches
    device = next(iter(params.values())).device
    work.to(device).train()
    starts = [
        s for s in range(0, len(data), batch_size) if min(batch_size, len(data) - s) > 1 or s == 0
    ]  # a batch of one image has no variance
    for start in starts[world.rank :: world.size]:
        work(inputs_like(data.x[start : start + batch_size], params))
    for m in norms if world.size > 1 else ():
        count = m.num_batches_tracked.to(m.running_mean.dtype)
        total = world.reduce(count)
        m.running_mean.copy_(world.reduce(m.running_mean * count) / total)
        m.running_var.copy_(world.reduce(m.running_var * count) / total)
        m.num_batches_tracked.copy_(total.long())
    repaired = work.state_dict()
    return {k: repaired[k].detach() if k in repaired else v for k, v in params.items()}


def bn_repair_hook(
    model: nn.Module, data: Split, *, repair_samples: int | None, batch_size: int = 500, world: World = ALONE
) -> Callable[[Params], Params]:
    """The ``repair`` callable for :func:`lmclab.core.interpolation.measure_pair` (fixed subset, seed 0)."""
    subset = repair_subset(data, repair_samples)
    return lambda params: repair_bn(model, params, subset, batch_size=batch_size, world=world)
