"""What the ``lmclab`` command reads and writes, checked before any computation: model files and the
module they run in, data by name or folder, ``--option`` pairs, ``--input-shape``, and the files it writes
(atomically)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        shape = tuple(int(s) for s in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"--input-shape: expected positive integers separated by commas, got {text!r}")
    return shape


def parse_samples(text: str) -> int | None:
    """``--repair-samples``: a positive count, or ``all`` (None)."""
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--repair-samples: expected a positive integer or all, got {text!r}")
    return int(text)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``--option key=value`` pairs, values read as YAML (numbers, booleans, null, strings)."""
    from ruamel.yaml import YAML

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option: expected key=value, got {pair!r}")
        out[key] = YAML(typ="safe", pure=True).load(value)
    return out


def checked_options(check: Callable, method: str, pairs: list[str]) -> dict[str, Any]:
    """The ``--option`` pairs checked by ``method``'s options model; errors name ``--method``/``--option``."""
    from lmclab.core.options import keyed_errors

    options = parse_options(pairs)
    flags = {"method": "--method", "options": "--option"}
    with keyed_errors(lambda name: flags.get(name, f"--option {name}")):
        check(method, options)
    return options


def parse_kwargs(text: str) -> dict[str, Any]:
    """``--kwargs``: a JSON object of the factory's keyword arguments."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kwargs: not valid JSON ({exc}), got {text!r}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"--kwargs: expected a JSON object, got {text!r}")
    return parsed


def load_models(paths: list[Path], factory: str | None, kwargs: str, module: bool = True) -> tuple[list[Any], Any]:
    """Every model's parameters, the module they run in, and (checkpoints) their spec and points; without
    ``module``, plain state dicts need no ``--factory`` (the module is then None)."""
    from lmclab.api.files import build_factory, load_model_file
    from lmclab.api.weights import check_same_shapes, check_weights

    loaded = [load_model_file(p) for p in paths]
    params = [m.params for m in loaded]
    for path, model, found in zip(paths[1:], params[1:], loaded[1:], strict=True):  # of other widths: own modules
        own = found.model is not None and loaded[0].model is not None and factory is None
        check_same_shapes(params[0], model, str(path), str(paths[0]), shapes=not own)
    for path, model in zip(paths, params, strict=True):
        check_weights(model, str(path))  # NaN, ±inf: named by file and tensor, before any work
    if factory is not None:
        net = build_factory(factory, parse_kwargs(kwargs))
        check_same_shapes(net.state_dict(), params[0], str(paths[0]), f"the module of --factory {factory}")
        return params, (net, None, None)
    if loaded[0].model is None and module:
        raise ValueError(f"{paths[0]}: a plain state dict needs --factory module:callable to build its module")
    return params, (loaded[0].model, loaded[0].spec, loaded[0].points)


def load_pair(a: Path, b: Path, factory: str | None, kwargs: str, module: bool = True) -> tuple[Any, Any, Any]:
    """Both models' parameters, the module they run in, and (checkpoints) their spec and points."""
    (params_a, params_b), found = load_models([a, b], factory, kwargs, module)
    return params_a, params_b, found


