"""Hugging Face checkpoint folders: ``config.json`` beside ``model.safetensors``, ``pytorch_model.bin`` or a
sharded index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``), as ``save_pretrained``
writes them. Read with no network: the module is the class ``config.json`` names under ``architectures``
(``AutoModel`` when it names none), built from the config with random weights, then given the folder's
tensors; entries the files leave out because the model ties them (an output head tied to the input
embeddings, which ``save_pretrained`` writes once) come from the tensor they are tied to. Written back by
``save_pretrained`` into a folder made beside the target and renamed onto it, so that ``from_pretrained``
loads the result and a failure leaves nothing half-written. Needs ``transformers`` (``lmclab[models]``)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def is_hf_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _transformers(path: Path) -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{path}: a Hugging Face folder needs transformers (pip install 'lmclab[models]')") from None
    return transformers


def _module(path: Path) -> nn.Module:
    """The module ``config.json`` describes, with random weights."""
    transformers = _transformers(path)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path / 'config.json'}: expected a JSON object")
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        reason = " ".join(str(exc).split())[:160]
        raise ValueError(f"{path / 'config.json'}: transformers cannot read it ({reason})") from None
    names = raw.get("architectures") or []
    if names and not hasattr(transformers, names[0]):
        raise ValueError(f"{path / 'config.json'}: architecture {names[0]!r} is not a class of transformers")
    return getattr(transformers, names[0])(config) if names else transformers.AutoModel.from_config(config)


def _tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weight file or shards (one line naming the file for a bad one)."""
    from lmclab.api.files import _safetensors_load, _torch_load

    def read(file: Path) -> dict[str, Tensor]:
        if not file.is_file():
            raise FileNotFoundError(f"{file}: file not found (named by the folder's index)")
        blob = _safetensors_load(file) if file.suffix == ".safetensors" else _torch_load(file)
        if not (isinstance(blob, dict) and all(isinstance(v, Tensor) for v in blob.values())):
            raise ValueError(f"{file}: expected a mapping of names to tensors")
        return blob

    for name in WEIGHTS:
        if (path / name).is_file():
            return read(path / name)
    for name in INDEXES:
        if (path / name).is_file():
            try:
                shards = sorted(set(json.loads((path / name).read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path / name}: not a weight index with a 'weight_map' ({exc})") from None
            return {k: v for shard in shards for k, v in read(path / shard).items()}
    raise FileNotFoundError(f"{path}: no weights beside config.json (expected one of {', '.join(WEIGHTS + INDEXES)})")


def load_hf_folder(path: Path) -> tuple[dict[str, Tensor], nn.Module]:
    """The state dict of the folder's model (tied entries filled in) and that model, in eval mode."""
    from lmclab.core.spec import check_same_shapes

    path = Path(path)
    model, tensors = _module(path), _tensors(path)
    state = model.state_dict()
    storage = {}
    for key, value in state.items():
        storage.setdefault(value.data_ptr(), []).append(key)
    filled = dict(tensors)
    for keys in storage.values():  # a tied entry the file leaves out: the tensor it is tied to
        given = [k for k in keys if k in tensors]
        filled |= {k: tensors[given[0]] for k in keys if given and k not in tensors}
    check_same_shapes(state, filled, str(path), f"the {type(model).__name__} its config.json describes")
    model.load_state_dict(filled)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.eval()


def example_inputs(model: nn.Module, shape: tuple[int, ...] | None) -> Tensor | None:
    """Inputs to trace a transformers model on: token ids (``shape``: the sequence length, 8 by default) or
    images of its config's size; None for any other module."""
    config, name = getattr(model, "config", None), getattr(model, "main_input_name", None)
    if name == "input_ids":
        return torch.randint(0, config.vocab_size, (2, *(shape or (8,))), generator=torch.Generator().manual_seed(0))
    if name == "pixel_values":
        size = shape or (config.num_channels, config.image_size, config.image_size)
        return torch.zeros(2, *size)
    return None


def save_hf_folder(model: nn.Module, state: dict[str, Tensor], out: Path) -> None:
    """``state`` in ``model`` written by ``save_pretrained`` to the folder ``out`` (new, or empty)."""
    out = Path(out)
    twin = copy.deepcopy(model)
    twin.load_state_dict(state)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        twin.save_pretrained(str(tmp))
        if out.is_dir():
            out.rmdir()  # empty: checked before any work
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
