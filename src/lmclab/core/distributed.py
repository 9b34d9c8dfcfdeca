"""Data parallelism under ``torchrun``: the process group of one run and the arithmetic that
makes ``W`` processes compute what one process computes on the same global batch.

Every process holds the whole (in-memory) split and draws the same global minibatch from the same
seeded generator; it trains on its contiguous shard of the batch, and its loss is the shard's summed
cross-entropy times ``W / B`` (``B`` the global batch), so DistributedDataParallel's mean of the
gradients is the gradient of the global batch's mean loss. Sums of losses and counts are all-reduced
for the history; rank 0 writes. BatchNorm: synchronised over processes on GPUs (``SyncBatchNorm``,
the global batch's statistics, as one process); on CPU PyTorch has no synchronised BatchNorm, so each
process normalises its shard (standard DDP) and a BN net is not the single-process one there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.core.evaluate import Evaluation, evaluate
from lmclab.core.options import OptionError, got

BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` data-parallel processes (``size = 1``: no process group)."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Tensor) -> Tensor:
        """This process's contiguous part of ``items`` (parts differ in length by at most one)."""
        return items if self.size == 1 else items.tensor_split(self.size)[self.rank]

    def all_sum(self, *values: float) -> list[float]:
        """Each value summed over the processes (float64)."""
        if self.size == 1:
            return list(values)
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return total.tolist()

    def reduce(self, tensor: Tensor) -> Tensor:
        """``tensor`` summed over the processes (a new tensor; itself when alone)."""
        if self.size == 1:
            return tensor
        total = tensor.detach().to(self.device, copy=True)
        dist.all_reduce(total)
        return total.to(tensor.device)

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` as DDP would train it (itself when alone); synchronised BatchNorm on GPUs."""
        if self.size == 1:
            return model
        if self.device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            return nn.parallel.DistributedDataParallel(model, device_ids=[self.device.index])
        return nn.parallel.DistributedDataParallel(model)


ALONE = World()  # this process alone, no process group: the default ``world`` of the functions that take one


def join_world(rank: int, size: int, local_rank: int, device_type: str) -> World:
    """Join the process group torchrun set up (``env://``): one process per device, gloo on CPU, NCCL on GPUs."""
    if device_type not in BACKENDS:
        raise ValueError(f"device: data-parallel runs need cpu or cuda, got {device_type!r}")
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(BACKENDS[device_type], rank=rank, world_size=size)
    return World(rank, size, device)


def leave_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def shard_split(split: Split, world: World) -> Split:
    """This process's contiguous rows of ``split`` (for evaluation: sums over shards are the whole)."""
    rows = world.shard(torch.arange(len(split)))
    return Split(split.x[rows], split.y[rows])


def evaluate_sharded(model: nn.Module, params: dict[str, Tensor], split: Split, world: World) -> Evaluation:
    """:func:`lmclab.core.evaluate.evaluate` of the whole ``split``, each process evaluating its shard."""
    if world.size == 1:
        return evaluate(model, params, split)
    shard = shard_split(split, world)
    mine = evaluate(model, params, shard) if len(shard) else Evaluation(0.0, 0.0)
    loss, correct = world.all_sum(mine.loss * len(shard), mine.acc * len(shard))
    return Evaluation(loss / len(split), round(correct) / len(split))


def torchrun_command(
    python: str,
    script: str,
    args: list[str],
    *,
    nproc_per_node: int,
    nnodes: int,
    rdzv_endpoint: str | None,
    run_id: str,
) -> list[str]:
    """The torchrun command running ``script args`` in ``nproc_per_node`` processes on each of ``nnodes``
    machines: ``--standalone`` on one machine, a c10d rendezvous at ``rdzv_endpoint`` across several."""
    if nnodes > 1 and not rdzv_endpoint:
        raise OptionError(
            f"{{rdzv_endpoint}}: {nnodes} machines need the rendezvous host:port, got {got(rdzv_endpoint)}"
        )
    where = (
        ["--standalone"]
        if nnodes == 1
        else [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id}"]
    )
    return [python, "-m", "torch.distributed.run", *where, f"--nproc-per-node={nproc_per_node}", script, *args]
