"""A DataLoader given to a method that only sums over batches (activation matching, CCA Merge, ZipIt!)
is streamed, one pass, never concatenated, with the numbers of the data held whole; the methods that
revisit their data (STE, REPAIR) still hold it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lmclab
from lmclab.search import METHODS, needs_data, streams_data
from lmclab.search.many_methods import MANY_METHODS
from lmclab.trace import trace_spec


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


class Counted:
    """A re-iterable DataLoader-like source that counts passes and batches."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, size: int) -> None:
        self.loader = DataLoader(TensorDataset(x, y), batch_size=size)
        self.passes = self.batches = 0

    def __iter__(self):
        self.passes += 1
        for batch in self.loader:
            self.batches += 1
            yield batch


def _no_concatenation(monkeypatch) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the data was concatenated into memory")

    monkeypatch.setattr("lmclab.api.functions.as_split", never)
    monkeypatch.setattr("lmclab.api.many.as_split", never)


def _data(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(5)
    return torch.randn(n, 12), torch.randint(0, 3, (n,))


def test_the_streaming_methods_are_read_off_their_signatures() -> None:
    assert [m for m in [*METHODS, *MANY_METHODS] if streams_data(m)] == ["am", "cca", "zipit"]
    assert all(needs_data(m) for m in ["am", "cca", "zipit"])


@pytest.mark.parametrize("statistic", ["cross_moment", "pearson"])
@pytest.mark.parametrize("max_samples", [None, 130])
def test_activation_matching_streams_a_loader_with_the_split_s_result(statistic, max_samples, monkeypatch) -> None:
    a, b, (x, y) = _mlp(0), _mlp(1), _data()
    options = {"statistic": statistic, "max_samples": max_samples, "batch_size": 64}
    held = lmclab.find_permutation(a, b, method="am", data=(x, y), device="cpu", options=options)
    _no_concatenation(monkeypatch)
    loader = Counted(x, y, 64)
    streamed = lmclab.find_permutation(a, b, method="am", data=loader, device="cpu", options=options)
    assert streamed.stats["samples"] == held.stats["samples"] == (max_samples or 200)
    assert all(torch.equal(streamed.perm[g], held.perm[g]) for g in held.perm)
    # one batch to trace the spec, then one pass that stops at the batch holding sample max_samples
    assert loader.passes == 2 and loader.batches == 1 + (3 if max_samples else 4)


@pytest.mark.parametrize("method", ["cca", "zipit"])
def test_transform_merges_stream_a_loader_with_the_split_s_result(method, monkeypatch) -> None:
    nets, (x, y) = [_mlp(s) for s in range(3)], _data()
    options = {"max_samples": 150, "batch_size": 50}  # the held split in the loader's batches: the same sums
    held = lmclab.merge_many(nets, method=method, data=(x, y), device="cpu", options=options)
    _no_concatenation(monkeypatch)
    loader = Counted(x, y, 50)
    streamed = lmclab.merge_many(nets, method=method, data=loader, device="cpu", options=options)
    assert loader.passes == 2 and loader.batches == 1 + 3
    for s, h in zip(streamed.merges, held.merges, strict=True):
        assert all(torch.allclose(s[g], h[g], atol=1e-9) for g in h)
    assert all(torch.allclose(streamed.merged[k], held.merged[k], atol=1e-6) for k in held.merged)


def test_ste_and_repair_hold_a_loader_in_memory_and_give_the_held_result() -> None:
    a, (x, y) = _mlp(0), _data(64)
    b = lmclab.apply_permutation(
        trace_spec(a, x[:2]), {"P_0": torch.randperm(16), "P_1": torch.randperm(16)}, a.state_dict()
    )
    loader = Counted(x, y, 16)
    options = {"epochs": 1, "batch_size": 16}
    via_loader = lmclab.find_permutation(a, b, method="ste", data=loader, device="cpu", options=options)
    held = lmclab.find_permutation(a, b, method="ste", data=(x, y), device="cpu", options=options)
    assert loader.passes == 2 and all(torch.equal(via_loader.perm[g], held.perm[g]) for g in held.perm)
    nets = [_mlp(s) for s in range(3)]
    loader = Counted(x, y, 16)
    repaired = lmclab.merge_many(nets, method="cca", data=loader, repair="repair", device="cpu")
    again = lmclab.merge_many(nets, method="cca", data=(x, y), repair="repair", device="cpu")
    assert loader.passes == 2 and all(
        torch.allclose(repaired.merged[k], again.merged[k], atol=1e-6) for k in again.merged
    )


def test_the_data_a_method_holds_is_moved_to_the_search_s_device_and_a_streamed_loader_is_left_as_it_is() -> None:
    """The meta device stands in for a GPU: STE's data lands there whole, AM's loader is passed on untouched."""
    from lmclab.api.functions import training_data
    from lmclab.core.data import Split

    (x, y), meta = _data(8), torch.device("meta")
    held = training_data("ste", Counted(x, y, 4), meta)
    assert isinstance(held, Split) and held.x.is_meta and held.y.is_meta and held.x.shape == (8, 12)
    pair = training_data("ste", (x, y), meta)
    assert pair.x.is_meta and pair.y.is_meta and not x.is_meta  # the caller's tensors stay where they were
    loader = Counted(x, y, 4)
    assert training_data("am", loader, meta) is loader and loader.passes == 0
    assert training_data("ste", None, meta) is None
