"""Inputs read batch by batch: slices of a Split, a stream's own batches cut at ``max_samples`` and left
unread after it, sample items read as batches of one, and what counts as a stream."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lmclab.core.batches import as_batch, input_batches, streamed
from lmclab.core.data import Split

LIKE = {"w": torch.zeros(1)}  # float32 parameters on the CPU


class Counted:
    """A re-iterable of (input, target) batches that counts the batches it hands out."""

    def __init__(self, x: torch.Tensor, size: int) -> None:
        self.batches = [(x[i : i + size], torch.zeros(len(x[i : i + size]))) for i in range(0, len(x), size)]
        self.served = 0

    def __iter__(self):
        for batch in self.batches:
            self.served += 1
            yield batch


def _read(data, **kwargs) -> list[torch.Tensor]:
    return list(input_batches(data, like=LIKE, **{"batch_size": 4, "max_samples": None} | kwargs))


def test_a_split_is_read_in_slices_of_the_batch_size_up_to_max_samples() -> None:
    x = torch.arange(10.0).unsqueeze(1)
    split = Split(x, torch.zeros(10))
    assert [len(b) for b in _read(split)] == [4, 4, 2]
    assert [len(b) for b in _read(split, max_samples=6)] == [4, 2]
    assert [len(b) for b in _read(split, max_samples=8)] == [4, 4]
    assert [len(b) for b in _read(split, max_samples=99)] == [4, 4, 2]
    assert torch.equal(torch.cat(_read(split, max_samples=7)), x[:7])


@pytest.mark.parametrize(
    ("max_samples", "sizes", "served"), [(None, [3, 3, 3, 1], 4), (7, [3, 3, 1], 3), (6, [3, 3], 2)]
)
def test_a_stream_keeps_its_batches_cuts_the_last_and_stops_reading(max_samples, sizes, served) -> None:
    x = torch.arange(10.0).unsqueeze(1)
    stream = Counted(x, 3)
    read = _read(stream, max_samples=max_samples)  # batch_size 4 is the Split's, not the stream's
    assert [len(b) for b in read] == sizes and stream.served == served
    assert torch.equal(torch.cat(read), x[: sum(sizes)])


def test_sample_items_are_batches_of_one_and_input_tensors_are_batches() -> None:
    x = torch.randn(3, 2, 5)
    assert [b.shape for b in _read([(x[i], torch.tensor(1)) for i in range(3)])] == [(1, 2, 5)] * 3
    assert [b.shape for b in _read([x, x[:1]])] == [(3, 2, 5), (1, 2, 5)]
    inputs, targets = as_batch((x, torch.ones(3)))
    assert inputs is x and targets.shape == (3,)
    assert as_batch(x) == (x, None)


@pytest.mark.parametrize("bad", [[{"x": 1}], [(torch.zeros(2),)], ["text"]])
def test_an_item_that_is_no_batch_is_refused_naming_the_argument(bad) -> None:
    with pytest.raises(TypeError, match="^loader: expected \\(input, target\\) batches or input tensors, got "):
        _read(bad, name="loader")


@pytest.mark.parametrize(
    "empty", [Split(torch.zeros(0, 2), torch.zeros(0)), [], DataLoader(TensorDataset(torch.zeros(0, 2)))]
)
def test_nothing_to_read_is_one_line(empty) -> None:
    with pytest.raises(ValueError, match="^data: no samples to read"):
        _read(empty)


def test_streams_are_re_iterables_and_everything_else_is_held() -> None:
    x, y = torch.zeros(4, 2), torch.zeros(4)
    assert streamed(DataLoader(TensorDataset(x, y), batch_size=2))
    assert streamed([(x, y)]) and streamed(((x, y), (x, y), (x, y)))
    assert not streamed(Split(x, y)) and not streamed((x, y))  # a pair of tensors is one batch in memory
    assert not streamed(iter([(x, y)])) and not streamed(b for b in [(x, y)])  # one-shot: read to trace the spec
    assert not streamed(TensorDataset(x, y)) and not streamed(x) and not streamed({"x": x})
