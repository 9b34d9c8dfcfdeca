"""Loss and accuracy of a parameter dict on a data split, via ``torch.func.functional_call``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split


class Evaluation(NamedTuple):
    loss: float  # mean cross-entropy (nats)
    acc: float  # fraction correct, 0..1


@torch.no_grad()
def evaluate(model: nn.Module, params: Mapping[str, Tensor], split: Split, *, batch_size: int = 1024) -> Evaluation:
    """Mean cross-entropy and accuracy of ``model`` run with ``params`` in eval mode."""
    device = next(iter(params.values())).device
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(split), batch_size):
        x = split.x[start : start + batch_size].to(device)
        y = split.y[start : start + batch_size].to(device)
        logits = functional_call(model, dict(params), (x,))
        total_loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    model.train(was_training)
    return Evaluation(total_loss / len(split), correct / len(split))


@torch.no_grad()
def evaluate_ensemble(
    model: nn.Module, params_list: list[Mapping[str, Tensor]], split: Split, *, batch_size: int = 1024
) -> Evaluation:
    """The output ensemble: mean of the members' softmax probabilities; loss is its NLL."""
    device = next(iter(params_list[0].values())).device
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(split), batch_size):
        x = split.x[start : start + batch_size].to(device)
        y = split.y[start : start + batch_size].to(device)
        probs = torch.stack([F.softmax(functional_call(model, dict(p), (x,)), 1) for p in params_list]).mean(0)
        total_loss += F.nll_loss(probs.clamp_min(1e-12).log(), y, reduction="sum").item()
        correct += (probs.argmax(1) == y).sum().item()
    return Evaluation(total_loss / len(split), correct / len(split))
