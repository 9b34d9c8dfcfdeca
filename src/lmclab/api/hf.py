"""Hugging Face checkpoint folders: ``config.json`` beside ``model.safetensors``, ``pytorch_model.bin`` or a
sharded index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``), as ``save_pretrained``
writes them. Read with no network by the class ``config.json`` names under ``architectures``
(``AutoModel`` when it names none) and transformers' own ``from_pretrained(local_files_only=True)``, which
renames the older key names a checkpoint may use and fills in the entries a model ties (an output head
tied to the input embeddings, written once) — after checks of lmclab's own, so that a bad config, a
missing, truncated or mis-shaped weight file, or a tensor the folder lacks is one line naming the file.
Written back by ``save_pretrained`` into a folder made beside the target and renamed onto it, so that
``from_pretrained`` loads the result and a failure leaves nothing half-written. Needs ``transformers``
(``lmclab[models]``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.core.atomic import atomic_folder
from lmclab.core.canonical import shared_parameters, untie, untie_config

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


@contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' own reports and progress bars off (its errors become one line of ours)."""
    logging = transformers.utils.logging
    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _model_class(path: Path) -> Any:
    """The class ``config.json`` names under ``architectures`` (``AutoModel`` when it names none)."""
    transformers = _transformers(path)
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path / 'config.json'}: expected a JSON object")
    names = raw.get("architectures") or []
    if names and not hasattr(transformers, names[0]):
        raise ValueError(f"{path / 'config.json'}: architecture {names[0]!r} is not a class of transformers")
    return getattr(transformers, names[0]) if names else transformers.AutoModel


def _check_weights(path: Path) -> None:
    """One line naming the file unless the folder has readable weights: a safetensors header, a torch file,
    every shard its index names."""
    from safetensors import SafetensorError, safe_open

    from lmclab.core.torchfile import torch_load

    def check(file: Path) -> None:
        if not file.is_file():
            raise FileNotFoundError(f"{file}: file not found (named by the folder's index)")
        if file.suffix != ".safetensors":
            torch_load(file)
            return
        try:
            with safe_open(str(file), "pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(
                f"{file}: not a readable safetensors file (truncated or corrupted? {first[:120]})"
            ) from None

    for name in WEIGHTS:
        if (path / name).is_file():
            return check(path / name)
    for name in INDEXES:
        if (path / name).is_file():
            try:
                shards = sorted(set(json.loads((path / name).read_text(encoding="utf-8"))["weight_map"].values()))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path / name}: not a weight index with a 'weight_map' ({exc})") from None
            for shard in shards:
                check(path / shard)
            return None
    raise FileNotFoundError(f"{path}: no weights beside config.json (expected one of {', '.join(WEIGHTS + INDEXES)})")


def load_hf_folder(path: Path) -> tuple[dict[str, Tensor], nn.Module]:
    """The state dict of the folder's model and that model, in eval mode: read by transformers'
    ``from_pretrained`` with no network (which renames a checkpoint's older key names and fills in tied
    entries written once), after the checks above; every tensor of the model must come from the folder. The
    state dict's tensors are the module's own (:func:`_entries`): leave them unchanged, as lmclab does."""
    path = Path(path)
    cls = _model_class(path)
    _check_weights(path)
    load = dict(local_files_only=True, output_loading_info=True)
    try:
        with _quiet(_transformers(path)):
            model, info = cls.from_pretrained(str(path), **load)
    except Exception as exc:  # transformers raises many types: one line naming the folder
        if "ignore_mismatched_sizes" not in str(exc):
            raise ValueError(f"{path}: transformers cannot load it ({' '.join(str(exc).split())[:200]})") from None
        with _quiet(_transformers(path)):  # again, to name the tensor
            model, info = cls.from_pretrained(str(path), ignore_mismatched_sizes=True, **load)
    if info.get("mismatched_keys"):
        key, *shapes = sorted(info["mismatched_keys"])[0]
        raise ValueError(f"{path}: tensor {key!r} has shape {tuple(shapes[0])}, {cls.__name__}'s is {tuple(shapes[1])}")
    if info.get("missing_keys"):
        raise ValueError(
            f"{path}: no weights for {sorted(info['missing_keys'])[:3]} of the {cls.__name__} it describes"
        )
    return _entries(model.state_dict()), model.eval()


def _entries(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every entry its own tensor: the module's own storage (no copy: a folder is read once into
    memory), except a weight the module ties under several names, whose later names get copies (each entry of a
    state dict is matched, moved and merged on its own)."""
    seen: set[int] = set()
    out = {}
    for key, value in state.items():
        address = value.untyped_storage().data_ptr()
        out[key] = value.detach().clone() if address in seen else value.detach()
        seen.add(address)
    return out


def example_inputs(model: nn.Module, shape: tuple[int, ...] | None) -> Tensor | dict[str, Tensor] | None:
    """Inputs to trace a transformers model on: token ids (``shape``: the sequence length, 8 by default; drawn
    by a generator of seed 0, the same ids in every run and version, the global generator untouched) —
    with an encoder–decoder's ``decoder_input_ids`` beside them, as its ``_shift_right`` builds them from
    ``decoder_start_token_id`` — or images of its config's size; None for any other module."""
    config, name = getattr(model, "config", None), getattr(model, "main_input_name", None)
    if name == "input_ids":
        ids = torch.randint(0, config.vocab_size, (2, *(shape or (8,))), generator=torch.Generator().manual_seed(0))
        if not getattr(config, "is_encoder_decoder", False):
            return ids
        start = getattr(config, "decoder_start_token_id", None)
        if start is None:  # transformers 5 keeps it in the generation config
            start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
        if start is None:
            raise ValueError(
                f"{type(model).__name__}: an encoder–decoder reads decoder_input_ids besides input_ids, and its "
                "config sets no decoder_start_token_id to build them from (set it in config.json)"
            )
        return {"input_ids": ids, "decoder_input_ids": torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], 1)}
    if name == "pixel_values":
        size = shape or (config.num_channels, config.image_size, config.image_size)
        return torch.zeros(2, *size)
    return None


def save_hf_folder(model: nn.Module, state: dict[str, Tensor], out: Path) -> None:
    """``state`` in ``model`` written by ``save_pretrained`` to the folder ``out`` (new, or empty). A weight
    ``model`` ties (a head tied to the embeddings) whose names hold different values in ``state`` (a merge of
    models aligned in their untied form) is written untied, with ``tie_word_embeddings: false``; loading it
    into the tied module would keep one of the two."""
    out = Path(out)
    twin = copy.deepcopy(model)
    apart = [
        names
        for names in shared_parameters(twin)
        if not all(torch.equal(state[n], state[names[0]]) for n in names[1:] if n in state and names[0] in state)
    ]
    for names in apart:
        untie(twin, names)
    if apart:
        untie_config(twin)
    twin.load_state_dict(state)
    with atomic_folder(out) as tmp, _quiet(_transformers(out)):
        twin.save_pretrained(str(tmp))
