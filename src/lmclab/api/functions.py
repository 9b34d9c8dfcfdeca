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
>>> res                                                                     # short: no tensors
Alignment(method='wm', 1 group {P_0: 8}, ...)
>>> pi_b = res.apply(b)                                                     # π(θb)
>>> bool(torch.allclose(b(x), torch.func.functional_call(b, pi_b, (x,)), atol=1e-6))  # same function
True
>>> lmclab.l2_reduction(a, b, res) > 0                                      # closer to θa
True
>>> wrong = {g: p.flip(0) for g, p in res.perm.items()}                   # another permutation
>>> moved = lmclab.apply_permutation(res.spec, wrong, b.state_dict())
>>> bool(torch.allclose(pi_b["1.weight"], moved["1.weight"]))           # other units moved
False
>>> curve = lmclab.curve(a, b, alignment=res, eval_data=(x, torch.randint(0, 3, (64,))), num_lambdas=5)
>>> curve.lambdas == [0.0, 0.25, 0.5, 0.75, 1.0] and isinstance(curve.barrier(), float)
True
>>> curve.to_frame().shape                                                 # one row per λ and split
(5, 4)
>>> midpoint = lmclab.merge(a, b, res, lam=0.5)                            # (θa + π(θb)) / 2
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.api.alignment import Alignment, aligned_pair
from lmclab.api.folders import streams
from lmclab.api.inputs import Data, Model, Opened, Problem, as_split, open_models, read_weights, resolve
from lmclab.api.streamed import align_streamed, l2_streamed, streamed_refusal
from lmclab.api.symmetries import check_symmetry, in_symmetry
from lmclab.api.widths import (
    check_same_architecture,
    check_same_numbers,
    differ,
    embedded,
    narrowed,
    shapes_refused,
    twin_trace,
)
from lmclab.core.batches import Batches, streamed
from lmclab.core.canonical import fold_gains
from lmclab.core.merge import check_lam, lerp_params
from lmclab.core.metrics import l2_distance, reduction_rate
from lmclab.core.objective import custom_loss
from lmclab.core.options import Options, keyed_errors
from lmclab.core.spec import Params, PermutationSpec
from lmclab.search import SearchProblem, check_method, needs_data, needs_model, run_search, streams_data
from lmclab.trace.untie import untied_copy


def checked_options(method: str, options: Mapping[str, Any] | None, check: Any = check_method) -> Options:
    """``options`` (a mapping or None) checked by ``method``'s options model before anything runs — the one
    validation of the call, the layers below trust the result; errors name ``method``, ``options`` or
    ``options['<name>']``."""
    if options is not None and not isinstance(options, Mapping | Options):  # Options: validated by the caller
        raise TypeError(f"options must be a mapping of option names to values, got {type(options).__name__}")
    with keyed_errors(lambda name: f"options[{name!r}]" if name in (options or {}) else name):
        return check(method, options)


def training_data(method: str, data: Data | None, device: torch.device) -> Batches | None:
    """``data`` as ``method`` reads it: a ``DataLoader`` (any re-iterable of batches) as it is when the
    method streams it in one pass (:func:`lmclab.search.streams_data`), anything else in memory on
    ``device`` (:func:`as_split`)."""
    if data is None:
        return None
    return data if streams_data(method) and streamed(data) else as_split(data).to(device)


