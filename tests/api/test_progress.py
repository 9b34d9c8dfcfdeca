"""``progress=True`` shows a tqdm bar on stderr (the curve's λ values, an iterative search's epochs);
without it nothing is written."""

from __future__ import annotations

import torch
from torch import nn

import lmclab


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))


def test_the_curve_and_an_iterative_search_show_bars_only_when_asked(capfd) -> None:
    a, b, data = _mlp(0), _mlp(1), (torch.randn(32, 12), torch.randint(0, 3, (32,)))
    lmclab.curve(a, b, data=data, lams=3)
    lmclab.find_permutation(a, b, method="ste", data=data, options={"epochs": 2, "batch_size": 8})
    assert capfd.readouterr().err == ""
    lmclab.curve(a, b, data=data, lams=3, progress=True)
    err = capfd.readouterr().err
    assert "curve:" in err and "/3 " in err and "λ/s" in err  # a bar over the 3 λ values
    lmclab.find_permutation(a, b, method="ste", data=data, options={"epochs": 2, "batch_size": 8}, progress=True)
    err = capfd.readouterr().err
    assert "ste:" in err and "epoch/s" in err
