"""The loss a model's forward pass defines, for every analysis that evaluates a loss (curves, barriers,
the data-driven searches' midpoint objective, Taylor terms).

Two objectives:

- ``classification`` (every classifier; the default): ``forward(x)`` returns logits, the loss is the
  mean cross-entropy against the labels and the accuracy is the fraction of correct argmaxes.
- ``reconstruction`` (a model whose class sets ``objective = "reconstruction"``, the masked autoencoder
  :mod:`lmclab.archs.mae`): ``forward(x)`` returns the model's own mean loss on ``x`` (MAE: the MSE of the
  masked patches under masks drawn from its ``mask_seed``, the same masks at every λ of a curve); labels
  are not read and there is no accuracy (NaN). Such a model also has ``predict(x)`` (its outputs under
  the same masks) and ``prediction_loss(prediction, x)`` (the loss of given outputs), which the output
  ensemble uses: the loss of the members' mean prediction.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

CLASSIFICATION = "classification"
RECONSTRUCTION = "reconstruction"


def objective_of(model: nn.Module) -> str:
    """``model``'s objective: its class attribute ``objective``, ``classification`` when it has none."""
    return getattr(model, "objective", CLASSIFICATION)


def is_reconstruction(model: nn.Module) -> bool:
    """Whether ``model``'s forward pass returns its own loss (no logits, no accuracy)."""
    return objective_of(model) == RECONSTRUCTION


class _Method(nn.Module):
    """``model.<name>`` as a module's forward, so that :func:`functional_call` runs it with other parameters."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model, self.name = model, name

    def forward(self, *args: object) -> Tensor:
        return getattr(self.model, self.name)(*args)


def functional_method(model: nn.Module, params: Mapping[str, Tensor], name: str, *args: object) -> Tensor:
    """``model.<name>(*args)`` with ``params`` in place of the model's own (never mutated)."""
    return functional_call(_Method(model, name), {f"model.{k}": v for k, v in params.items()}, args, tie_weights=False)


def batch_loss(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """The mean loss of ``model`` run with ``params`` on the batch ``(x, y)`` (differentiable)."""
    out = functional_call(model, dict(params), (x,), tie_weights=False)
    return out if is_reconstruction(model) else F.cross_entropy(out, y)


def batch_loss_correct(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> tuple[float, float]:
    """The summed loss over the batch and the number of correct predictions (NaN: reconstruction)."""
    out = functional_call(model, dict(params), (x,), tie_weights=False)
    if is_reconstruction(model):
        return float(out) * len(x), float("nan")
    return F.cross_entropy(out, y, reduction="sum").item(), float((out.argmax(1) == y).sum().item())
