"""Which repair a merged or interpolated model gets — one vocabulary for the pipeline, the API and the
command: ``none``; ``bn``, every BatchNorm's running statistics recomputed on training data (Jordan et al.
2023; needed for BatchNorm networks, the paper's Appendix D); ``repair``, REPAIR, each unit's mean and std
rescaled to the interpolation of the endpoints' (networks without BatchNorm); ``auto``, the one the network
takes: ``bn`` with BatchNorm, ``repair`` without."""

from __future__ import annotations

from torch import nn

from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm, repair_subset
from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World
from lmclab.core.interpolation import Repair
from lmclab.core.options import OptionError, got
from lmclab.core.repair import RepairAt

REPAIRS = ("auto", "none", "bn", "repair")


def check_repair(repair: str) -> str:
    """``repair`` if it is one of :data:`REPAIRS`; an :class:`OptionError` naming ``repair`` otherwise."""
    if repair not in REPAIRS:
        raise OptionError(f"{{repair}} must be one of {list(REPAIRS)}, got {got(repair)}")
    return repair


def resolved_repair(repair: str, model: nn.Module) -> str:
    """``repair`` checked against ``model``, ``auto`` made the one it takes (``bn`` or ``repair``); an
    :class:`OptionError` naming ``repair`` when it is not a repair or does not fit the model."""
    if check_repair(repair) == "auto":
        return "bn" if has_batchnorm(model) else "repair"
    if repair != "none" and (repair == "bn") != has_batchnorm(model):
        need = "bn: the model has BatchNorm" if has_batchnorm(model) else "repair or none: the model has no BatchNorm"
        raise OptionError(f"{{repair}}: {got(repair)} does not fit this model; use {need}")
    return repair


def curve_repairs(
    repair: str, model: nn.Module, data: Split | None, *, repair_samples: int | None, world: World = ALONE
) -> tuple[Repair | None, RepairAt | None]:
    """``(repair, repair_at)`` of :func:`lmclab.core.interpolation.interpolation_curve` for each θ(λ):
    BatchNorm statistics recomputed on a fixed subset of ``repair_samples`` images of ``data``, or REPAIR
    of θ(λ) to the interpolated statistics of the endpoints on that subset; ``(None, None)`` for ``none``."""
    kind = resolved_repair(repair, model)
    if kind == "none":
        return None, None
    if data is None:
        raise OptionError(f"{{repair_data}}: repair {got(kind)} needs training data, got None")
    if kind == "bn":
        return bn_repair_hook(model, data, repair_samples=repair_samples, world=world), None
    return None, RepairAt(model, repair_subset(data, repair_samples))
