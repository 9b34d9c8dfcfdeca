"""Refusals of the core that the rest of the suite reaches only through other processes or not at all:
each is one line naming what it is about, raised before any work, and the accepted side of its bound
passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.core import device as device_module
from lmclab.core.bn_repair import repair_bn
from lmclab.core.data import Split
from lmclab.core.heads import Heads
from lmclab.core.interpolation import interpolation_curve, measure_pair
from lmclab.core.spec import PermutationSpec, check_permutation


def test_a_device_is_auto_cpu_or_an_available_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_module.resolve_device("auto") == device_module.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^device: 'cuda:1' requested but CUDA is not available; use auto or cpu$"):
        device_module.resolve_device("cuda:1")
    with pytest.raises(ValueError, match=r"^device: unknown device 'gpu'; expected auto, cpu or cuda\[:N\]$"):
        device_module.resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_module.resolve_device("auto") == torch.device("cuda")  # recorded, not used: no GPU here


def _net() -> tuple[nn.Module, dict, dict[str, Split]]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    data = Split(torch.randn(12, 4), torch.randint(0, 3, (12,)))
    return net, dict(net.state_dict()), {"test": data}


def test_a_curve_takes_one_repair_and_a_grid_with_both_ends_and_the_midpoint() -> None:
    net, params, splits = _net()
    spec = PermutationSpec({k: (None,) * v.dim() for k, v in params.items()})
    with pytest.raises(ValueError, match=r"^repair, repair_at: expected at most one of them$"):
        interpolation_curve(net, params, params, [0.0, 1.0], splits, repair=lambda p: p, repair_at=lambda lam: params)
    with pytest.raises(ValueError, match=r"^the λ grid must contain 0, ½ and 1$"):
        measure_pair(spec, net, params, params, params, [0.0, 0.25, 1.0], splits)
    curve, _ = measure_pair(spec, net, params, params, params, [0.0, 0.5, 1.0], splits)
    assert sorted({row["lam"] for row in curve}) == [0.0, 0.5, 1.0]


def test_bn_repair_needs_a_positive_batch() -> None:
    net, params, splits = _net()
    with pytest.raises(ValueError, match=r"^BN repair batch_size must be positive, got 0$"):
        repair_bn(net, params, splits["test"], batch_size=0)
    assert set(repair_bn(net, params, splits["test"], batch_size=5)) == set(params)


def test_a_spec_refuses_tensors_of_other_ranks_and_heads_it_cannot_place() -> None:
    params = {"w": torch.zeros(4, 3), "b": torch.zeros(4)}
    spec = PermutationSpec({"w": ("P", None), "b": ("P",)})
    spec.check(params)
    with pytest.raises(ValueError, match=r"^model_b: 'b' has 2 axes, the spec declares 1$"):
        spec.check({**params, "b": torch.zeros(4, 1)}, "model_b")
    lost = PermutationSpec(spec.axes, heads={"Q": Heads(2, "T")})
    with pytest.raises(ValueError, match=r"^state_dict: headed group 'Q' acts on no axis of the spec$"):
        lost.check(params)
    tied = PermutationSpec({"w": ("P", "R"), "b": ("P",)}, heads={"P": Heads(2, "T"), "R": Heads(2, "T")})
    tied.check({"w": torch.zeros(4, 6), "b": torch.zeros(4)})  # one head count per tie: accepted
    two = PermutationSpec({"w": ("P", "R"), "b": ("P",)}, heads={"P": Heads(2, "T"), "R": Heads(3, "T")})
    with pytest.raises(ValueError, match=r"^state_dict: groups tied by 'T' have different numbers of heads$"):
        two.check({"w": torch.zeros(4, 6), "b": torch.zeros(4)})


def test_a_permutation_names_exactly_the_specs_groups() -> None:
    check_permutation({"P": torch.tensor([1, 0])}, {"P": 2})
    with pytest.raises(ValueError, match=r"^permutation groups \['Q'\] do not match the spec's \['P'\]$"):
        check_permutation({"Q": torch.tensor([1, 0])}, {"P": 2})
