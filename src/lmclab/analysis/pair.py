"""One pair of trained endpoints measured under each method's alignment — the measure stage's work as one
library call: :func:`prepare_pair` builds what every method shares (the model skeleton, θa and θb on the
device, the repair of each λ, both endpoints' SVDs), :func:`measure_method` measures one method's π(θb) and
midpoint (:func:`lmclab.analysis.compose.measure_and_analyze`, plus the MAE's own tables for reconstruction
models) and returns the tables and summary to write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from torch import Tensor, nn

from lmclab.analysis.alignment import check_gammas, check_mode
from lmclab.analysis.compose import Analysis, Circuits, Endpoints, measure_and_analyze
from lmclab.analysis.mae_pair import mae_pair
from lmclab.archs import build_model, circuit_model, get_arch
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.bn_repair import repair_subset
from lmclab.core.data import Split, inputs_like
from lmclab.core.distributed import ALONE, World
from lmclab.core.interpolation import Repair
from lmclab.core.metrics import lambda_grid
from lmclab.core.objective import is_reconstruction
from lmclab.core.repair import RepairAt
from lmclab.core.repairs import curve_repairs
from lmclab.trace import trace_spec


@dataclass(frozen=True)
class MeasureSettings:
    """How each pair is measured (the measure stage's parameters): ``num_lambdas`` λ of the curves,
    the ``gammas`` of R_γ, the ``taylor_splits``, the ``conv_spectrum`` of conv kernels, the ``repair`` of every
    λ (:mod:`lmclab.core.repairs`: none, bn, repair or auto) on ``repair_samples`` training images (None: all);
    the train split's curves on a fixed random subset of ``train_samples`` (None: all); with
    ``calibrate_temperature``, the barrier at ½ with softmax temperatures calibrated on that subset
    (:mod:`lmclab.analysis.temperature`); with ``circuits``, the test barrier at ½ in circuit space (each head's
    QKᵀ and OV circuits interpolated, :mod:`lmclab.analysis.circuits`); with ``family_barriers``, the test
    barriers at ½ of the paths that move one family of layers alone and all but one
    (:mod:`lmclab.analysis.families`)."""

    num_lambdas: int = 11
    gammas: Sequence[float] = (0.0, 0.3)
    taylor_splits: Sequence[str] | None = ("test",)
    conv_spectrum: str = "reshape"
    repair: str = "none"
    repair_samples: int | None = 500
    train_samples: int | None = None
    calibrate_temperature: bool = False
    circuits: bool = False
    family_barriers: bool = False

    @classmethod
    def of(cls, block: Mapping) -> MeasureSettings:
        """The settings named in ``block`` (its other keys, e.g. the stage's process count, ignored)."""
        return cls(**{f.name: block[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Pair:
    """What every method of one pair shares: the :class:`~lmclab.analysis.compose.Endpoints` (with their
    SVDs), how they are analysed, and the repair of each λ (BatchNorm statistics or REPAIR, if any)."""

    endpoints: Endpoints
    how: Analysis
    repair: Repair | None
    repair_at: RepairAt | None
    world: World


def prepare_pair(
    a: Checkpoint, b: Checkpoint, splits: Mapping[str, Split], settings: MeasureSettings, *, world: World = ALONE
) -> Pair:
    """θa (``a``) and θb (``b``) on ``world``'s device, measured on ``splits`` (``train`` and ``test``) as
    ``settings`` say. Errors name the settings' fields."""
    lams = lambda_grid(settings.num_lambdas)
    check_mode(settings.conv_spectrum)
    check_gammas(settings.gammas)
    device = world.device
    model = build_model(a.arch, a.config).to(device)
    repair, repair_at = build_repairs(settings, model, splits["train"], world=world)
    splits = {**splits, "train": repair_subset(splits["train"], settings.train_samples, key="train_samples")}
    spec = get_arch(a.arch).permutation_spec(a.config)
    params_a, params_b = (on_device(c.state_dict, device) for c in (a, b))
    how = Analysis(
        lams=lams,
        gammas=[float(g) for g in settings.gammas],
        input_shape=a.config.input_shape,
        mode=settings.conv_spectrum,
        taylor_splits=settings.taylor_splits,
        calibrate_temperature=settings.calibrate_temperature,
        circuits=circuits_of(a, model, splits["train"], device) if settings.circuits else None,
        family_barriers=settings.family_barriers,
    )
    bare = Endpoints(spec, model, params_a, params_b, splits)
    endpoints = Endpoints(  # the endpoints' SVDs, shared by every method
        spec, model, params_a, params_b, splits, how.factors(bare, params_a), how.factors(bare, params_b)
    )
    return Pair(endpoints, how, repair, repair_at, world)


def circuits_of(a: Checkpoint, model: nn.Module, train: Split, device) -> Circuits:
    """The circuit space of ``a``'s architecture: its model of heads twice as wide, and ``model``'s spec traced
    with each head's features as units (:func:`lmclab.analysis.circuits.circuit_params`)."""
    spec = trace_spec(model, inputs_like(train.x[:2], dict(model.state_dict())), symmetry="orthogonal")
    return Circuits(circuit_model(a.arch, a.config).to(device), spec)


def build_repairs(
    settings: MeasureSettings, model: nn.Module, train: Split, *, world: World = ALONE
) -> tuple[Repair | None, RepairAt | None]:
    """``(repair, repair_at)`` of ``model`` on ``train`` as ``settings`` say
    (:func:`lmclab.core.repairs.curve_repairs`): BatchNorm statistics recomputed at every λ, or REPAIR, or
    neither (None)."""
    return curve_repairs(settings.repair, model, train, repair_samples=settings.repair_samples, world=world)


def measure_method(pair: Pair, permuted_b: Checkpoint, midpoint: Checkpoint) -> tuple[dict[str, list[dict]], dict]:
    """``(tables, summary)`` of one method's aligned π(θb) and merged midpoint: the tables ``curve``,
    ``taylor``, ``theorem42``, ``alignment``, ``cka`` (MAE endpoints also ``mae`` and ``residual``,
    :func:`lmclab.analysis.mae_pair.mae_pair`) as rows, the summary as one mapping."""
    device, ends = pair.world.device, pair.endpoints
    aligned = on_device(permuted_b.state_dict, device)
    summary, tables = measure_and_analyze(
        ends,
        aligned,
        on_device(midpoint.state_dict, device),
        pair.how,
        repair=pair.repair,
        repair_at=pair.repair_at,
        world=pair.world,
    )
    if is_reconstruction(ends.model):  # MAE endpoints: the encoder as a representation, patch errors, blocks
        train, test = (ends.splits[s].to(device) for s in ("train", "test"))
        tables["mae"], tables["residual"], extra = mae_pair(
            ends.model, ends.params_a, aligned, train, test, pair.how.lams
        )
        summary |= extra
    return tables, summary


def on_device(state: Mapping[str, Tensor], device) -> dict[str, Tensor]:
    """``state``'s tensors moved to ``device``."""
    return {k: v.to(device) for k, v in state.items()}
