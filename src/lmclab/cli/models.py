"""The commands on two or more model files: ``lmclab match`` finds the alignment of B to A (written with its
spec), ``lmclab merge`` writes λ·θa + (1−λ)·π(θb), ``lmclab merge-many`` merges N models by an n-model method
(``lmclab barrier``: :mod:`lmclab.cli.barrier`). Each is the API's function of the same name on files
(:mod:`lmclab.api`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from lmclab.api.streamed import streamed_refusal
from lmclab.cli.common import (
    DATA_ROOT,
    DEVICE,
    FACTORY,
    IN_CHANNELS,
    KWARGS,
    OPTION,
    OUT_MERGED,
    PARTIAL,
    PROGRESS,
    REPAIR,
    REPAIR_SAMPLES,
    SHAPE,
    STREAM,
    SYMMETRY,
    flagged,
    one_line,
)
from lmclab.cli.inputs import (
    aligned_pair,
    check_inputs,
    checked_options,
    load_data,
    load_models,
    load_pair,
    output_for,
    output_path,
    parse_samples,
    parse_shape,
    trace_inputs,
    traced_only,
    write_merged,
)
from lmclab.search import METHODS
from lmclab.search.many_methods import MANY_METHODS


@one_line
def match(  # size: a typer command's signature lists each of its options
    model_a: Path = typer.Argument(..., help="θa: state dict, Hugging Face folder or lmclab checkpoint"),
    model_b: Path = typer.Argument(..., help="θb, to be aligned to θa"),
    method: str = typer.Option("wm", help=f"one of {', '.join(METHODS)}"),
    symmetry: str = SYMMETRY,
    out: Path = typer.Option(..., help="where to write the alignment: the permutation with its spec (.pt)"),
    factory: str = FACTORY,
    kwargs: str = KWARGS,
    input_shape: str = SHAPE,
    data: str = typer.Option(None, help="training data (methods that read activations): a data set name or folder"),
    data_root: Path = DATA_ROOT,
    in_channels: int = IN_CHANNELS,
    option: list[str] = OPTION,
    seed: int = 0,
    device: str = DEVICE,
    partial: bool = PARTIAL,
    progress: bool = PROGRESS,
    stream: bool = STREAM,
) -> None:
    """Find the permutation of B's hidden units (or, --symmetry orthogonal, orthogonal maps of its streams) that
    aligns B to A; write it to --out."""
    from lmclab.api import align, l2_reduction
    from lmclab.search import check_method, needs_data

    options = checked_options(check_method, method, option)
    output_path(out, "--out")
    if needs_data(method) and data is None:
        raise ValueError(f"--data: method {method!r} reads training data; give a data set name or prepared folder")
    if _streams(model_a, model_b, stream, streamed_refusal(method, symmetry, data, factory)):
        keywords = dict(symmetry=symmetry, seed=seed, device=device, options=options, partial=partial)
        keywords |= dict(progress=progress)
        return _match_streamed(model_a, model_b, method, out, keywords)
    params_a, params_b, (net, spec, points) = load_pair(model_a, model_b, factory, kwargs)
    traced_only(partial, spec)
    shape = parse_shape(input_shape)
    train = load_data(data, "train", data_root, in_channels) if data is not None else None
    if train is not None and net is not None:
        check_inputs(net, params_a, train, data)
    traced = symmetry != "permutation"  # the kinds are the tracer's: a checkpoint's own spec has none
    inputs = trace_inputs(net, shape, train)
    with flagged():
        net, untied = _untied(net, inputs) if traced else (net, [])  # a tied head: matched untied
        res = align(
            params_a,
            _own_module(model_b, params_b, params_a),  # of other widths: its own module, traced beside A's
            method=method,
            symmetry=symmetry,
            spec=None if traced else spec,
            model=net,
            points=None if traced else points,
            data=train,
            example_inputs=inputs,
            seed=seed,
            device=device,
            options=options,
            partial=partial,
            progress=progress,
        )
    res.save(out)
    rotated = f" ({len(res.spec.kinds)} orthogonal)" if res.spec.kinds else ""
    note = "".join(f"; {' and '.join(names)} matched untied" for names in untied)
    narrower = f"; B narrower in {len(res.widths)} groups, embedded in A's widths" if res.widths else ""
    typer.echo(
        f"{method}: {len(res.perm)} groups{rotated}{note}, {res.stats.get('seconds', 0.0):.2f} s; "
        f"L2 reduction {l2_reduction(params_a, params_b, res):.2f} %{narrower}; wrote {out}"
    )


def _streams(model_a: Path, model_b: Path, stream: bool | None, refusal: str | None) -> bool:
    """Whether the pair takes the streamed path (:func:`lmclab.api.folders.streams`), refusals naming --stream."""
    from lmclab.api.folders import streams

    with flagged():
        return streams([model_a, model_b], stream, refusal)


def _match_streamed(model_a: Path, model_b: Path, method: str, out: Path, keywords: dict[str, Any]) -> None:
    """``lmclab match`` of two folders read one tensor at a time (:mod:`lmclab.api.streamed`)."""
    from lmclab.api import align, l2_reduction

    with flagged():
        res = align(model_a, model_b, method=method, stream=True, **keywords)
    res.save(out)
    read, sweeps = res.stats["bytes_read"] / 1e9, res.stats.get("sweeps", 0)
    expected = f", estimated {res.stats['estimated_seconds_per_sweep']:.1f}" if "estimated_gb" in res.stats else ""
    rotated = f" ({len(res.spec.kinds)} orthogonal)" if res.spec.kinds else ""
    typer.echo(
        f"{method}: {len(res.perm)} groups{rotated}, {res.stats.get('seconds', 0.0):.2f} s, {sweeps} sweeps{expected}, "
        f"streamed ({read:.2f} GB read); L2 reduction {l2_reduction(model_a, model_b, res, stream=True):.2f} %; "
        f"wrote {out}"
    )


def _own_module(path: Path, params: Any, reference: Any) -> Any:
    """``params``, or the module of the checkpoint at ``path`` when they have other shapes than ``reference``'s."""
    from lmclab.api.files import load_model_file
    from lmclab.api.widths import differ

    return load_model_file(path).model if differ([reference, params]) else params


