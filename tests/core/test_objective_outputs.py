"""The classification objective on outputs other than a logits tensor (lmclab.core.objective): a transformers
``ModelOutput``, a dict, a tuple; logits per position (a language model's ``(B, T, V)`` against token ids
``(B, T)``); and a custom ``loss_fn`` — each against a closed form on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmclab.core.objective import batch_loss, batch_loss_correct, custom_loss, logits_of


class Out(dict):
    """A mapping with the logits under ``"logits"`` and as an attribute (a ``ModelOutput``)."""

    @property
    def logits(self) -> torch.Tensor:
        return self["logits"]


class Fixed(nn.Module):
    """Returns ``scale · table`` wrapped as ``wrap`` says, whatever the input (``scale``: its one parameter)."""

    def __init__(self, table: torch.Tensor, wrap: str) -> None:
        super().__init__()
        self.table, self.wrap, self.scale = table, wrap, nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> object:
        out = self.table * self.scale
        return {"tensor": out, "dict": {"logits": out}, "tuple": (out, None), "output": Out(logits=out)}[self.wrap]


@pytest.mark.parametrize("wrap", ["tensor", "dict", "tuple", "output"])
def test_the_logits_are_read_from_any_output(wrap: str) -> None:
    table = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
    model = Fixed(table, wrap)
    y = torch.tensor([0, 0, 1])
    params = dict(model.named_parameters())
    expected = -(torch.log_softmax(table, 1)[torch.arange(3), y]).sum()
    loss, correct = batch_loss_correct(model, params, torch.zeros(3), y)
    assert loss == pytest.approx(float(expected)) and correct == 2.0  # row 1 predicts class 1, not 0


def test_per_position_logits_give_each_sample_the_mean_of_its_positions() -> None:
    """Two sequences of two tokens over three classes: sample losses are the means over their tokens; a
    sample counts the fraction of its tokens right."""
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]], [[0.2, 0.2, 0.6], [0.6, 0.2, 0.2]]]))
    y = torch.tensor([[0, 2], [2, 1]])
    model = Fixed(logits, "output")
    loss, correct = batch_loss_correct(model, dict(model.named_parameters()), torch.zeros(2), y)
    first, second = (-math.log(0.5) - math.log(0.1)) / 2, (-math.log(0.6) - math.log(0.2)) / 2
    assert loss == pytest.approx(first + second) and correct == pytest.approx(0.5 + 0.5)
    assert float(batch_loss(model, dict(model.named_parameters()), torch.zeros(2), y)) == pytest.approx(
        (first + second) / 2
    )


def test_a_custom_loss_replaces_the_cross_entropy_and_float_targets_have_no_accuracy() -> None:
    table = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    model = Fixed(table, "tensor")
    params, target = dict(model.named_parameters()), torch.tensor([[0.0, 2.0], [3.0, 4.0]])
    mse = lambda out, y: ((out - y) ** 2).mean()  # noqa: E731
    with custom_loss(mse):
        loss, correct = batch_loss_correct(model, params, torch.zeros(2), target)
        assert float(batch_loss(model, params, torch.zeros(2), target)) == pytest.approx(0.5)
    assert loss == pytest.approx(0.5 * 2) and math.isnan(correct)
    labels = torch.tensor([1, 0])
    with custom_loss(lambda out, y: out.sum() * 0 + 7.0):  # labels: accuracy still from the logits
        assert batch_loss_correct(model, params, torch.zeros(2), labels) == (14.0, 1.0)


def test_an_output_without_logits_names_loss_fn() -> None:
    with pytest.raises(TypeError, match=r"returned set, with no logits; pass loss_fn="):
        logits_of({1, 2})


def test_the_output_ensemble_of_logits_per_position_is_each_samples_mean_over_its_positions() -> None:
    """Two members of fixed logits ``(2 samples, 3 positions, 4 tokens)``: the ensemble's loss is the mean over
    samples of each sample's mean −log of the members' mean probability of its targets; its accuracy the
    mean over samples of the fraction of positions whose mean probability peaks at the target."""
    from lmclab.core.data import Split
    from lmclab.core.evaluate import evaluate_ensemble

    gen = torch.Generator().manual_seed(0)
    table = torch.randn(2, 3, 4, generator=gen)
    y = torch.tensor([[0, 1, 2], [3, 3, 0]])
    model = Fixed(table, "tensor")
    members = [{"scale": torch.tensor(1.0)}, {"scale": torch.tensor(2.0)}]
    mean = (table.softmax(-1) + (2 * table).softmax(-1)) / 2
    picked = mean.gather(-1, y[..., None])[..., 0]
    got = evaluate_ensemble(model, members, Split(torch.zeros(2, 3), y))
    assert got.loss == pytest.approx(float(-picked.log().mean(1).mean()), rel=1e-6)
    assert got.acc == pytest.approx(float((mean.argmax(-1) == y).float().mean(1).mean()), rel=1e-6)
