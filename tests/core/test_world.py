"""The arithmetic of data parallelism without a process group: W simulated processes (a World whose
all-reduce adds up what every rank contributed) give what one process computes on the whole split."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from lmclab.core.data import Split
from lmclab.core.distributed import World, evaluate_sharded, join_world, shard_split
from lmclab.core.evaluate import evaluate


@dataclass(frozen=True)
class Simulated(World):
    """Rank ``rank`` of ``size``: ``all_sum`` returns the sums that ``totals`` holds for its call number."""

    totals: list = field(default_factory=list)
    seen: list = field(default_factory=list)

    def all_sum(self, *values: float) -> list[float]:
        self.seen.append(values)
        return list(self.totals[len(self.seen) - 1]) if self.totals else list(values)


def _sharded(model, params, split, size):
    """Two passes: each rank's contributions, then each rank's result given their sums."""
    ranks = [Simulated(rank=r, size=size) for r in range(size)]
    for world in ranks:
        evaluate_sharded(model, params, split, world)
    sums = [[sum(v) for v in zip(*(w.seen[0] for w in ranks), strict=True)]]
    return [evaluate_sharded(model, params, split, Simulated(rank=r, size=size, totals=sums)) for r in range(size)]


@pytest.mark.parametrize("size", [2, 3])
def test_unequal_shards_evaluate_to_the_whole_split(size):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).double()
    params = dict(model.named_parameters())
    split = Split(torch.randn(7, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2, 1]))  # 7 = 4 + 3, 3 + 2 + 2
    whole = evaluate(model, params, split)
    for result in _sharded(model, params, split, size):
        assert result.loss == pytest.approx(whole.loss, rel=1e-12) and result.acc == pytest.approx(whole.acc)
    shards = [shard_split(split, World(rank=r, size=size)) for r in range(size)]
    assert torch.equal(torch.cat([s.x for s in shards]), split.x) and torch.equal(
        torch.cat([s.y for s in shards]), split.y
    )


def test_a_world_needs_cpu_or_cuda():
    with pytest.raises(ValueError, match=r"^device: data-parallel runs need cpu or cuda, got 'mps'$"):
        join_world(0, 2, 0, "mps")


def test_a_cuda_world_sets_its_local_device_and_joins_over_nccl(monkeypatch):
    """Without a GPU: the calls to CUDA and to the process group are recorded instead of made."""
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, rank, world_size: calls.append((backend, rank, world_size))
    )
    world = join_world(3, 4, 1, "cuda")
    assert world == World(3, 4, torch.device("cuda", 1))
    assert calls == [("set_device", torch.device("cuda", 1)), ("nccl", 3, 4)]
    calls.clear()
    assert join_world(0, 2, 0, "cpu") == World(0, 2, torch.device("cpu")) and calls == [("gloo", 0, 2)]


def test_a_cuda_world_wraps_the_model_on_its_own_device_with_synchronised_batch_norm(monkeypatch):
    """Without a GPU: DDP is recorded instead of made. Its ``device_ids`` make it move each batch to the device."""
    made = []
    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", lambda model, **kwargs: made.append(kwargs) or model)
    wrapped = World(1, 2, torch.device("cuda", 1)).wrap(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    assert made == [{"device_ids": [1]}] and isinstance(wrapped[1], nn.SyncBatchNorm)


def test_a_reduce_leaves_the_tensor_it_was_given(monkeypatch):
    """The other rank adds 10 to every entry (recorded instead of sent): the sum comes back as a new tensor,
    and the caller's tensor (BN repair's count, reused after the call) keeps its value."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", lambda total: total.add_(10))
    count = torch.tensor([1.0, 2.0])
    total = World(0, 2).reduce(count)
    assert total.tolist() == [11.0, 12.0] and count.tolist() == [1.0, 2.0]
    assert World().reduce(count) is count  # alone: itself
