"""Check a whole run's parameters up front, so bad input fails in seconds, not after training.

Types, ranges, defaults and the known keys are the schema's (``lmclab.pipeline.schema``); this module turns
each schema error into one line naming the dotted key, its value and what it expects, and adds the
checks that span several keys: the seeds of pairs, triples and MergeMany are trained seeds, lists
hold no repeats, the data set is of the kind the architecture reads (token windows for a language
model, images for the others), the chosen architecture's config builds, search batches fit capped data,
the device exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from lmclab.api.symmetries import ORTHOGONAL_METHODS
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.bn_repair import has_batchnorm
from lmclab.core.device import resolve_device
from lmclab.core.options import OptionError, marked
from lmclab.pipeline.block import MISSING, Block
from lmclab.pipeline.keys import defaults, field_expected
from lmclab.pipeline.schema import Params, params_model
from lmclab.pipeline.validate_model import (
    check_architecture,
    check_circuits,
    check_data_kind,
    check_objective,
    check_text_source,
    input_shape_of,
)
from lmclab.search import METHODS
from lmclab.search.many_methods import MANY_METHODS, UNIVERSE
from lmclab.search.midpoint import n_heldout
from lmclab.train.training import TrainOptions


class ParamsError(ValueError):
    """Bad parameters: ``lines`` holds one line per bad key."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def check_params(tree: Mapping[str, Any]) -> Params:
    """The typed parameters of ``tree`` (params.yaml as read), or ``ParamsError``."""
    try:
        params = params_model().model_validate(tree)
    except ValidationError as err:
        raise ParamsError(schema_lines(err, tree)) from None
    lines: dict[str, str] = {}
    for check in (
        _repeats,
        _trained_seeds,
        _reused_alignments,
        _symmetry,
        _library_checks,
        check_data_kind,
        check_text_source,
        check_architecture,
        check_circuits,
        check_objective,
        _search_batches,
        _merge_many,
        _device,
        _launch,
    ):
        for key, line in check(params):
            lines.setdefault(key, line)  # one line per key
    if lines:
        raise ParamsError(list(lines.values()))
    return params


def schema_lines(err: ValidationError, tree: Mapping[str, Any]) -> list[str]:
    """One line per key that the schema refused."""
    lines: dict[str, str] = {}
    for error in err.errors():
        key, field, block = _locate(error["loc"])
        name, value = key or "params.yaml", _value_at(tree, key)
        if error["type"] == "extra_forbidden":
            line = f"{name}: unknown key (set to {value!r}); expected only the keys {', '.join(block.model_fields)}"
        elif field is None:
            line = f"{name}: expected {_expected(block)}, got {value!r}"
        elif value is MISSING:
            line = f"{name}: missing; expected {_expected(field)} (default: {_default(field)!r})"
        else:
            line = f"{name}: expected {_expected(field)}, got {value!r}"
        lines.setdefault(key, line)
    return list(lines.values())


def _locate(loc: tuple) -> tuple[str, Any, type[Block]]:
    """The dotted key an error location points into, its field (None for an unknown key or the
    whole file) and the block holding it; list indices and union branches belong to the key."""
    block: Any = params_model()
    parts: list[str] = []
    field = None
    for part in loc:
        if not (isinstance(part, str) and isinstance(block, type) and issubclass(block, Block)):
            break
        parts.append(part)
        field = block.model_fields.get(part)
        if field is None:
            break
        if isinstance(field.annotation, type) and issubclass(field.annotation, Block):
            block = field.annotation
        else:
            break
    return ".".join(parts), field, block


def _value_at(tree: Any, key: str) -> Any:
    for part in key.split(".") if key else []:
        if not isinstance(tree, Mapping) or part not in tree:
            return MISSING
        tree = tree[part]
    return tree


def _expected(field: Any) -> str:
    if isinstance(field, type):
        return f"a block with the keys {', '.join(field.model_fields)}"
    tp = field.annotation
    return f"a block with the keys {', '.join(tp.model_fields) or '(none)'}" if _is_block(tp) else field_expected(field)


def _default(field: Any) -> Any:
    return defaults(field.annotation) if _is_block(field.annotation) else field.default


def _is_block(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Block)


# ---- checks that span several keys: (key, line) for each problem ------------------------------

Problems = Iterator[tuple[str, str]]


def _repeats(p: Params) -> Problems:
    for key, values in (
        ("train.seeds", p.train.seeds),
        ("permute.pairs", p.permute.pairs),
        ("permute.methods", p.permute.methods),
        ("three.triples", p.three.triples),
        ("three.methods", p.three.methods),
        ("merge_many.seeds", p.merge_many.seeds),
        ("measure.gammas", p.measure.gammas),
        ("measure.taylor_splits", p.measure.taylor_splits),
    ):
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            yield key, f"{key}: expected no repeated entries, got {values!r} ({repeated[0]!r} more than once)"


def _trained_seeds(p: Params) -> Problems:
    """Pairs, triples and MergeMany's models: different seeds, each one of ``train.seeds``."""
    seeds = p.train.seeds
    for key, groups in (
        ("permute.pairs", p.permute.pairs),
        ("three.triples", p.three.triples),
        ("merge_many.seeds", [p.merge_many.seeds]),
    ):
        for group in groups:
            missing = [s for s in group if s not in seeds]
            if len(set(group)) != len(group):
                yield key, f"{key}: expected different seeds in each group, got {group!r}"
            elif missing:
                yield key, f"{key}: expected seeds of train.seeds {seeds}, got {group!r} ({missing} not trained)"


