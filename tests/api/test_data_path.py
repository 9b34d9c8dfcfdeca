"""The data path keeps the model's dtype and reads token ids and dict batches: a float64 model on
float32 data through every method that runs the model, a token model through activation matching and
the curve, a DataLoader of dict batches through ``lmclab.pairs`` (still streamed)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import lmclab
from lmclab.core.spec import random_permutation
from lmclab.trace import trace_spec

DICTS = (
    "expected (input, target) batches or input tensors, got dict (wrap the data in lmclab.pairs(…, input_key=…, "
    "target_key=…))"
)


def _planted(net: nn.Module, x: torch.Tensor) -> dict:
    spec = trace_spec(net, x[:2])
    perm = random_permutation(spec.group_sizes(net.state_dict()), torch.Generator().manual_seed(2))
    return lmclab.apply_permutation(spec, perm, net.state_dict())


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _float64_net(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    norm = [nn.BatchNorm1d(16)] if batchnorm else []
    return nn.Sequential(nn.Linear(12, 16), *norm, nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).double()


@pytest.mark.parametrize("method", ["wm", "am", "ste", "ste_sinkhorn"])
def test_a_float64_model_on_float32_data_is_matched_in_float64(method: str) -> None:
    net, x = _float64_net(), torch.randn(64, 12)  # float32 data, as a loader of images gives
    b = _planted(net, x.double())
    options = {"epochs": 1, "batch_size": 16} if method.startswith("ste") else {}
    res = lmclab.find_permutation(net, b, method=method, data=(x, torch.randint(0, 3, (64,))), options=options)
    aligned, x64 = res.apply(b), x.double()
    assert aligned["0.weight"].dtype == torch.float64
    out = torch.func.functional_call(net, aligned, (x64,))
    assert torch.allclose(out, net(x64), rtol=0, atol=1e-12)  # any permutation keeps the function, in float64
    if method in ("wm", "am"):  # exact methods recover the planted permutation
        assert _equal(aligned, net.state_dict())


def test_a_float64_curve_and_repairs_read_float32_data() -> None:
    net, x, y = _float64_net(batchnorm=True), torch.randn(64, 12), torch.randint(0, 3, (64,))
    net.eval()
    b = _planted(net, x.double())
    curve = lmclab.curve(net, b, eval_data=(x, y), num_lambdas=3)
    expected = torch.nn.functional.cross_entropy(net(x.double()), y).item()  # evaluated in float64
    assert curve.rows[0]["loss"] == pytest.approx(expected, rel=1e-12)
    repaired = lmclab.curve(net, b, eval_data=(x, y), num_lambdas=3, repair="bn", repair_data=(x, y))
    assert all(r["loss"] == r["loss"] for r in repaired.rows)  # finite, in float64 throughout
    fixed = lmclab.repair(net, b, data=(x, y), repair="bn")
    assert fixed["0.weight"].dtype == torch.float64
    plain = _float64_net()
    merged = lmclab.merge_many([plain, _planted(plain, x.double())], method="cca", data=(x, y), repair="repair")
    assert merged.merged["0.weight"].dtype == torch.float64


class Tokens(nn.Module):
    """Token ids -> embedding -> mean over the sequence -> MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.fc1, self.fc2 = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.embed(ids).mean(1))))


def test_token_ids_stay_integers_through_matching_the_curve_and_repair() -> None:
    torch.manual_seed(0)
    net, ids, y = Tokens(), torch.randint(0, 50, (64, 7)), torch.randint(0, 3, (64,))
    b = _planted(net, ids)
    for method in ("wm", "am"):
        res = lmclab.find_permutation(net, b, method=method, data=(ids, y))
        assert _equal(res.apply(b), net.state_dict())
    curve = lmclab.curve(net, res.apply(b), eval_data=(ids, y), num_lambdas=3)
    assert curve.barrier() == pytest.approx(0.0, abs=1e-6)
    fixed = lmclab.repair(net, net.state_dict(), [net.state_dict(), res.apply(b)], data=(ids, y), repair="repair")
    assert torch.allclose(torch.func.functional_call(net, fixed, (ids,)), net(ids), atol=1e-5)  # already matched