def align(  # size: the signature lists each keyword of the API (the body is short)
    model_a: Model,
    model_b: Model,
    *,
    method: str = "wm",
    symmetry: str = "permutation",
    spec: PermutationSpec | None = None,
    example_inputs: Tensor | Sequence[Any] | Mapping[str, Any] | None = None,
    data: Data | None = None,
    model: nn.Module | None = None,
    factory: str | Callable[..., nn.Module] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    points: Mapping[str, Sequence[str]] | None = None,
    eval_data: Data | None = None,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
    options: Mapping[str, Any] | None = None,
    partial: bool = False,
    loss_fn: Callable[[Any, Tensor], Tensor] | None = None,
    stream: bool | None = None,
) -> Alignment:
    """The element π of the symmetry group of θb's hidden units that aligns it to θa (``method``: a name of
    :data:`lmclab.search.METHODS`; ``options``: its own options, e.g. ``{"max_iter": 5}``, checked
    against its options model before anything runs). ``symmetry="permutation"`` (the paper's) seeks a
    permutation of every group; ``"orthogonal"`` an orthogonal map of every group the tracer proves it may act
    on (:mod:`lmclab.trace.rotations`: a transformer's residual stream once its norm gains are folded into the
    layers that read them, :mod:`lmclab.core.canonical`; one that fixes the all-ones vector behind LayerNorm)
    and a permutation of the others, by weight or activation matching or learned matching (``method="wm"``,
    ``"am"``, ``"ste"``, ``"ste_sinkhorn"``; ``"identity"``, the naive baseline, is the group's identity); the
    alignment then acts on the canonical form of both models (gains folded), as :func:`merge` and :func:`curve` do.

    ``model_a`` and ``model_b`` are modules, state dicts or checkpoint paths (:func:`lmclab.api.inputs.open_models`:
    ``.pt``/``.pth``/``.safetensors`` state dicts, Hugging Face folders, lmclab checkpoints). ``spec`` defaults
    to an lmclab checkpoint's own, else the one traced from the module (``model``, ``factory(**kwargs)``, the
    checkpoint's, or ``model_a``) on ``example_inputs`` (a tensor, a sequence of positional inputs or a mapping
    of keyword inputs such as ``{"input_ids": …, "decoder_input_ids": …}``; or on ``data``'s first batch;
    ``partial=True`` leaves the channels the tracer cannot prove unpermuted instead of refusing the model,
    :func:`lmclab.trace.trace_spec`). A traced spec that leaves a residual stream or more than 10 % of the
    parameters unpermuted warns in one line (:class:`lmclab.trace.PinnedWarning`; ``spec.pinned`` says where and why).
    ``data`` (training batches) is needed by the methods that read activations (:func:`lmclab.search.needs_data`:
    ``am``, ``ste``, ``ste_sinkhorn``); a ``DataLoader`` is streamed batch by batch by the methods that
    pass over it once (``am``; the others hold it in memory: STE's epochs revisit it); ``points``
    overrides the traced activation points of AM; with ``eval_data`` the iterative methods record the
    merged model's loss and accuracy on ``eval_data`` after each search epoch in ``stats["curve"]`` (the
    paper's Figure 6).
    ``loss_fn(output, target)`` (a batch's mean loss) replaces the cross-entropy of the logits wherever
    the search evaluates a loss (STE's and Sinkhorn STE's midpoint objective, the test curve).
    ``stream``: two Hugging Face folders of safetensors read one tensor at a time instead of loaded (weight
    matching of billion-parameter checkpoints in bounded memory, :mod:`lmclab.api.streamed`); None streams such
    folders from :data:`lmclab.api.folders.STREAM_FROM` bytes when the method is weight matching or the identity
    and no module, data or loss is given."""
    options = checked_options(method, options)
    check_symmetry(symmetry, method)
    refusal = streamed_refusal(method, symmetry, data, model, factory, kwargs, points, eval_data, loss_fn)
    if streams([model_a, model_b], stream, refusal):
        keywords = dict(method=method, symmetry=symmetry, spec=spec, example_inputs=example_inputs, seed=seed)
        keywords |= dict(device=device)
        return align_streamed([model_a, model_b], **keywords, progress=progress, options=options, partial=partial)
    if needs_data(method) and data is None:
        raise ValueError(f"data: method {method!r} needs training data (a DataLoader or (input, target) batches)")
    opened = open_models([model_a, model_b], ["model_a", "model_b"], model=model, factory=factory, kwargs=kwargs)
    weights = read_weights(opened.models, ["model_a", "model_b"], torch.device("cpu"), same_shapes=False)
    twin = twin_of(opened, weights.params, spec) if differ(weights.params) else None  # θb of other widths: traced too
    problem = resolve(
        opened.models[0],
        spec=spec if spec is not None else opened.spec if symmetry == "permutation" and twin is None else None,
        model=opened.model,
        example_inputs=example_inputs,
        data=data,
        device=device,
        needs_forward=needs_model(method) or eval_data is not None,  # the learning curve runs the model too
        partial=partial,
        symmetry=symmetry,
    )
    problem = in_symmetry(problem, symmetry, type(problem.model or opened.model or opened.models[0]).__name__)
    widths = proved_widths(problem, twin, weights.params, symmetry) if twin is not None else {}
    search = _search_problem(method, problem, opened, weights, points, data, eval_data, progress, widths)
    with custom_loss(loss_fn):
        result = run_search(method, search, seed=seed, options=options)
    perm = {g: p.cpu() for g, p in result.perm.items()}
    return Alignment(method, problem.spec, perm, dict(result.stats), widths)


def twin_of(opened: Opened, params: Sequence[Params], spec: PermutationSpec | None) -> nn.Module:
    """θb's module, to trace beside θa's when the two differ in width (:mod:`lmclab.api.widths`); one line when it
    has none (a state dict alone: its first tensor of another shape named) or a spec is given."""
    if spec is not None:
        raise ValueError("spec: model_b differs from model_a in width; both are traced to prove which groups may")
    if opened.modules[1] is None:
        shapes_refused(*params, "model_b", "model_a")
    return opened.modules[1]


def proved_widths(problem: Problem, twin: nn.Module, params: Sequence[Params], symmetry: str) -> dict[str, int]:
    """θb's units where it is narrower than θa, once both traces show one architecture and those groups free."""
    traced_a, traced_b = problem.traced, twin_trace(twin, problem.inputs, symmetry)
    check_same_architecture(traced_a, traced_b)
    fixed = {**traced_b.fixed, **traced_a.fixed}
    widths = narrowed(traced_a._replace(spec=problem.spec, fixed=fixed), *params)
    check_same_numbers(traced_a, traced_b)
    return widths