def _untied(net, inputs) -> tuple[Any, list[tuple[str, ...]]]:
    """The module an orthogonal search traces: ``net`` with each tensor it shares off a norm's gain untied (a head
    tied to the embeddings, as :func:`lmclab.canonicalize` leaves it), and the names of the tensors untied."""
    from lmclab.core.canonical import shared_parameters
    from lmclab.trace.untie import untied_copy

    if net is None or inputs is None or not shared_parameters(net):
        return net, []
    twin = untied_copy(net, inputs)[0]
    return twin, [names for names in shared_parameters(net) if names not in shared_parameters(twin)]


@one_line
def merge(
    model_a: Path = typer.Argument(...),
    model_b: Path = typer.Argument(...),
    out: Path = OUT_MERGED,
    alignment: Path = typer.Option(None, help="an alignment from `lmclab match` (none: naive average)"),
    lam: float = typer.Option(0.5, help="λ of λ·θa + (1−λ)·π(θb)"),
    factory: str = FACTORY,
    kwargs: str = KWARGS,
    input_shape: str = SHAPE,
    partial: bool = PARTIAL,
    stream: bool = STREAM,
) -> None:
    """Write λ·θa + (1−λ)·π(θb) as a plain state dict (two HF folders: a folder, streamed shard by shard)."""
    from lmclab.api import load_alignment, merge_folders
    from lmclab.api import merge as merge_models
    from lmclab.core.merge import check_lam

    with flagged():
        check_lam(lam)
    output_for(out, model_a, "--out")
    if _streams(model_a, model_b, stream, "builds the module from the folder's config" if factory else None):
        found = load_alignment(alignment) if alignment is not None else None
        written = merge_folders(model_a, model_b, out, found, lam=lam)
        return typer.echo(f"wrote {out} (λ = {lam}; streamed, {written / 1e9:.2f} GB)")
    params_a, params_b, net = aligned_pair(model_a, model_b, alignment, factory, kwargs, input_shape, partial, False)
    merged = merge_models(params_a, params_b, lam=lam)
    write_merged(out, model_a, net, merged)
    typer.echo(f"wrote {out} ({len(merged)} tensors, λ = {lam})")


