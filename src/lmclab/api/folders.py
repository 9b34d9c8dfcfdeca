"""Hugging Face folders of safetensors shards read without loading them: the streamed path for checkpoints too
large to hold twice (a billion-parameter language model in bfloat16 is 2.2 GB; the in-memory path holds each
model, a float32 copy of each and weight matching's cost terms).

The module is built from ``config.json`` on the ``meta`` device (shapes without values, no memory), which is all
the tracer needs to prove the spec; each model's tensors are a :class:`lmclab.core.shards.ShardedWeights`, read
one at a time in float32 (float64 when a checkpoint stores it) on the compute device. The names are the module's
state dict's: an entry the module ties to another (an output head tied to the embeddings, written once) is read
from the tensor written; every other entry must be in the shards under its own name, with the module's shape,
and every tensor of the shards must be an entry (a checkpoint in an older naming, which ``from_pretrained``
renames, is refused in one line: the in-memory path reads it).

Chosen by ``stream`` (:data:`STREAM_FROM` bytes of one checkpoint and up, when ``None``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from lmclab.core.canonical import shared_parameters
from lmclab.core.options import OptionError
from lmclab.core.shards import INDEX, SINGLE, ShardedWeights, shard_files

STREAM_FROM = 2**28  # bytes of one checkpoint's weights from which stream=None streams (256 MiB; module docstring)


class Streamed(NamedTuple):
    """Two or more folders opened lazily: each one's weights, and the module of the first built on ``meta``."""

    weights: list[ShardedWeights]
    model: nn.Module
    folders: list[Path]


def is_streamable(path: object) -> bool:
    """Whether ``path`` is a Hugging Face folder whose weights are safetensors (one file, or shards and index)."""
    if not isinstance(path, str | Path) or not Path(path).is_dir():
        return False
    folder = Path(path)
    return (folder / "config.json").is_file() and ((folder / SINGLE).is_file() or (folder / INDEX).is_file())


def folder_bytes(path: Path) -> int:
    """The bytes of the folder's safetensors weights (the files, headers included)."""
    return sum(file.stat().st_size for file in set(shard_files(Path(path)).values()))


def streams(models: Sequence[object], stream: bool | None, why_not: str | None = None) -> bool:
    """Whether ``models`` take the streamed path: ``stream`` as given (True: one line naming ``stream`` unless
    every model is a folder of safetensors and ``why_not`` is None), or when None, every model such a folder
    and the first of :data:`STREAM_FROM` bytes or more."""
    if stream is not None and not isinstance(stream, bool):
        raise TypeError(f"stream: expected True, False or None (by size), got {type(stream).__name__}")
    folders = all(is_streamable(m) for m in models)
    if stream and not folders:
        raise OptionError("{stream}: reads Hugging Face folders of safetensors weights; give the models as such")
    if stream and why_not is not None:
        raise OptionError(f"{{stream}}: {why_not}")
    if stream is None:
        return folders and why_not is None and folder_bytes(Path(models[0])) >= STREAM_FROM
    return stream


def meta_model(path: Path) -> nn.Module:
    """The module ``config.json`` describes (its class under ``architectures``), built on ``meta``, in eval mode."""
    from lmclab.api.hf import _model_class, _quiet, _transformers

    cls, transformers = _model_class(path), _transformers(path)
    try:
        with _quiet(transformers):
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            with torch.device("meta"):
                model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
    except Exception as exc:  # transformers raises many types: one line naming the folder
        raise ValueError(f"{path}: transformers cannot build its model ({' '.join(str(exc).split())[:200]})") from None
    return model.eval()


def folder_weights(path: Path, model: nn.Module, device: torch.device) -> ShardedWeights:
    """The folder's tensors under ``model``'s state dict names, read lazily (module docstring); one line naming
    the folder for a tensor missing, unexpected or of another shape."""
    path, files = Path(path), shard_files(Path(path))
    state, what = model.state_dict(), type(model).__name__
    aliases = {n: t[0] for t in shared_parameters(model) for n in t[1:] if n not in files and t[0] in files}
    missing = [k for k in state if k not in files and k not in aliases]
    unexpected = [k for k in files if k not in state]
    if missing or unexpected:
        found = f"no tensor {missing[0]!r}, an entry" if missing else f"tensor {unexpected[0]!r}, no entry"
        raise OptionError(
            f"{path}: {found} of the {what} it describes (an older naming? read in memory with {{stream}} off: "
            "from_pretrained renames it)"
        )
    weights = ShardedWeights({k: files[k] for k in state if k in files}, aliases=aliases, device=device)
    for key, value in state.items():
        if weights.shapes[key] != value.shape:
            shape = tuple(weights.shapes[key])
            raise OptionError(
                f"{path}: tensor {key!r} has shape {shape}, {what}'s is {tuple(value.shape)} (models of other "
                "widths are aligned in memory: {stream} off)"
            )
    wide = any(d == torch.float64 for d in weights.stored.values())
    return weights.with_dtype(torch.float64 if wide else torch.float32)


def open_folders(paths: Sequence[Path], names: Sequence[str], device: torch.device) -> Streamed:
    """Every folder opened lazily under the module of the first: one line naming the argument (``names``) whose
    folder describes another architecture or has other shapes."""
    model = meta_model(Path(paths[0]))
    first = _architecture(Path(paths[0]))
    weights = []
    for path, name in zip(paths, names, strict=True):
        if _architecture(Path(path)) != first:
            raise ValueError(f"{name}: {path} describes {_architecture(Path(path))}, {names[0]} {first}")
        try:
            weights.append(folder_weights(Path(path), model, device))
        except OptionError as exc:
            raise OptionError(f"{name}: {exc.template}") from None
    return Streamed(weights, model, [Path(p) for p in paths])


def _architecture(path: Path) -> str:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
    names = config.get("architectures") if isinstance(config, dict) else None
    return str((names or [config.get("model_type", "?") if isinstance(config, dict) else "?"])[0])