def _search_problem(method, problem: Problem, opened: Opened, weights, points, data, eval_data, progress, widths):
    """The search of ``method`` on the pair as read (:func:`read_weights`: in one dtype), both checked against
    the spec (θb embedded in θa's widths where ``widths`` says it is narrower), on the problem's device."""
    params_a, params_b = ({k: v.to(problem.device) for k, v in p.items()} for p in weights.params)
    problem.spec.check(params_a, "model_a")
    params_a, params_b = (fold_gains(problem.spec, p, w) for p, w in ((params_a, "model_a"), (params_b, "model_b")))
    if widths:
        params_b = embedded(problem.spec, params_b, problem.spec.group_sizes(params_a), widths)
    problem.spec.check(params_b, "model_b")
    points = points if points is not None else opened.points if opened.spec is not None else problem.points
    return SearchProblem(
        spec=problem.spec,
        params_a=params_a,
        params_b=params_b,
        model=problem.model,
        points=dict(points) if points is not None else None,
        train=training_data(method, data, problem.device),
        test=as_split(eval_data, "eval_data").to(problem.device) if eval_data is not None else None,
        device=problem.device,
        progress=progress,
    )


def find_permutation(model_a: Model, model_b: Model, **keywords: Any) -> Alignment:
    """:func:`align` in the paper's symmetry group, the permutations of hidden units (every keyword of
    :func:`align` but ``symmetry``)."""
    if "symmetry" in keywords:
        raise TypeError("find_permutation() seeks permutations: call lmclab.align(..., symmetry=...) for other kinds")
    return align(model_a, model_b, **keywords)


_signature = inspect.signature(align)
find_permutation.__signature__ = _signature.replace(  # type: ignore[attr-defined]
    parameters=[p for name, p in _signature.parameters.items() if name != "symmetry"]
)


def canonicalize(model: nn.Module, example_inputs: Tensor | Sequence[Any] | Mapping[str, Any]) -> nn.Module:
    """A copy of ``model`` in the canonical form an orthogonal alignment acts on, with the same function: every
    norm gain the tracer can fold (``trace_spec(…, symmetry="orthogonal")``) folded into the layers that read
    it and set to 1 (:func:`lmclab.core.canonical.fold_gains`); a weight shared with a layer that takes a gain
    (a head tied to the embeddings) untied, the reader getting its own copy (a Hugging Face config then says
    ``tie_word_embeddings: false``); ``model`` itself is left as it is."""
    twin, spec = untied_copy(model, example_inputs)
    twin.load_state_dict(fold_gains(spec, twin.state_dict(), "model"))
    return twin


def merge(model_a: Model, model_b: Model, alignment: Alignment | None = None, *, lam: float = 0.5) -> Params:
    """``λ·θa + (1−λ)·π(θb)`` (π = I without ``alignment``): the merged model at λ (½: the midpoint), computed
    in the dtype :func:`lmclab.api.weights.compute_dtype` chooses for the pair and returned in θa's."""
    with keyed_errors(str):
        check_lam(lam)
    same = alignment is None or not alignment.widths  # θb of other widths: embedded by the alignment
    weights = read_weights([model_a, model_b], ["model_a", "model_b"], torch.device("cpu"), same_shapes=same)
    params_a, params_b = aligned_pair(alignment, *weights.params)
    return weights.own(0, lerp_params(params_a, params_b, lam))


def l2_reduction(model_a: Model, model_b: Model, alignment: Alignment, *, stream: bool | None = None) -> float:
    """How much closer π(θb) is to θa than θb: ``100·(1 − ‖θa − π(θb)‖ / ‖θa − θb‖)`` in percent,
    over the entries the spec matches (no running statistics), in the pair's compute dtype; θb of other widths
    (``alignment.widths``) embedded in θa's as it is before the alignment (its units first,
    :mod:`lmclab.core.widths`). ``stream``: as :func:`align`'s, one entry of each folder read at a time."""
    if streams([model_a, model_b], stream, "of other widths, aligned in memory" if alignment.widths else None):
        return l2_streamed([model_a, model_b], alignment)
    same = not alignment.widths
    models, names = [model_a, model_b], ["model_a", "model_b"]
    params_a, params_b = read_weights(models, names, torch.device("cpu"), same_shapes=same).params
    naive = dataclasses.replace(alignment, perm={g: torch.arange(len(p)) for g, p in alignment.perm.items()})
    before = l2_distance(alignment.spec, *((params_a, params_b) if same else aligned_pair(naive, params_a, params_b)))
    return reduction_rate(before, l2_distance(alignment.spec, *aligned_pair(alignment, params_a, params_b)))
