"""What weight matching will cost, from the sizes alone, before it starts: a model of one sweep's time and of the
streamed path's memory (:mod:`lmclab.search.wm_costs`), for a billion-parameter checkpoint whose search runs for
minutes.

**Time.** A sweep solves every group once (late sweeps skip the groups whose cost is unchanged: the estimate is an
upper bound for them). Group ``g``'s cost is one product per entry ``W`` it acts on, ``2·n_g·|W|`` flops (Ainsworth
et al.'s ``C_g = Σ W^a_(axis) · (W^b permuted)_(axis)ᵀ``), recomputed each time on the streamed path (its terms are
not kept), then one assignment of ``n_g`` units, and the sweep ends with ``⟨θa, π(θb)⟩`` (``2·|θ|`` flops). A
group of orthogonal maps (:mod:`lmclab.search.wm_orthogonal`) costs more: an element of ``m`` units applied to an
axis of ``W`` is a product, ``2·m·|W|`` flops in float64 (the maps are kept in float64), before each term and
each entry of the objective with such an axis, and its step is an SVD of its ``n_g``² cost instead of an
assignment. The machine's rates are measured on the spot (:func:`calibrate`: a float32 and a float64 product, a
1,024² assignment and a 256² SVD, about a tenth of a second); an assignment of ``n`` units takes
``t_1024·(n/1024)^2.5`` — the exponent fitted to the solvers' times on random costs from 2,048² to 14,336²
(``benchmarks/bench_lap_widths.py``) — and an SVD ``t_256·(n/256)^3``.

**Memory** beyond what the process holds when asked: the largest entry read whole in float32 four times over (θa's,
θb's, θb permuted, its unit rows), a slice of a sliced entry's as many, and the largest group's cost three times
(float32 term and sum, the solver's float64 copy) — checked against ``benchmarks/bench_llm_memory.py``'s peaks."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from lmclab.core.assignment import solve_assignment
from lmclab.core.orthogonal import MATRIX_KINDS
from lmclab.core.spec import PermutationSpec, entry_groups
from lmclab.search.wm_costs import SLICE, slice_axis

LAP_EXPONENT = 2.5  # an assignment's seconds grow as n^2.5 at 2,048²–14,336² (module docstring)


class Estimate(NamedTuple):
    """One sweep's products (flops), its seconds on this machine, and the search's memory beyond the process's."""

    groups: int
    flops: float
    seconds: float
    bytes: float

    def line(self) -> str:
        """The estimate in one line, as the ``lmclab`` command shows it before a streamed search."""
        return (
            f"estimated: {self.groups} groups, {self.flops / 1e12:.2f} TFLOP and {self.seconds:.0f} s per sweep "
            f"on this machine, {self.bytes / 1e9:.2f} GB beyond the process's"
        )


class Rates(NamedTuple):
    """This machine's float32 and float64 product rates (flops per second), and the seconds of one 1,024²
    assignment and of one 256² SVD."""

    flops: float
    lap_1024: float
    flops64: float
    svd_256: float


def calibrate(size: int = 1024, repeats: int = 5) -> Rates:
    """This machine's :class:`Rates`: products of ``size`` × ``2·size`` by ``2·size`` × ``size``, an assignment of a
    random ``size``² cost (:func:`lmclab.core.assignment.solve_assignment`, ``auto``) and the SVD of a random
    ``size/4``² one, each the best of ``repeats`` after one untimed run (the first product starts the threads)."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, 2 * size, generator=generator), torch.randn(2 * size, size, generator=generator)
    cost, small = torch.randn(size, size, generator=generator), torch.randn(size // 4, size // 4, generator=generator)
    a64, b64, small = a.double(), b.double(), small.double()
    flops = 2 * size * size * 2 * size
    return Rates(
        flops / _best(lambda: a @ b, repeats),
        _best(lambda: solve_assignment(cost, "auto"), repeats) * (1024 / size) ** LAP_EXPONENT,
        flops / _best(lambda: a64 @ b64, repeats),
        _best(lambda: torch.linalg.svd(small), repeats) * (256 / (size // 4)) ** 3,
    )


def _best(step: Callable[[], object], repeats: int) -> float:
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def estimate(spec: PermutationSpec, shapes: Mapping[str, torch.Size], rates: Rates | None = None) -> Estimate:
    """The cost of a sweep of weight matching over ``spec`` on entries of ``shapes`` (module docstring); ``rates``:
    :func:`calibrate`'s (measured when None)."""
    rates = calibrate() if rates is None else rates
    sizes = spec.group_sizes({k: torch.empty(s, device="meta") for k, s in shapes.items() if k in spec.axes})
    matched = [k for k in shapes if k not in spec.stats]
    flops32 = flops64 = 0.0  # the products; the matrix elements applied to θb's axes (float64)
    for g, places in spec.groups.items():
        for k, axis in places:
            if k in matched:
                flops32 += 2 * sizes[g] * shapes[k].numel()
                flops64 += _maps(spec, sizes, k, axis) * shapes[k].numel()
    for k in matched:  # the objective
        flops32 += 2 * shapes[k].numel()
        flops64 += _maps(spec, sizes, k, None) * shapes[k].numel()
    steps = sum(
        rates.svd_256 * (n / 256) ** 3
        if spec.kinds.get(g) in MATRIX_KINDS
        else rates.lap_1024 * (n / 1024) ** LAP_EXPONENT
        for g, n in sizes.items()
    )
    sliced = {k: slice_axis(spec, k, None, shapes[k]) is not None for k in matched}  # read a slice at a time
    whole = max((shapes[k].numel() for k in matched if not sliced[k]), default=0)
    widest = max(sizes.values(), default=0)
    memory = 4 * 4 * max(whole, SLICE if any(sliced.values()) else 0) + 16 * widest**2
    seconds = flops32 / rates.flops + flops64 / rates.flops64 + steps
    return Estimate(len(sizes), flops32 + flops64, seconds, float(memory))


def _maps(spec: PermutationSpec, sizes: Mapping[str, int], name: str, skip: int | None) -> int:
    """``Σ 2·m`` over the matrix elements (of ``m`` units) acting on the axes of ``name`` but ``skip``: the flops per
    entry of applying them."""
    return sum(
        2 * sizes[g]
        for axis, entry in enumerate(spec.axes[name])
        if axis != skip
        for g in entry_groups(entry)
        if spec.kinds.get(g) in MATRIX_KINDS
    )
