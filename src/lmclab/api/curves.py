"""Loss and accuracy along the straight line between two models, and its barriers (the paper's Definition 2.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from lmclab.api.alignment import Alignment, aligned_pair
from lmclab.api.inputs import Data, Model, as_split, on_device, open_models, read_weights, skeleton
from lmclab.core.batches import as_batch, streamed
from lmclab.core.data import Split
from lmclab.core.device import resolve_device
from lmclab.core.evaluate import Evaluation, evaluate
from lmclab.core.interpolation import barriers_from_curve
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import lambda_grid
from lmclab.core.objective import custom_loss
from lmclab.core.options import keyed_errors
from lmclab.core.repairs import curve_repairs

QUANTITIES, KINDS = ("loss", "acc"), ("max", "mid")


@dataclass(frozen=True, repr=False)
class Curve:
    """Rows ``{lam, split, loss, acc}`` of ``θ(λ) = λ·θa + (1−λ)·θb`` (λ = 1: θa, λ = 0: θb)."""

    rows: list[dict]

    def __repr__(self) -> str:
        return (
            f"Curve(splits={self.splits}, {len(self.lambdas)} λ values, "
            f"loss barrier {self.barrier():.4g} on {self.splits[0]!r})"
        )

    def to_frame(self) -> Any:
        """The rows as a pandas ``DataFrame`` (columns ``lam``, ``split``, ``loss``, ``acc``)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["lam", "split", "loss", "acc"])

    @property
    def lambdas(self) -> list[float]:
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
    eval_data: Data | Mapping[str, Data],
    alignment: Alignment | None = None,
    model: nn.Module | None = None,
    factory: str | Callable[..., nn.Module] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    num_lambdas: int = 11,
    lambdas: Sequence[float] | None = None,
    repair: str = "none",
    repair_data: Data | None = None,
    repair_samples: int | None = 500,
    device: str = "auto",
    progress: bool = False,
    loss_fn: Callable[[Any, Tensor], Tensor] | None = None,
) -> Curve:
    """Evaluate ``θ(λ) = λ·θa + (1−λ)·π(θb)`` (π from ``alignment``, :meth:`Alignment.apply`; the naive path
    without one) for ``num_lambdas`` evenly spaced λ in [0, 1] plus ½ — or the given ``lambdas``, which must
    hold 0, ½ and 1 — on ``eval_data`` (one source, called ``test``, or ``{name: source}``): the measured
    path of the paper's Definition 2.1, whose barriers :meth:`Curve.barrier` gives. A ``DataLoader`` (any re-iterable of
    batches) is streamed, one pass over its batches per λ (it should yield the same samples each time: no
    random augmentation); any other source is held in memory (:func:`lmclab.as_split`). The models are
    modules, state dicts or checkpoint paths, run in ``model`` (or ``factory(**kwargs)``, or the
    checkpoint's module) as :func:`lmclab.find_permutation` takes them, and compared in the dtype
    :func:`lmclab.api.weights.compute_dtype` chooses for the pair (float32 for half precisions).

    ``repair`` (:mod:`lmclab.core.repairs`): ``bn`` re-estimates every BatchNorm's statistics at each λ,
    ``repair`` rescales each unit of θ(λ) to the interpolated statistics of the endpoints (REPAIR, networks
    without BatchNorm), ``auto`` the one the network takes, ``none``; both on a fixed subset of
    ``repair_samples`` inputs (None: all) of ``repair_data``, held in memory. ``progress``: a bar over the λ
    values (on stderr). ``loss_fn(output, target)`` (a batch's mean loss) replaces the cross-entropy of the
    logits (:mod:`lmclab.core.objective`); accuracy is then read from the logits when the output has them
    and targets are labels."""
    grid = _grid(num_lambdas, lambdas)
    dev = resolve_device(device)
    opened = open_models([model_a, model_b], ["model_a", "model_b"], model=model, factory=factory, kwargs=kwargs)
    same = alignment is None or not alignment.widths  # θb of other widths: embedded by the alignment
    params_a, params_b = read_weights(opened.models, ["model_a", "model_b"], dev, same_shapes=same).params
    params_a, params_b = aligned_pair(alignment, params_a, params_b)
    net = on_device(skeleton(opened.model, opened.models[0], "evaluating the models"), dev)
    sources, labels = _sources(eval_data, dev)
    fix, fix_at = _repairs(net, repair, repair_data, repair_samples, dev)
    rows = []
    with torch.no_grad(), custom_loss(loss_fn):
        for lam in tqdm(grid, desc="curve", unit="λ", disable=not progress, leave=False):
            params = lerp_params(params_a, params_b, lam) if fix_at is None else fix_at(params_a, params_b, lam)
            params = fix(params) if fix is not None else params
            for name, source in sources.items():
                ev = (
                    evaluate(net, params, source)
                    if isinstance(source, Split)
                    else _streamed(net, params, source, labels[name])
                )
                rows.append({"lam": float(lam), "split": name, "loss": ev.loss, "acc": ev.acc})
    return Curve(rows)


def _grid(num_lambdas: int, lambdas: Sequence[float] | None) -> list[float]:
    """The λ of a curve: the given ``lambdas`` (holding 0, ½ and 1), else ``num_lambdas`` evenly spaced plus ½."""
    if lambdas is None:
        with keyed_errors(str):
            return lambda_grid(num_lambdas)
    grid = sorted({float(v) for v in lambdas})
    if not {0.0, 0.5, 1.0} <= set(grid) or not all(0.0 <= v <= 1.0 for v in grid):
        raise ValueError(f"lambdas must lie in [0, 1] and hold 0, 0.5 and 1, got {grid}")
    return grid


def _sources(eval_data: Data | Mapping[str, Data], dev: torch.device) -> tuple[dict[str, Any], dict[str, str]]:
    """``eval_data`` as ``{name: source}`` (a lone source is ``test``), each streamed or in memory on ``dev``,
    and the argument name of each (``eval_data`` or ``eval_data['name']``) for its errors."""
    named = isinstance(eval_data, Mapping)
    found = eval_data if named else {"test": eval_data}
    labels = {name: f"eval_data[{name!r}]" if named else "eval_data" for name in found}
    sources = {name: s if streamed(s) else as_split(s, labels[name]).to(dev) for name, s in found.items()}
    return sources, labels


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


def _repairs(net: nn.Module, repair: str, repair_data: Data | None, samples: int | None, dev: torch.device):
    """``(repair, repair_at)`` of each λ (:func:`lmclab.core.repairs.curve_repairs`), checked before any work."""
    split = as_split(repair_data, "repair_data").to(dev) if repair_data is not None and repair != "none" else None
    with keyed_errors(str):
        return curve_repairs(repair, net, split, repair_samples=samples)
