"""The paper's analyses of one trained model and of one aligned pair (its Sections 3–4), composed from
:mod:`lmclab.analysis.taylor`, :mod:`lmclab.analysis.alignment` and :mod:`lmclab.analysis.energy`.

- :func:`analyze_model` (depends only on one trained model and the data): every layer's singular
  values and input energy (Figures 1, 4, 7, 9).
- :func:`analyze_pair` (one pair and one permutation, :class:`Endpoints`, analysed as :class:`Analysis`
  says): the Taylor-approximated barrier over the λ grid on every split (Table 1), R_γ for (θa, θb),
  (θa, π(θb)), (θa, mid) and (π(θb), mid) (Figures 2, 3) and the Theorem 4.2 bound per layer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor, nn

from lmclab.analysis.alignment import (
    Factors,
    alignment_r,
    layer_alignment,
    layer_names,
    model_factors,
    output_layer,
    singular_values,
)
from lmclab.analysis.circuits import circuit_barrier
from lmclab.analysis.cka import cka_means, cka_rows
from lmclab.analysis.energy import input_energy, input_sizes, product_layers, theorem42
from lmclab.analysis.families import family_barriers
from lmclab.analysis.taylor import taylor_barrier, taylor_curve, taylor_terms
from lmclab.analysis.temperature import calibrated_barrier
from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World
from lmclab.core.interpolation import Repair, RepairAt, measure_pair_with_repair
from lmclab.core.objective import is_reconstruction
from lmclab.core.spec import PermutationSpec


def r_key(gamma: float, which: str = "") -> str:
    """Column name of R_γ: ``R_0.3`` for (θa, π(θb)); ``R_0.3_naive``, ``R_0.3_a_mid``, ``R_0.3_b_mid``."""
    return f"R_{gamma:g}" + (f"_{which}" if which else "")


def _spectral_kwargs(model: nn.Module, layers: Sequence[str], mode: str, input_shape: Sequence[int]) -> dict:
    sizes = input_sizes(model, layers, input_shape) if mode == "fft" else {}
    return {"mode": mode, "input_sizes": sizes}


def analyze_model(
    spec: PermutationSpec,
    model: nn.Module,
    params: Mapping[str, Tensor],
    split: Split,
    *,
    mode: str = "reshape",
    input_shape: Sequence[int],
) -> tuple[list[dict], list[dict]]:
    """``(spectrum rows, energy rows)``: ``{layer, output, index, singular_value}`` in the chosen
    spectrum ``mode``, and ``{layer, index, singular_value, energy}`` of the reshaped weights
    (energy ``E[(v_iᵀ z_{ℓ−1})²]`` over ``split``). ``output`` marks the logits layer."""
    layers = layer_names(spec, params)
    last = output_layer(spec, layers)
    factors = model_factors(params, layers, **_spectral_kwargs(model, layers, mode, input_shape))
    spectrum = [
        {"layer": name, "output": name == last, "index": i, "singular_value": float(s)}
        for name, f in factors.items()
        for i, s in enumerate(singular_values(f))
    ]
    energy = [
        {"layer": name, "index": i, "singular_value": float(s), "energy": float(e)}
        for name, (sv, en) in input_energy(model, params, split, product_layers(model, layers)).items()
        for i, (s, e) in enumerate(zip(sv, en, strict=True))
    ]
    return spectrum, energy


def endpoint_factors(
    spec: PermutationSpec,
    model: nn.Module,
    params: Mapping[str, Tensor],
    *,
    mode: str = "reshape",
    input_shape: Sequence[int],
) -> dict[str, Factors]:
    """Every layer's SVD in ``mode``: computed once per endpoint and handed to each method's
    :func:`analyze_pair` (θa and θb are the same for every method; an SVD is most of R's cost)."""
    layers = layer_names(spec, params)
    return model_factors(params, layers, **_spectral_kwargs(model, layers, mode, input_shape))


def alignment_rs(
    fa: Mapping[str, Factors],
    fb: Mapping[str, Factors],
    fp: Mapping[str, Factors],
    fm: Mapping[str, Factors],
    gammas: Sequence[float],
) -> dict[str, float]:
    """R_γ (Theorem 4.1) for every γ from the factors of θa, θb, π(θb) and the midpoint."""
    out: dict[str, float] = {}
    for gamma in gammas:
        out[r_key(gamma)] = alignment_r(fa, fp, gamma)
        out[r_key(gamma, "naive")] = alignment_r(fa, fb, gamma)
        out[r_key(gamma, "a_mid")] = alignment_r(fa, fm, gamma)
        out[r_key(gamma, "b_mid")] = alignment_r(fp, fm, gamma)
    return out


def layer_alignment_rows(fa: Mapping[str, Factors], fp: Mapping[str, Factors], gammas: Sequence[float]) -> list[dict]:
    """Each layer's share of R_γ(θa, π(θb)) for every γ (:func:`~lmclab.analysis.alignment.layer_alignment`):
    ``{layer, gamma, numerator, kept, R}``; R is NaN where no triplet of the layer passes the threshold."""
    rows = []
    for gamma in gammas:
        for layer, (numerator, kept) in layer_alignment(fa, fp, gamma).items():
            r = numerator / kept if kept else float("nan")
            rows.append({"layer": layer, "gamma": float(gamma), "numerator": numerator, "kept": kept, "R": r})
    return rows


def alignment_summary(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    midpoint: Mapping[str, Tensor],
    gammas: Sequence[float],
    *,
    mode: str = "reshape",
    input_shape: Sequence[int],
) -> dict[str, float]:
    """R_γ (Theorem 4.1) for every γ: (θa, π(θb)), naive (θa, θb), (θa, mid), (π(θb), mid)."""
    fa, fb, fp, fm = (
        endpoint_factors(spec, model, p, mode=mode, input_shape=input_shape)
        for p in (params_a, params_b, permuted_b, midpoint)
    )
    return alignment_rs(fa, fb, fp, fm, gammas)


class Circuits(NamedTuple):
    """The circuit space of a pair (:mod:`lmclab.analysis.circuits`): the model of heads twice as wide, and the
    spec with each head's features as units."""

    wide_model: nn.Module
    spec: PermutationSpec


@dataclass(frozen=True)
class Analysis:
    """How an aligned pair is analysed: the λ ``lams`` of the Taylor curve, the γ of R_γ, the spectrum
    ``mode`` of conv kernels with the model's ``input_shape`` (the FFT spectrum needs it), the splits of the
    Taylor barrier (None: every split) and the split of the Theorem 4.2 bound; with ``calibrate_temperature``, the
    barrier at ½ with each model's softmax temperature calibrated on the train split too
    (:mod:`lmclab.analysis.temperature`); with ``circuits``, the test barrier at ½ in circuit space
    (:mod:`lmclab.analysis.circuits`); with ``family_barriers``, the test barriers at ½ of the paths that move
    one family of layers alone and every family but one (:mod:`lmclab.analysis.families`)."""

    lams: Sequence[float]
    gammas: Sequence[float]
    input_shape: Sequence[int]
    mode: str = "reshape"
    taylor_splits: Sequence[str] | None = None
    energy_split: str = "test"
    calibrate_temperature: bool = False
    circuits: Circuits | None = None
    family_barriers: bool = False

    def factors(self, pair: Endpoints, params: Mapping[str, Tensor]) -> dict[str, Factors]:
        """:func:`endpoint_factors` of ``params`` (a model of ``pair``) in this analysis' ``mode``."""
        return endpoint_factors(pair.spec, pair.model, params, mode=self.mode, input_shape=self.input_shape)


@dataclass(frozen=True)
class Endpoints:
    """θa and θb of one pair with their permutation spec, the model skeleton and the data splits;
    ``factors_a``/``factors_b``: their :func:`endpoint_factors`, when computed once for every method."""

    spec: PermutationSpec
    model: nn.Module
    params_a: Mapping[str, Tensor]
    params_b: Mapping[str, Tensor]
    splits: Mapping[str, Split]
    factors_a: Mapping[str, Factors] | None = None
    factors_b: Mapping[str, Factors] | None = None


def analyze_pair(
    pair: Endpoints, permuted_b: Mapping[str, Tensor], midpoint: Mapping[str, Tensor], how: Analysis
) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """``(summary, tables)`` for θa and the aligned π(θb) of ``pair``.

    summary: ``{split}_taylor_barrier_mid`` / ``_max`` and the Theorem 3.1 ingredients per split,
    the R_γ columns of :func:`alignment_summary` and ``analysis_seconds``; tables (lists of rows):
    ``taylor`` ``{split, lam, taylor}``, ``theorem42`` ``{layer, bound, measured}`` on ``how.energy_split``
    and ``alignment``, each layer's share of R_γ(θa, π(θb)) (:func:`layer_alignment_rows`)."""
    start = time.perf_counter()
    model, params_a, splits = pair.model, pair.params_a, pair.splits
    summary: dict[str, float] = {}
    taylor_rows = []
    for name in splits if how.taylor_splits is None else how.taylor_splits:  # None: every split
        terms = taylor_terms(model, params_a, permuted_b, splits[name])
        curve = taylor_curve(terms, how.lams)
        taylor_rows += [{"split": name, "lam": float(lam), "taylor": t} for lam, t in zip(how.lams, curve, strict=True)]
        summary[f"{name}_taylor_barrier_mid"] = taylor_barrier(terms, 0.5)
        summary[f"{name}_taylor_barrier_max"] = max(curve)
        summary.update({f"{name}_taylor_{k}": v for k, v in terms._asdict().items()})
    fa = how.factors(pair, params_a) if pair.factors_a is None else pair.factors_a
    fb = how.factors(pair, pair.params_b) if pair.factors_b is None else pair.factors_b
    fp, fm = how.factors(pair, permuted_b), how.factors(pair, midpoint)
    summary.update(alignment_rs(fa, fb, fp, fm, how.gammas))
    shared = {"factors_a": fa, "factors_b": fp} if how.mode == "reshape" else {}  # Theorem 4.2 reshapes kernels
    layers = product_layers(model, layer_names(pair.spec, params_a))
    bound_rows = theorem42(model, params_a, permuted_b, splits[how.energy_split], layers, **shared)
    tables = {"taylor": taylor_rows, "theorem42": bound_rows, "alignment": layer_alignment_rows(fa, fp, how.gammas)}
    summary["analysis_seconds"] = time.perf_counter() - start
    return summary, tables


def measure_and_analyze(
    pair: Endpoints,
    permuted_b: Mapping[str, Tensor],
    midpoint: Mapping[str, Tensor],
    how: Analysis,
    *,
    repair: Repair | None = None,
    repair_at: RepairAt | None = None,
    world: World = ALONE,
) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """Everything measured on one aligned pair: the interpolation curves and barriers (with BN
    repair or REPAIR when given; sharded over ``world``'s processes), L2 distances, the analyses of
    :func:`analyze_pair` (every process computes them whole) and the CKA of the hidden layers on the
    test split (:mod:`lmclab.analysis.cka`; the summary gets their means over layers).
    Returns ``(summary, tables)``: the tables of :func:`analyze_pair` with ``curve`` and ``cka`` (rows), and
    ``families`` with ``how.family_barriers``."""
    spec, model, params_a, params_b = pair.spec, pair.model, pair.params_a, pair.params_b
    curve, summary = measure_pair_with_repair(
        spec,
        model,
        params_a,
        params_b,
        permuted_b,
        how.lams,
        pair.splits,
        repair=repair,
        repair_at=repair_at,
        world=world,
    )
    analysis, tables = analyze_pair(pair, permuted_b, midpoint, how)
    models = {"a": params_a, "b": params_b, "pi_b": permuted_b, "mid": midpoint}
    cka = cka_rows(spec, model, models, pair.splits["test"])
    if how.calibrate_temperature and not is_reconstruction(model):
        summary |= calibrated_barrier(model, params_a, permuted_b, pair.splits["train"], pair.splits["test"])
    if how.circuits is not None:
        wide, heads = how.circuits
        summary |= circuit_barrier(heads, wide, params_a, permuted_b, pair.splits["test"])
    if how.family_barriers:
        tables["families"] = family_barriers(model, params_a, permuted_b, pair.splits["test"])
    return {**summary, **analysis, **cka_means(cka)}, {"curve": curve, **tables, "cka": cka}
