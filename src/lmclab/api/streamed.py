"""Align, measure and merge checkpoints streamed from their folders (:mod:`lmclab.api.folders`): weight matching
with every cost accumulated term by term from tensors read one at a time (:mod:`lmclab.search.wm_costs`: the
terms are recomputed rather than kept, beyond ``cost_cache_gb``), the L2 reduction one entry at a time, and the
merge written shard by shard (:func:`lmclab.core.shards.write_shards`) — nothing holds a model, so the memory is
the largest tensor's few copies, the terms kept and one shard of the merge, whatever the checkpoint's size."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmclab.api.alignment import Alignment
from lmclab.api.folders import Streamed, open_folders
from lmclab.api.inputs import Problem
from lmclab.api.symmetries import in_symmetry
from lmclab.core.atomic import atomic_folder
from lmclab.core.canonical import FoldedWeights, shared_parameters
from lmclab.core.device import resolve_device
from lmclab.core.merge import check_lam
from lmclab.core.metrics import reduction_rate
from lmclab.core.options import Options
from lmclab.core.shards import INDEX, ShardedWeights, stored_sizes, write_shards
from lmclab.core.spec import PermutationSpec, check_permutation, permute_entry
from lmclab.search import SearchProblem, run_search
from lmclab.search.wm_costs import entry_slices, slice_axis
from lmclab.search.wm_estimate import estimate

STREAMED_METHODS = ("identity", "wm")  # the data-free methods that read each tensor where it is needed
MAX_SHARD_BYTES = 2**28  # shards of the merged folder: at most 256 MiB each, one held in memory at a time


def streamed_refusal(method: str, symmetry: str, *given: Any) -> str | None:
    """Why :func:`lmclab.align` with these arguments takes the in-memory path (``given``: the arguments of a
    module, data or a loss, which the streamed path has no use for), or None."""
    if method not in STREAMED_METHODS:
        weights = ", ".join(STREAMED_METHODS)
        return f"{{method}} {method!r} is matched in memory; the streamed path matches weights ({weights})"
    if any(g is not None for g in given):
        return "builds the module from the folder's config.json and reads no data (no model, factory, data or loss)"
    return None


def meta_state(streamed: Streamed, k: int = 0) -> dict[str, Tensor]:
    """Model ``k``'s entries as ``meta`` tensors of their shapes: what a spec's checks read, with no values."""
    return {name: torch.empty(shape, device="meta") for name, shape in streamed.weights[k].shapes.items()}


def traced_spec(streamed: Streamed, example_inputs: Any, symmetry: str, partial: bool) -> PermutationSpec:
    """The spec the tracer proves on the ``meta`` module (the model's own token ids or images by default) in
    ``symmetry`` (:func:`lmclab.api.symmetries.in_symmetry`; orthogonal maps on the module with a weight it shares
    with a gain's reader untied, :func:`lmclab.trace.untie.untied_copy`, as the in-memory path traces it)."""
    from lmclab.api.hf import example_inputs as own_inputs
    from lmclab.trace import trace, warn_pinned
    from lmclab.trace.untie import untied_copy

    inputs = example_inputs if example_inputs is not None else own_inputs(streamed.model, None)
    if inputs is None:
        raise ValueError("example_inputs: needed to trace the permutation spec of this model")
    on_meta = {k: v.to("meta") for k, v in inputs.items()} if isinstance(inputs, Mapping) else inputs.to("meta")
    model = streamed.model
    if symmetry == "orthogonal" and shared_parameters(model):
        model, spec = untied_copy(model, on_meta)
    else:
        spec = trace(model, on_meta, partial=partial, symmetry=symmetry).spec
    warn_pinned(spec, meta_state(streamed))
    problem = Problem(spec, None, model, torch.device("meta"), None, None)
    return in_symmetry(problem, symmetry, type(model).__name__).spec


def folded(alignment_spec: PermutationSpec, streamed: Streamed) -> list[ShardedWeights]:
    """Both models' weights in the canonical form the spec acts on (its gains folded as read), or as they are."""
    if not alignment_spec.gains:
        return list(streamed.weights)
    return [FoldedWeights(w, alignment_spec, n) for w, n in zip(streamed.weights, ("model_a", "model_b"), strict=True)]


def align_streamed(
    paths: Sequence[Path],
    *,
    method: str,
    symmetry: str,
    spec: PermutationSpec | None,
    example_inputs: Any,
    seed: int,
    device: str,
    progress: bool,
    options: Options,
    partial: bool,
) -> Alignment:
    """:func:`lmclab.align` of two folders on the streamed path (module docstring), by ``method`` one of
    :data:`STREAMED_METHODS`, in ``symmetry`` (orthogonal maps on both models' canonical forms, folded as read)."""
    streamed = open_folders(paths, ["model_a", "model_b"], resolve_device(device))
    if spec is None:
        spec = traced_spec(streamed, example_inputs, symmetry, partial)
    else:  # a spec given: its kinds for ``symmetry``, as the in-memory path takes it
        spec = in_symmetry(Problem(spec, None, None, torch.device("meta"), None, None), symmetry, "the spec").spec
    spec.check(meta_state(streamed), "model_a")
    problem = SearchProblem(spec, *folded(spec, streamed), device=resolve_device(device), progress=progress)
    expected = estimate(spec, streamed.weights[0].shapes) if method == "wm" else None
    if expected is not None and progress:  # before a search of minutes: what it will cost
        print(expected.line(), file=sys.stderr, flush=True)
    result = run_search(method, problem, seed=seed, options=options)
    stats = dict(result.stats) | {"bytes_read": sum(w.bytes_read for w in streamed.weights)}
    if expected is not None:
        stats |= {"estimated_seconds_per_sweep": expected.seconds, "estimated_gb": expected.bytes / 1e9}
    return Alignment(method, spec, {g: p.cpu() for g, p in result.perm.items()}, stats)


def checked_alignment(alignment: Alignment, streamed: Streamed) -> None:
    """One line unless ``alignment`` was found for a model of the folders' entries and group sizes."""
    state = meta_state(streamed, 1)
    try:
        alignment.spec.check(state, "model_b")
        sizes = alignment.spec.group_sizes(state)
        for group, perm in alignment.perm.items():
            if group in sizes and sizes[group] != len(perm):
                raise ValueError(f"group {group!r} has {sizes[group]} units in model_b, {len(perm)} in the alignment")
        check_permutation(alignment.perm, sizes, alignment.spec.heads, alignment.spec.kinds)
    except ValueError as exc:
        detail = str(exc).removeprefix("model_b: ")
        raise ValueError(f"alignment: found for another model than model_b: {detail}") from None
    if alignment.widths:
        raise ValueError("alignment: of other widths, which the in-memory path applies (stream=False)")


def l2_streamed(paths: Sequence[Path], alignment: Alignment) -> float:
    """:func:`lmclab.l2_reduction` of two folders, one entry of each read at a time (float64 sums)."""
    streamed = open_folders(paths, ["model_a", "model_b"], torch.device("cpu"))
    checked_alignment(alignment, streamed)
    spec, (weights_a, weights_b) = alignment.spec, folded(alignment.spec, streamed)
    before = after = 0.0
    for name in spec.matched_names(weights_b):
        for a, b in entry_slices(spec, name, None, weights_a, weights_b):
            before += squared_distance(a, b)
            after += squared_distance(a, permute_entry(spec, alignment.perm, name, b))
    return reduction_rate(math.sqrt(before), math.sqrt(after))


def squared_distance(a: Tensor, b: Tensor, rows: int = 2**22) -> float:
    """``‖a − b‖²`` summed in float64 over slices of about ``rows`` entries (no float64 copy of a whole tensor)."""
    flat_a, flat_b, total = a.reshape(-1), b.reshape(-1), 0.0
    for start in range(0, flat_a.numel(), rows):
        part = flat_a[start : start + rows].double() - flat_b[start : start + rows].double()
        total += float(torch.dot(part, part))
    return total


def merge_folders(
    model_a: str | os.PathLike,
    model_b: str | os.PathLike,
    out: str | os.PathLike,
    alignment: Alignment | None = None,
    *,
    lam: float = 0.5,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> int:
    """``λ·θa + (1−λ)·π(θb)`` of two Hugging Face folders of safetensors (π = I without ``alignment``) written to
    the folder ``out`` (new, or empty) shard by shard — shards of at most ``max_shard_bytes`` with their index —,
    in θa's stored dtypes, beside θa's other files (config, tokenizer); ``from_pretrained`` loads it. One tensor of
    each model is read at a time (:mod:`lmclab.api.streamed`). A tied entry θa writes once is written once unless
    the merge gives its names different values (then apart, the config untied). Returns the bytes written."""
    check_lam(lam)
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise FileExistsError(f"out: {out} exists; expected a new folder or an empty one")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"out: the folder {out.parent} does not exist")
    streamed = open_folders([Path(model_a), Path(model_b)], ["model_a", "model_b"], torch.device("cpu"))
    if alignment is not None:
        checked_alignment(alignment, streamed)
    weights_a, weights_b = folded(alignment.spec, streamed) if alignment is not None else streamed.weights
    shapes = weights_a.shapes

    spec = (
        alignment.spec if alignment is not None else PermutationSpec({k: (None,) * len(v) for k, v in shapes.items()})
    )
    perm = alignment.perm if alignment is not None else {}

    def merged(name: str) -> Tensor:  # slice by slice along an axis no group acts on: no copy of a whole entry
        parts = []
        for a, b in entry_slices(spec, name, None, weights_a, weights_b):
            if not a.is_floating_point():  # an integer buffer: θa's, as the in-memory merge takes it
                return weights_a[name]
            b = permute_entry(spec, perm, name, b)
            parts.append(b.mul_(1 - lam).add_(a.mul_(lam)).to(weights_a.stored[name]))  # λ·a + (1 − λ)·b
        axis = slice_axis(spec, name, None, weights_a.shapes[name])
        return torch.cat(parts, axis) if axis is not None else parts[0]

    apart = [n for n in weights_a.aliases if not torch.equal(merged(n), merged(weights_a.aliases[n]))]
    names = [n for n in weights_a if n not in weights_a.aliases or n in apart]
    return _write_folder(streamed, out, {n: weights_a.shapes[n] for n in names}, merged, bool(apart), max_shard_bytes)


def _write_folder(streamed: Streamed, out: Path, shapes, produce, untied: bool, max_shard_bytes: int) -> int:
    """The folder ``out`` written beside it and renamed onto it (nothing half-written on failure)."""
    source = streamed.folders[0]
    with atomic_folder(out) as tmp:
        for file in source.iterdir():  # config, generation config, tokenizer: θa's own
            if file.is_file() and not file.name.endswith(".safetensors") and file.name != INDEX:
                shutil.copy2(file, tmp / file.name)
        if untied:
            config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
            (tmp / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}, indent=2) + "\n")
        sizes = stored_sizes(shapes, streamed.weights[0].stored)
        total = write_shards(tmp, sizes, produce, max_shard_bytes=max_shard_bytes)
    return total
