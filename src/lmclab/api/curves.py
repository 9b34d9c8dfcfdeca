"""Loss and accuracy along the straight line between two models, and its barriers (the paper's Definition 2.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from lmclab.api.inputs import Data, Model, as_split, named_as, on_device, params_of, skeleton
from lmclab.core.batches import as_batch, streamed
from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm
from lmclab.core.data import Split
from lmclab.core.device import resolve_device
from lmclab.core.evaluate import Evaluation, evaluate
from lmclab.core.interpolation import barriers_from_curve
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import lambda_grid
from lmclab.core.objective import custom_loss

QUANTITIES, KINDS = ("loss", "acc"), ("max", "mid")


@dataclass(frozen=True, repr=False)
class Curve:
    """Rows ``{lam, split, loss, acc}`` of ``θ(λ) = λ·θa + (1−λ)·θb`` (λ = 1: θa, λ = 0: θb)."""

    rows: list[dict]

    def __repr__(self) -> str:
        return (
            f"Curve(splits={self.splits}, {len(self.lams)} λ values, "
            f"loss barrier {self.barrier():.4g} on {self.splits[0]!r})"
        )

    def to_frame(self) -> Any:
        """The rows as a pandas ``DataFrame`` (columns ``lam``, ``split``, ``loss``, ``acc``)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["lam", "split", "loss", "acc"])

    @property
    def lams(self) -> list[float]:
        return sorted({r["lam"] for r in self.rows})

    @property
    def splits(self) -> list[str]:
        return list(dict.fromkeys(r["split"] for r in self.rows))

    def barriers(self) -> dict[str, float]:
        """Every barrier and endpoint value, ``<split>_<loss|acc>_barrier_<max|mid>`` and friends
        (accuracy in percentage points)."""
        return barriers_from_curve(self.rows)

    def barrier(self, quantity: str = "loss", kind: str = "max", split: str | None = None) -> float:
        """The ``kind`` barrier of ``quantity`` on ``split`` (default: the first): ``max`` is
        max over λ of the value minus the straight line between the endpoints (Eq. 1), ``mid``
        the same at λ = ½; accuracy barriers are in percentage points, a drop counts positive."""
        if quantity not in QUANTITIES or kind not in KINDS:
            raise ValueError(
                f"quantity must be one of {QUANTITIES} and kind one of {KINDS}, got {quantity!r}, {kind!r}"
            )
        split = self.splits[0] if split is None else split
        if split not in self.splits:
            raise ValueError(f"split: no split {split!r} in this curve; it has {self.splits}")
        return self.barriers()[f"{split}_{quantity}_barrier_{kind}"]


def curve(
    model_a: Model,
    model_b: Model,
    *,
    data: Data | Mapping[str, Data],
    model: nn.Module | None = None,
    lams: int | Sequence[float] = 11,
    repair: str | None = None,
    repair_data: Data | None = None,
    repair_samples: int | None = None,
    device: str = "auto",
    progress: bool = False,
    loss_fn: Callable[[Any, Tensor], Tensor] | None = None,
) -> Curve:
    """Evaluate ``θ(λ)`` for every λ (``lams`` evenly spaced values in [0, 1] plus ½, or the given
    ones, which must hold 0, ½ and 1) on ``data`` (one data source, or ``{name: source}``): the
    measured path of the paper's Definition 2.1, whose barriers :meth:`Curve.barrier` gives. A
    ``DataLoader`` (any re-iterable of batches) is streamed, one pass over its batches per λ (it should
    yield the same samples each time: no random augmentation); any other source is held in memory
    (:func:`lmclab.as_split`).

    ``model_b`` is usually the aligned π(θb) (:func:`lmclab.apply_permutation`). ``repair="bn"``
    re-estimates every BatchNorm's statistics at each λ on ``repair_samples`` inputs of
    ``repair_data`` (REPAIR-style reset; needed for BN networks), held in memory. ``progress``: a bar
    over the λ values (on stderr). ``loss_fn(output, target)`` (a batch's mean loss) replaces the
    cross-entropy of the logits (:mod:`lmclab.core.objective`: a language model's logits are classified
    per token already); accuracy is then read from the logits when the output has them and targets are labels."""
    with named_as(num_lambdas="lams"):
        grid = lambda_grid(lams) if isinstance(lams, int) else sorted({float(v) for v in lams})
    if not {0.0, 0.5, 1.0} <= set(grid) or not all(0.0 <= v <= 1.0 for v in grid):
        raise ValueError(f"lams must lie in [0, 1] and hold 0, 0.5 and 1, got {grid}")
    dev = resolve_device(device)
    net = on_device(skeleton(model, model_a, "evaluating the models"), dev)
    params_a, params_b = params_of(model_a, "model_a", dev), params_of(model_b, "model_b", dev)
    named = isinstance(data, Mapping)
    labels = {name: f"data[{name!r}]" if named else "data" for name in (data if named else {"test": data})}
    sources = {
        name: source if streamed(source) else as_split(source, labels[name]).to(dev)
        for name, source in (data if named else {"test": data}).items()
    }
    hook = _bn_hook(net, repair, repair_data, repair_samples, dev)
    rows = []
    with torch.no_grad(), custom_loss(loss_fn):
        for lam in tqdm(grid, desc="curve", unit="λ", disable=not progress, leave=False):
            params = lerp_params(params_a, params_b, lam)
            params = hook(params) if hook is not None else params
            for name, source in sources.items():
                ev = (
                    evaluate(net, params, source)
                    if isinstance(source, Split)
                    else _streamed(net, params, source, labels[name])
                )
                rows.append({"lam": float(lam), "split": name, "loss": ev.loss, "acc": ev.acc})
    return Curve(rows)


def _streamed(net: nn.Module, params: Mapping[str, Tensor], loader: Iterable[Any], name: str) -> Evaluation:
    """:func:`lmclab.core.evaluate.evaluate` over ``loader``'s batches, one at a time (sample-weighted)."""
    total, loss, correct = 0, 0.0, 0.0
    for batch in loader:
        x, y = as_batch(batch, name)
        if y is None:
            raise TypeError(f"{name}: expected (input, target) batches to evaluate on, got input tensors alone")
        ev = evaluate(net, params, Split(x, y if y.is_floating_point() else y.long()))
        total, loss, correct = total + len(y), loss + ev.loss * len(y), correct + ev.acc * len(y)
    if total == 0:
        raise ValueError(f"{name}: a DataLoader yielded no batches")
    return Evaluation(loss / total, correct / total)


def _bn_hook(net: nn.Module, repair: str | None, repair_data: Data | None, samples: int | None, dev: torch.device):
    """The BatchNorm reset applied at each λ for ``repair="bn"`` (None without repair)."""
    if repair is None:
        return None
    if repair != "bn":
        raise ValueError(f"repair must be None or 'bn', got {repair!r}")
    if not has_batchnorm(net):
        raise ValueError("repair: 'bn' needs a model with BatchNorm layers; this one has none")
    if repair_data is None:
        raise ValueError("repair_data: repair='bn' needs data to re-estimate the statistics on")
    with named_as(num_samples="repair_samples"):
        return bn_repair_hook(net, as_split(repair_data, "repair_data").to(dev), num_samples=samples)