def _reused_alignments(p: Params) -> Problems:
    """connect takes θb's alignment from the permute stage: each triple's (θa, θb) is a pair of
    permute.pairs and each of three.methods one of permute.methods."""
    pairs = [list(pair) for pair in p.permute.pairs]
    for triple in p.three.triples:
        if list(triple[:2]) not in pairs:
            yield (
                "three.triples",
                f"three.triples: expected each triple's first two seeds (θa, θb) to be a pair of permute.pairs "
                f"{pairs} (connect reuses its alignment), got {list(triple)!r}",
            )
    missing = [m for m in p.three.methods if m not in p.permute.methods]
    if missing:
        yield (
            "three.methods",
            f"three.methods: expected methods of permute.methods {list(p.permute.methods)} "
            f"(connect reuses their θb → θa alignments), got {missing} not among them",
        )


def _symmetry(p: Params) -> Problems:
    """``permute.symmetry: orthogonal`` asks every method of ``permute.methods`` for orthogonal maps: each must
    seek them (:func:`lmclab.align`'s refusal, before any stage runs)."""
    refused = [m for m in p.permute.methods if m not in ORTHOGONAL_METHODS]
    if p.permute.symmetry == "orthogonal" and refused:
        yield (
            "permute.methods",
            f"permute.methods: {refused} seek permutations only; permute.symmetry orthogonal by {ORTHOGONAL_METHODS}",
        )


def _library_checks(p: Params) -> Problems:
    """The checks across options that the library's own options models make (their model validators: STE's
    ``select: holdout`` needs held-out data, warm-up within training, …), on each block that embeds one; the
    line names the block's keys."""
    training = {n: getattr(p.train, n) for n in TrainOptions.model_fields if n != "augment"}  # auto: the pipeline's
    blocks = [("train", TrainOptions, training)]
    for prefix, registry in (("permute", METHODS), ("merge_many", MANY_METHODS)):
        block = getattr(p, prefix)
        blocks += [(f"{prefix}.{m}", fn.options, getattr(block, m).model_dump()) for m, fn in registry.items()]
    for prefix, options, values in blocks:
        try:
            options.check(values)
        except OptionError as err:
            yield prefix, err.keyed(lambda name, prefix=prefix: f"{prefix}.{name}")


# what MAE pretraining (lmclab.train.mae_training) does not do: the setting each of these keys must keep
def _launch(p: Params) -> Problems:
    processes = p.train.nproc_per_node * p.train.nnodes
    if p.train.nnodes > 1 and p.train.rdzv_endpoint is None:
        yield (
            "train.rdzv_endpoint",
            (
                f"train.rdzv_endpoint: expected the host:port of torchrun's rendezvous "
                f"for train.nnodes = {p.train.nnodes}, got null"
            ),
        )
    if p.train.batch_size < 2 * processes:
        yield (
            "train.batch_size",
            (
                f"train.batch_size: expected at least 2 images for each of the {processes} "
                f"data-parallel processes, got {p.train.batch_size}"
            ),
        )


def _search_batches(p: Params) -> Problems:
    """A search drawing minibatches (an option marked ``per_step``) needs at most the training images it
    draws from, less the part an option marked ``held_out`` holds out; known up front only when
    ``data.max_train`` caps the split (else checked when the data is loaded)."""
    if p.data.max_train is None:
        return
    for method in dict.fromkeys([*p.permute.methods, *p.three.methods]):
        opts = getattr(p.permute, method)
        per_step, held_out = marked(type(opts), "per_step"), marked(type(opts), "held_out")
        if per_step is None:
            continue
        available = p.data.max_train - (n_heldout(p.data.max_train, getattr(opts, held_out)) if held_out else 0)
        if getattr(opts, per_step) > available:
            key = f"permute.{method}.{per_step}"
            got = getattr(opts, per_step)
            yield key, f"{key}: expected at most the {available} training samples available, got {got}"


def _merge_many(p: Params) -> Problems:
    """``measure.repair`` and ``merge_many.repair`` fit the network (``bn`` for BatchNorm nets, ``repair`` for
    nets without) and CCA Merge and ZipIt! get no attention heads (a general linear map would mix them); a
    traced network is checked when its stage builds it."""
    transforms = [m for m in p.merge_many.methods if m not in UNIVERSE]
    chosen = {f"{b}.repair": getattr(p, b).repair for b in ("measure", "merge_many")}
    chosen = {key: repair for key, repair in chosen.items() if repair in ("bn", "repair")}
    if (not chosen and not transforms) or p.model.arch == "traced":
        return
    try:
        options = getattr(p.model, p.model.arch).model_dump()
        config = make_config(p.model.arch, input_shape=input_shape_of(p), num_classes=10, **options)
        batchnorm = has_batchnorm(build_model(p.model.arch, config))
        heads = get_arch(p.model.arch).permutation_spec(config).heads
    except ValueError:  # the config itself: check_architecture names it
        return
    for key, repair in chosen.items():
        if (repair == "bn") != batchnorm:
            need = "bn (the network has BatchNorm)" if batchnorm else "repair or none (the network has no BatchNorm)"
            yield key, f"{key}: {repair!r} does not fit model.arch {p.model.arch!r}; expected {need}"
    if transforms and heads:
        line = (
            f"{transforms} merge through general linear maps, which would mix the attention heads of {p.model.arch!r}"
        )
        yield "merge_many.methods", f"merge_many.methods: {line}; expected methods among {list(UNIVERSE)}"


def _device(p: Params) -> Problems:
    try:
        resolve_device(p.device)
    except ValueError as exc:
        yield "device", str(exc)