def _dict_loader(x: torch.Tensor, y: torch.Tensor, size: int) -> DataLoader:
    rows = [{"pixel_values": x[i], "labels": y[i]} for i in range(len(x))]
    return DataLoader(rows, batch_size=size)  # default collate: dicts of stacked tensors


def test_dict_batches_are_read_through_pairs_and_still_streamed(monkeypatch) -> None:
    torch.manual_seed(0)
    net, x, y = _float64_net().float(), torch.randn(96, 12), torch.randint(0, 3, (96,))
    b = _planted(net, x)
    loader = _dict_loader(x, y, 32)
    with pytest.raises(TypeError, match=f"^{re.escape(f'data: {DICTS}')}$"):
        lmclab.find_permutation(net, b, method="ste", data=loader)
    held = lmclab.curve(net, b, eval_data=(x, y), num_lambdas=3)

    def never(*args, **kwargs):
        raise AssertionError("the data was concatenated into memory")

    monkeypatch.setattr("lmclab.api.functions.as_split", never)
    monkeypatch.setattr("lmclab.api.curves.as_split", never)
    keyed = lmclab.pairs(loader, input_key="pixel_values", target_key="labels")
    res = lmclab.find_permutation(net, b, method="am", data=keyed)
    assert _equal(res.apply(b), net.state_dict())
    streamed = lmclab.curve(net, b, eval_data=keyed, num_lambdas=3)
    assert [r["loss"] for r in streamed.rows] == pytest.approx([r["loss"] for r in held.rows], rel=1e-5)
    collated = lmclab.pairs(loader, collate=lambda batch: (batch["pixel_values"], batch["labels"]))
    assert _equal(lmclab.find_permutation(net, b, method="am", data=collated).apply(b), net.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "^pairs: give either input_key \\(with target_key\\) or collate$"),
        (
            {"input_key": "x", "collate": print},
            ValueError,
            "^pairs: give either input_key \\(with target_key\\) or collate$",
        ),
        (
            {"input_key": "x"},
            ValueError,
            "^target_key: needed with input_key \\(the key of the targets in each batch\\)$",
        ),
        ({"collate": 3}, TypeError, "^collate must be callable, got int$"),
    ],
)
def test_pairs_refuses_bad_arguments_in_one_line(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        lmclab.pairs([], **kwargs)


def test_a_missing_key_names_the_argument_and_the_batch_s_keys() -> None:
    loader = _dict_loader(torch.randn(8, 12), torch.zeros(8, dtype=torch.long), 4)
    with pytest.raises(
        ValueError, match=r"^target_key: no key 'label' in a batch; its keys are \['labels', 'pixel_values'\]$"
    ):
        list(lmclab.pairs(loader, input_key="pixel_values", target_key="label"))
    with pytest.raises(
        ValueError, match=r"^input_key: no key 'ids' in a batch; its keys are \['labels', 'pixel_values'\]$"
    ):
        list(lmclab.pairs(loader, input_key="ids", target_key="labels"))
    with pytest.raises(TypeError, match=r"^input_key: expected dict batches, got tuple$"):
        list(lmclab.pairs([(torch.zeros(2), torch.zeros(2))], input_key="a", target_key="b"))


def test_as_split_needs_targets_and_points_dict_batches_to_pairs() -> None:
    with pytest.raises(TypeError, match=r"^data: expected \(input, target\) items, got input tensors alone$"):
        lmclab.as_split([torch.zeros(2, 3)])
    with pytest.raises(TypeError, match=f"^{re.escape(f'test: {DICTS}')}$"):
        lmclab.as_split([{"x": torch.zeros(2, 3)}], "test")
    samples = [(torch.zeros(3), torch.tensor(1)), (torch.ones(3), torch.tensor(0))]  # a dataset of samples
    split = lmclab.as_split(samples)
    assert split.x.shape == (2, 3) and split.y.tolist() == [1, 0]