@one_line
def merge_many(  # size: a typer command's signature lists each of its options
    models: list[Path] = typer.Argument(
        ..., help="the models to merge (state dicts, Hugging Face folders or lmclab checkpoints), 2 or more"
    ),
    method: str = typer.Option("merge_many", help=f"one of {', '.join(MANY_METHODS)}"),
    symmetry: str = SYMMETRY,
    out: Path = OUT_MERGED,
    factory: str = FACTORY,
    kwargs: str = KWARGS,
    input_shape: str = SHAPE,
    data: str = typer.Option(None, help="training data (cca, zipit, --repair): a data set name or prepared folder"),
    data_root: Path = DATA_ROOT,
    in_channels: int = IN_CHANNELS,
    repair: str = REPAIR,
    repair_samples: str = REPAIR_SAMPLES,
    option: list[str] = OPTION,
    seed: int = 0,
    device: str = DEVICE,
    partial: bool = PARTIAL,
    progress: bool = PROGRESS,
) -> None:
    """Merge N models into one by an n-model method (MergeMany, star, sync: --symmetry orthogonal too); write the merged
    state dict to --out."""
    from lmclab.api import merge_many as merge_models
    from lmclab.api.many import ORTHOGONAL_MANY
    from lmclab.api.symmetries import check_symmetry
    from lmclab.core.repairs import check_repair, resolved_repair
    from lmclab.search import needs_data
    from lmclab.search.many_methods import check_many

    if len(models) < 2:
        raise ValueError(f"MODELS: expected at least 2 model files, got {len(models)}")
    options = checked_options(check_many, method, option)
    if options.get("partial_zip") is not None:  # a partial zip keeps one network per model (Section 4.3)
        raise ValueError("--option partial_zip: a partial zip is one network per model, no single model to write")
    output_for(out, models[0], "--out")
    with flagged():
        check_repair(repair)  # the name only: whether it fits the model is checked once the model is read
        check_symmetry(symmetry, method, ORTHOGONAL_MANY)
    if (needs_data(method) or repair != "none") and data is None:
        why = f"method {method!r} reads activations" if needs_data(method) else f"--repair {repair} measures statistics"
        raise ValueError(f"--data: {why}; give a data set name or prepared folder")
    params, (net, spec, points) = load_models(models, factory, kwargs)
    traced_only(partial, spec)
    shape = parse_shape(input_shape)
    if spec is None and trace_inputs(net, shape) is None and data is None:
        raise ValueError("--input-shape: needed with --factory to trace the spec (or give --data)")
    train = load_data(data, "train", data_root, in_channels) if data is not None else None
    if train is not None:
        check_inputs(net, params[0], train, data)
    with flagged():
        resolved_repair(repair, net)
    traced, inputs = symmetry != "permutation", trace_inputs(net, shape)  # kinds: the tracer's
    searched = _untied(net, inputs)[0] if traced else net  # a tied head: merged untied, written tied where equal
    res = merge_models(
        params,
        method=method,
        symmetry=symmetry,
        spec=None if traced else spec,
        model=searched,
        points=None if traced else points,
        example_inputs=inputs,
        data=train,
        repair=repair,
        repair_samples=parse_samples(repair_samples),
        options=options,
        seed=seed,
        device=device,
        partial=partial,
        progress=progress,
    )
    write_merged(out, models[0], net, res.merged)
    repaired = f", repaired ({res.repair})" if res.repair else ""
    rotated = f" ({sum(p.dim() == 2 for p in res.perms[0].values())} orthogonal)" if traced else ""
    seconds = res.stats.get("seconds", 0.0)
    typer.echo(f"{method}: {len(models)} models{rotated}, {seconds:.2f} s{repaired}; wrote {out}")
