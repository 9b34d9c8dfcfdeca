"""The public API: align two models, merge them, and measure the path between them — on any two
``nn.Module``s or state dicts, with a spec given or traced (the paper's Section 2).

>>> import torch, lmclab
>>> from torch import nn
>>> def mlp(seed):
...     torch.manual_seed(seed)
...     return nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> a, b = mlp(0), mlp(1)
>>> x = torch.randn(64, 4)
>>> res = lmclab.find_permutation(a, b, method="wm", example_inputs=x)      # data-free
>>> pi_b = lmclab.apply_permutation(res.spec, b.state_dict(), res.perm)
>>> bool(torch.allclose(b(x), torch.func.functional_call(b, pi_b, (x,)), atol=1e-6))  # same function
True
>>> lmclab.l2_reduction(a, b, res) > 0                                      # closer to θa
True
>>> curve = lmclab.interpolate(a, pi_b, data=(x, torch.randint(0, 3, (64,))), lams=5)
>>> sorted(curve.lams) == [0.0, 0.25, 0.5, 0.75, 1.0] and isinstance(curve.barrier(), float)
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.api.inputs import Data, Model, as_split, params_of, resolve
from lmclab.core import spec as spec_ops
from lmclab.core.merge import interpolate as lerp
from lmclab.core.metrics import l2_distance, reduction_rate
from lmclab.core.spec import Params, Permutation, PermutationSpec
from lmclab.search import METHODS, SearchProblem, run_search

DATA_METHODS = ("am", "ste", "ste_sinkhorn")  # they run the model forward on training data


@dataclass(frozen=True)
class Alignment:
    """The permutation ``perm`` (group → index tensor) found by ``method`` aligning θb to θa under
    ``spec``; ``stats`` holds what the search recorded (seconds, objective, curves)."""

    method: str
    spec: PermutationSpec
    perm: Permutation
    stats: dict[str, Any] = field(default_factory=dict)

    def apply(self, params_b: Model) -> Params:
        """π(θb) for a module or state dict ``params_b``."""
        return apply_permutation(self.spec, params_of(params_b, "params_b", torch.device("cpu")), self.perm)


def find_permutation(
    model_a: Model,
    model_b: Model,
    *,
    method: str = "wm",
    spec: PermutationSpec | None = None,
    example_inputs: Tensor | None = None,
    data: Data | None = None,
    model: nn.Module | None = None,
    points: Mapping[str, Sequence[str]] | None = None,
    test: Data | None = None,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
    **options: Any,
) -> Alignment:
    """The permutation π of θb's hidden units that aligns it to θa (``method``: ``wm``, ``am``,
    ``ste``, ``wm_sinkhorn``, ``ste_sinkhorn``, ``identity``; ``options`` are the method's own).

    ``spec`` defaults to the one traced from the model on ``example_inputs`` (or on ``data``'s first
    batch); ``model`` is the module of two state dicts; ``data`` (training batches) is needed by
    ``am``, ``ste`` and ``ste_sinkhorn``; ``points`` overrides the traced activation points of AM;
    with ``test`` data the iterative methods record the merged model's test loss and accuracy after
    each search epoch in ``stats["curve"]`` (the paper's Figure 6)."""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; expected one of {sorted(METHODS)}")
    if method in DATA_METHODS and data is None:
        raise ValueError(f"data: method {method!r} needs training data (a DataLoader or (input, target) batches)")
    problem = resolve(
        model_a,
        model_b,
        spec=spec,
        model=model,
        example_inputs=example_inputs,
        data=data,
        device=device,
        needs_forward=method in DATA_METHODS or test is not None,  # the learning curve runs the model too
    )
    params_a, params_b = (params_of(m, n, problem.device) for m, n in ((model_a, "model_a"), (model_b, "model_b")))
    problem.spec.check(params_a, "model_a")
    problem.spec.check(params_b, "model_b")
    search = SearchProblem(
        spec=problem.spec,
        params_a=params_a,
        params_b=params_b,
        model=problem.model,
        points=dict(points) if points is not None else problem.points,
        train=as_split(data).to(problem.device) if data is not None else None,
        test=as_split(test, "test").to(problem.device) if test is not None else None,
        device=problem.device,
        progress=progress,
    )
    result = run_search(method, search, seed=seed, options=options)
    return Alignment(method, problem.spec, {g: p.cpu() for g, p in result.perm.items()}, dict(result.stats))


def apply_permutation(spec: PermutationSpec, params: Mapping[str, Tensor], perm: Mapping[str, Tensor]) -> Params:
    """π(θ): every axis of every entry of ``params`` permuted by its group's index tensor."""
    spec.check(params, "params")
    spec_ops.check_permutation(perm, spec.group_sizes(params), spec.heads)
    return spec_ops.apply_permutation(spec, perm, params)


def merge(model_a: Model, model_b: Model, alignment: Alignment | None = None, *, lam: float = 0.5) -> Params:
    """``λ·θa + (1−λ)·π(θb)`` (π = I without ``alignment``): the merged model at λ (½: the midpoint)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    cpu = torch.device("cpu")
    params_a = params_of(model_a, "model_a", cpu)
    params_b = alignment.apply(model_b) if alignment is not None else params_of(model_b, "model_b", cpu)
    return lerp(params_a, params_b, lam)


def l2_reduction(model_a: Model, model_b: Model, alignment: Alignment) -> float:
    """How much closer π(θb) is to θa than θb: ``100·(1 − ‖θa − π(θb)‖ / ‖θa − θb‖)`` in percent,
    over the entries the spec matches (no running statistics)."""
    cpu = torch.device("cpu")
    params_a, params_b = params_of(model_a, "model_a", cpu), params_of(model_b, "model_b", cpu)
    before = l2_distance(alignment.spec, params_a, params_b)
    return reduction_rate(before, l2_distance(alignment.spec, params_a, alignment.apply(params_b)))
