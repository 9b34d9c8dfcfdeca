"""Loss and accuracy of a parameter dict on a data split, via ``torch.func.functional_call``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split, inputs_like
from lmclab.core.objective import (
    batch_loss_correct,
    correct_of,
    functional_method,
    is_reconstruction,
    logits_of,
    per_position,
)


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
            [F.softmax(logits_of(functional_call(model, dict(p), (x,), tie_weights=False)), -1) for p in params_list]
        ).mean(0)
        total_loss += _nll_sum(probs.clamp_min(1e-12).log(), y)
        correct += correct_of(probs, y)
    return Evaluation(total_loss / len(split), correct / len(split))


def _nll_sum(log_probs: Tensor, y: Tensor) -> float:
    """The samples' summed negative log-likelihood (targets per position: each sample's mean over them)."""
    if per_position(log_probs, y):
        nll = F.nll_loss(log_probs.flatten(0, -2), y.flatten(), reduction="none")
        return float(nll.view(y.shape).flatten(1).mean(1).sum())
    return F.nll_loss(log_probs, y, reduction="sum").item()


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
