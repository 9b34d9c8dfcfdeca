"""Loss and accuracy of a parameter dict on a data split, via ``torch.func.functional_call``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split, inputs_like
from lmclab.core.objective import batch_loss_correct, functional_method, is_reconstruction, logits_of


class Evaluation(NamedTuple):
    loss: float  # mean loss (classifiers: cross-entropy in nats; lmclab.core.objective)
    acc: float  # fraction correct, 0..1 (NaN for a reconstruction model)


@torch.no_grad()
def evaluate(model: nn.Module, params: Mapping[str, Tensor], split: Split, *, batch_size: int = 1024) -> Evaluation:
    """Mean loss and accuracy of ``model`` run with ``params`` in eval mode (:mod:`lmclab.core.objective`)."""
    device = next(iter(params.values())).device
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(split), batch_size):
        x = inputs_like(split.x[start : start + batch_size], params)
        y = split.y[start : start + batch_size].to(device)
        summed, right = batch_loss_correct(model, params, x, y)
        total_loss, correct = total_loss + summed, correct + right
    model.train(was_training)
    return Evaluation(total_loss / len(split), correct / len(split))


@torch.no_grad()
def evaluate_ensemble(
    model: nn.Module, params_list: list[Mapping[str, Tensor]], split: Split, *, batch_size: int = 1024
) -> Evaluation:
    """The output ensemble: mean of the members' softmax probabilities; loss is its NLL. A reconstruction
    model's (:mod:`lmclab.core.objective`): the loss of the members' mean prediction, no accuracy."""
    if is_reconstruction(model):
        return _reconstruction_ensemble(model, params_list, split, batch_size)
    device = next(iter(params_list[0].values())).device
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(split), batch_size):
        x = inputs_like(split.x[start : start + batch_size], params_list[0])
        y = split.y[start : start + batch_size].to(device)
        probs = torch.stack(
            [F.softmax(logits_of(functional_call(model, dict(p), (x,), tie_weights=False)), 1) for p in params_list]
        ).mean(0)
        total_loss += F.nll_loss(probs.clamp_min(1e-12).log(), y, reduction="sum").item()
        correct += (probs.argmax(1) == y).sum().item()
    return Evaluation(total_loss / len(split), correct / len(split))


@torch.no_grad()
def _reconstruction_ensemble(
    model: nn.Module, params_list: list[Mapping[str, Tensor]], split: Split, batch_size: int
) -> Evaluation:
    model.eval()
    total = 0.0
    for start in range(0, len(split), batch_size):
        x = inputs_like(split.x[start : start + batch_size], params_list[0])
        mean = torch.stack([functional_method(model, p, "predict", x) for p in params_list]).mean(0)
        total += float(model.prediction_loss(mean, x)) * len(x)
    return Evaluation(total / len(split), float("nan"))
