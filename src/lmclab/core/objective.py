"""The loss a model's forward pass defines, for every analysis that evaluates a loss (curves, barriers,
the data-driven searches' midpoint objective, Taylor terms).

Two objectives:

- ``classification`` (every classifier; the default): ``forward(x)`` returns logits (or an output holding
  them: a transformers ``ModelOutput``'s ``logits``, a dict's ``"logits"``, a tuple's first item), the
  loss is the mean cross-entropy against the labels and the accuracy is the fraction of correct argmaxes.
  Logits of shape ``(…, classes)`` with targets of shape ``(…)`` (a language model's ``(B, T, V)`` against
  token ids ``(B, T)``) are classified per position on the last axis: a sample's loss and accuracy are its
  positions' means. ``with custom_loss(loss_fn)`` (the API's ``loss_fn=``) replaces the cross-entropy by
  ``loss_fn(output, target)``, a batch's mean loss (accuracy is then read from logits when there are).
- ``reconstruction`` (a model whose class sets ``objective = "reconstruction"``, the masked autoencoder
  :mod:`lmclab.archs.mae`): ``forward(x)`` returns the model's own mean loss on ``x`` (MAE: the MSE of the
  masked patches under masks drawn from its ``mask_seed``, the same masks at every λ of a curve); labels
  are not read and there is no accuracy (NaN). Such a model also has ``predict(x)`` (its outputs under
  the same masks) and ``prediction_loss(prediction, x)`` (the loss of given outputs), which the output
  ensemble uses: the loss of the members' mean prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

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


_LOSS: ContextVar[Callable[[object, Tensor], Tensor] | None] = ContextVar("loss_fn", default=None)


@contextmanager
def custom_loss(loss_fn: Callable[[object, Tensor], Tensor] | None) -> Iterator[None]:
    """Within the block, ``loss_fn(output, target)`` (a batch's mean loss) is the classification loss."""
    token = _LOSS.set(loss_fn)
    try:
        yield
    finally:
        _LOSS.reset(token)


def logits_of(out: object) -> Tensor:
    """The logits of a forward pass's output (module docstring)."""
    if isinstance(out, Tensor):
        return out
    if isinstance(out, Mapping) and "logits" in out:
        return out["logits"]
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, tuple | list) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}, with no logits; pass loss_fn=(output, target) -> loss")


def per_position(logits: Tensor, y: Tensor) -> bool:
    """A class per position, on the last axis: ``(…, classes)`` logits against ``(…)`` targets, ``…`` ≥ 2 axes."""
    return logits.dim() > 2 and tuple(logits.shape[:-1]) == tuple(y.shape)


def sample_losses(out: object, y: Tensor) -> Tensor:
    """Each sample's cross-entropy (per-position targets: the mean over its positions)."""
    logits = logits_of(out)
    if per_position(logits, y):
        return F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(y.shape).flatten(1).mean(1)
    return F.cross_entropy(logits, y, reduction="none")


def correct_of(out: object, y: Tensor) -> float:
    """Correct predictions summed over samples (per-position targets: each sample's fraction correct)."""
    logits = logits_of(out)
    if per_position(logits, y):
        return float((logits.argmax(-1) == y).flatten(1).float().mean(1).sum())
    return float((logits.argmax(1) == y).sum())


def batch_loss(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """The mean loss of ``model`` run with ``params`` on the batch ``(x, y)`` (differentiable)."""
    out = functional_call(model, dict(params), (x,), tie_weights=False)
    if is_reconstruction(model):
        return out
    loss_fn = _LOSS.get()
    return loss_fn(out, y) if loss_fn is not None else sample_losses(out, y).mean()


def batch_loss_correct(model: nn.Module, params: Mapping[str, Tensor], x: Tensor, y: Tensor) -> tuple[float, float]:
    """The summed loss over the batch and the number of correct predictions (NaN: reconstruction, or a
    custom loss on outputs with no logits)."""
    out = functional_call(model, dict(params), (x,), tie_weights=False)
    if is_reconstruction(model):
        return float(out) * len(x), float("nan")
    loss_fn = _LOSS.get()
    if loss_fn is None:  # real-valued targets: soft labels, no accuracy
        return sample_losses(out, y).sum().item(), float("nan") if y.is_floating_point() else correct_of(out, y)
    try:  # class labels and logits: their accuracy; else (a regression, no logits) the loss is all there is
        correct = float("nan") if y.is_floating_point() else correct_of(out, y)
    except TypeError:
        correct = float("nan")
    return float(loss_fn(out, y)) * len(x), correct