def load_data(source: str, split: str, root: Path, in_channels: int | None) -> Any:
    """A data set by name (prepared into a private temporary folder) or a prepared folder's ``split``."""
    import tempfile

    from lmclab.core.data import LOADERS, Split, load_split, prepare
    from lmclab.core.options import OptionError

    if source in LOADERS:
        with tempfile.TemporaryDirectory(prefix="lmclab-") as tmp:  # mode 0700: this user only
            try:
                prepare(source, root, Path(tmp) / "prepared")
            except OptionError as err:  # not downloadable, or its package missing: named as --data
                raise ValueError(err.keyed(lambda name: "--data" if name == "name" else name)) from None
            data = load_split(Path(tmp) / "prepared", split)
    elif Path(source).is_dir():
        if (Path(source) / "meta.json").is_file() and not (Path(source) / f"{split}.pt").is_file():
            raise ValueError(f"--data {source}: a prepared folder without its {split} split ({split}.pt)")
        data = load_split(Path(source), split)
    else:
        raise ValueError(f"--data: expected one of {sorted(LOADERS)} or a prepared data folder, got {source!r}")
    if len(data) == 0:
        where = f"read from --data-root {root}" if source in LOADERS else "an empty prepared folder"
        raise ValueError(f"--data {source}: its {split} split has no samples ({where})")
    if in_channels is not None:
        if in_channels % data.x.shape[1]:
            raise ValueError(f"--in-channels: {in_channels} is not a multiple of the data's {data.x.shape[1]}")
        data = Split(data.x.repeat(1, in_channels // data.x.shape[1], 1, 1), data.y)
    return data


def traced_only(partial: bool, spec: Any) -> None:
    """``--partial`` refused where nothing is traced: lmclab checkpoints carry their architecture's spec."""
    if partial and spec is not None:
        raise ValueError(
            "--partial: the models are lmclab checkpoints, whose architecture gives the spec; nothing is traced"
        )


def aligned_pair(
    model_a: Path,
    model_b: Path,
    perm: Path | None,
    factory: str | None,
    kwargs: str,
    input_shape: str | None,
    partial: bool = False,
    module: bool = True,
) -> tuple[Any, Any, Any]:
    """θa, π(θb) (θb without ``perm``) and the module they run in (``partial``: as in ``lmclab trace``). An
    alignment saved with its spec (``lmclab match``) is applied as it is; one of the earlier, spec-less
    format permutes by the spec of the models (an lmclab checkpoint's, or traced on ``--input-shape``). Without
    ``module`` (``merge``), plain state dicts need no ``--factory`` when the alignment carries its spec."""
    from lmclab.api.alignment import Alignment, aligned_to, read_alignment
    from lmclab.core.canonical import fold_gains

    blob, stored = read_alignment(perm) if perm is not None else (None, None)
    need = module or (perm is not None and stored is None)
    params_a, params_b, (net, spec, _) = load_pair(model_a, model_b, factory, kwargs, need)
    traced_only(partial, spec)
    if perm is None:
        from lmclab.api.widths import differ

        if differ([params_a, params_b]):
            raise ValueError(f"{model_b}: other widths than {model_a}: merge it through an alignment (lmclab match)")
        return params_a, params_b, net
    spec = stored or spec
    if spec is None:
        from lmclab.trace import trace_spec

        inputs = trace_inputs(net, parse_shape(input_shape))
        if inputs is None:
            raise ValueError(f"--input-shape: {perm} carries no spec (an earlier lmclab): needed with --factory")
        spec = trace_spec(net, inputs, partial=partial)
    found = Alignment("", spec, blob["perm"], widths=blob.get("widths", {}))  # names the file and the model
    aligned = aligned_to(found, params_b, str(model_b), f"--alignment {perm}")
    return fold_gains(spec, params_a, str(model_a)), aligned, net  # θa in the form the alignment acts on


def check_inputs(net: Any, params: dict, data: Any, source: str) -> None:
    """``--data`` refused in one line unless ``net`` reads its inputs — a language model token ids, an image
    model images (a Hugging Face model's ``main_input_name``; a module whose first layer is an embedding reads
    token ids) — and runs on two of them with ``params``, before any work."""
    import torch
    from torch.func import functional_call

    from lmclab.api.weights import compute_dtype, in_dtype
    from lmclab.core.data import inputs_like
    from lmclab.search import kept_modes

    holds = "images" if data.x.is_floating_point() else "token ids"
    takes, shape = _reads(net), tuple(data.x.shape[1:])
    if takes is not None and takes != holds:
        raise ValueError(
            f"--data {source}: holds {holds} of shape {shape}; the model ({type(net).__name__}) reads {takes}"
        )
    table = _first_layer(net)
    if holds == "token ids" and isinstance(table, torch.nn.Embedding) and int(data.x.max()) >= table.num_embeddings:
        raise ValueError(
            f"--data {source}: token ids up to {int(data.x.max())}; the model's embedding has "
            f"{table.num_embeddings} entries (a text prepared with another tokenizer?)"
        )
    state = in_dtype(params, compute_dtype([params]))
    with kept_modes(net), torch.no_grad():
        net.eval()  # a BatchNorm in train mode would update the running statistics of ``params``
        try:
            out = functional_call(net, state, (inputs_like(data.x[:2], state),), tie_weights=False)
        except Exception as exc:  # whatever the model raises on inputs it cannot read: one line naming --data
            first = " ".join(str(exc).split())[:160]
            raise ValueError(f"--data {source}: the model cannot read its {holds} of shape {shape} ({first})") from None
    _warn_if_classes_differ(out, data, source)


def _warn_if_classes_differ(out: Any, data: Any, source: str) -> None:
    """One line on stderr when the model's outputs are not ``--data``'s classes (torchvision's 1000-way
    head measured on 10-class digits: its accuracy counts every other output as a wrong answer)."""
    import torch
    import typer

    if data.y.dtype.is_floating_point or not isinstance(out, torch.Tensor) or out.ndim != 2:
        return
    classes = int(data.y.max()) + 1
    if out.shape[1] != classes:
        typer.echo(
            f"warning: the model has {out.shape[1]} outputs and --data {source} has {classes} classes; accuracy "
            f"counts every other output as a wrong answer (a {classes}-way head: e.g. --kwargs "
            f"'{{\"num_classes\": {classes}}}')",
            err=True,
        )


def _reads(net: Any) -> str | None:
    """What ``net`` reads, ``token ids`` or ``images``, where it says (None: unknown)."""
    from torch import nn

    name = getattr(net, "main_input_name", None)
    if name in ("input_ids", "pixel_values"):
        return "token ids" if name == "input_ids" else "images"
    return "token ids" if isinstance(_first_layer(net), nn.Embedding) else None


def _first_layer(net: Any) -> Any:
    """The first module of ``net`` (in registration order) with parameters of its own."""
    return next((m for m in net.modules() if next(m.parameters(recurse=False), None) is not None), None)


def save_state(path: Path, state: dict) -> None:
    from lmclab.archs.checkpoint import atomic_save

    state = {k: v.contiguous() for k, v in state.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        from lmclab.core.atomic import atomic_path

        with atomic_path(path) as tmp:
            save_file(state, str(tmp))
    else:
        atomic_save(state, path)


def trace_inputs(net: Any, shape: tuple[int, ...] | None, data: Any = None) -> Any:
    """Inputs to trace ``net`` on: a transformers model's own (token ids of length ``shape``, or images of its
    config's size), else zeros of ``shape``, else the first two of ``data`` (a ``Split``; None without any)."""
    import torch

    from lmclab.api.hf import example_inputs

    found = example_inputs(net, shape)
    found = found if found is not None else (torch.zeros(2, *shape) if shape else None)
    return found if found is not None or data is None else data.x[:2]


def output_for(path: Path, model_a: Path, flag: str) -> Path:
    """``output_path``, or for models read from Hugging Face folders a new (or empty) folder to write one."""
    from lmclab.api.hf import is_hf_folder

    if not is_hf_folder(model_a):
        return output_path(path, flag)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise ValueError(f"{flag}: {path} exists; expected a new or empty folder for the merged Hugging Face model")
    if not path.parent.is_dir():
        raise ValueError(f"{flag}: the folder {path.parent} of {path} does not exist")
    return path


def write_merged(path: Path, model_a: Path, net: Any, state: dict) -> None:
    """The merged state dict as ``--out`` asks: a Hugging Face folder when A was one, else a file."""
    from lmclab.api.hf import is_hf_folder, save_hf_folder

    if is_hf_folder(model_a):
        save_hf_folder(net, state, path)
    else:
        save_state(path, state)


def output_path(path: Path, flag: str) -> Path:
    """``path`` if the command can write it — checked before any computation: its folder exists and it
    is not itself a folder; a one-line error naming ``flag`` otherwise."""
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a folder; expected a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{flag}: the folder {path.parent} of {path} does not exist")
    return path
