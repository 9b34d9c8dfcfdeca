"""Loss and accuracy along the straight line between two models, and its barriers (the paper's Definition 2.1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmclab.api.inputs import Data, Model, as_split, named_as, params_of, skeleton
from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm
from lmclab.core.device import resolve_device
from lmclab.core.interpolation import barriers_from_curve, interpolation_curve
from lmclab.core.metrics import lambda_grid

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
) -> Curve:
    """Evaluate ``θ(λ)`` for every λ (``lams`` evenly spaced values in [0, 1] plus ½, or the given
    ones, which must hold 0, ½ and 1) on ``data`` (one data source, or ``{name: source}``): the
    measured path of the paper's Definition 2.1, whose barriers :meth:`Curve.barrier` gives. Every
    source is held in memory as one :class:`~lmclab.core.data.Split` (:func:`lmclab.as_split`): each
    λ makes one more pass over it, and a DataLoader is not guaranteed to yield the same batches twice.

    ``model_b`` is usually the aligned π(θb) (:func:`lmclab.apply_permutation`). ``repair="bn"``
    re-estimates every BatchNorm's statistics at each λ on ``repair_samples`` inputs of
    ``repair_data`` (REPAIR-style reset; needed for BN networks)."""
    with named_as(num_lambdas="lams"):
        grid = lambda_grid(lams) if isinstance(lams, int) else sorted({float(v) for v in lams})
    if not {0.0, 0.5, 1.0} <= set(grid) or not all(0.0 <= v <= 1.0 for v in grid):
        raise ValueError(f"lams must lie in [0, 1] and hold 0, 0.5 and 1, got {grid}")
    dev = resolve_device(device)
    net = skeleton(model, model_a, "evaluating the models").to(dev)
    params_a, params_b = params_of(model_a, "model_a", dev), params_of(model_b, "model_b", dev)
    named = isinstance(data, Mapping)
    sources = data if named else {"test": data}
    splits = {
        name: as_split(source, f"data[{name!r}]" if named else "data").to(dev) for name, source in sources.items()
    }
    hook = None
    if repair == "bn":
        if not has_batchnorm(net):
            raise ValueError("repair: 'bn' needs a model with BatchNorm layers; this one has none")
        if repair_data is None:
            raise ValueError("repair_data: repair='bn' needs data to re-estimate the statistics on")
        with named_as(num_samples="repair_samples"):
            hook = bn_repair_hook(net, as_split(repair_data, "repair_data").to(dev), num_samples=repair_samples)
    elif repair is not None:
        raise ValueError(f"repair must be None or 'bn', got {repair!r}")
    with torch.no_grad():
        rows = interpolation_curve(net, params_a, params_b, grid, splits, repair=hook)
    return Curve(rows)
