"""Every method leaves the caller's module as it came: each submodule in the train/eval mode it had (AM and
the evaluations run it in eval mode, STE's steps in train mode), its parameters untouched."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from lmclab.core.data import Split
from lmclab.core.spec import build_spec
from lmclab.core.spec_builders import dense
from lmclab.search import METHODS, SearchProblem, run_search

QUICK = {
    "ste": {"epochs": 1, "batch_size": 16},
    "wm_sinkhorn": {"epochs": 1, "iterations": 2},
    "ste_sinkhorn": {"epochs": 1, "batch_size": 16},
}


def _problem(model: nn.Module, with_test: bool) -> SearchProblem:
    torch.manual_seed(0)
    params_a = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    params_b = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    spec = build_spec(dense("0", "P_0", None), dense("3", None, "P_0"))
    split = Split(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    return SearchProblem(
        spec, params_a, params_b, model=model, points={"P_0": ["1"]}, train=split, test=split if with_test else None
    )


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_every_method_keeps_the_modules_modes_and_parameters(method: str, mode: str) -> None:
    net = _net()
    net.train(mode == "train")
    if mode == "mixed":  # the container in train mode, its dropout in eval mode
        net.train()
        net[2].eval()
    before = [m.training for m in net.modules()]
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    run_search(method, _problem(net, with_test=method != "identity"), seed=0, options=QUICK.get(method))
    assert [m.training for m in net.modules()] == before
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_searches_a_float64_model_in_float64(method: str) -> None:
    """A float64 model (and data) is searched as it is: no method mixes in float32 tensors of its own."""
    net = _net().double().eval()
    problem = _problem(net, with_test=method != "identity")
    problem = dataclasses.replace(
        problem,
        params_a={k: v.double() for k, v in problem.params_a.items()},
        params_b={k: v.double() for k, v in problem.params_b.items()},
        train=Split(problem.train.x.double(), problem.train.y),
        test=None if problem.test is None else Split(problem.test.x.double(), problem.test.y),
    )
    found = run_search(method, problem, seed=0, options=QUICK.get(method))
    assert sorted(found.perm["P_0"].tolist()) == list(range(8))
    assert next(net.parameters()).dtype == torch.float64
