"""Models and permutations on disk, for the ``lmclab`` command: a plain state dict (``.pt``/``.pth``,
also one nested under ``"state_dict"`` or ``"model"``, or ``.safetensors``), a Hugging Face checkpoint
folder (:mod:`lmclab.api.hf`: its config builds the module) or an lmclab checkpoint (which carries its
architecture, so its spec and activation points come from the registry), and the permutation file
``lmclab match`` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from torch import Tensor, nn

from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import FORMAT, load_checkpoint
from lmclab.archs.traced import load_factory
from lmclab.core.spec import PermutationSpec
from lmclab.core.torchfile import torch_load


class Loaded(NamedTuple):
    """A model file: its parameters, and for an lmclab checkpoint its module, spec and points."""

    params: dict[str, Tensor]
    model: nn.Module | None = None
    spec: PermutationSpec | None = None
    points: dict[str, list[str]] | None = None


def _safetensors_load(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupted? {first[:120]})") from None


def load_model_file(path: Path) -> Loaded:
    """The model stored at ``path`` (module docstring); one-line errors naming the file."""
    path = Path(path)
    if path.is_dir():
        from lmclab.api.hf import is_hf_folder, load_hf_folder

        if not is_hf_folder(path):
            raise FileNotFoundError(f"{path}: a folder without config.json (not a Hugging Face checkpoint folder)")
        params, model = load_hf_folder(path)
        return Loaded(params, model)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    if path.suffix == ".safetensors":
        return Loaded(_safetensors_load(path))
    blob = torch_load(path)
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        ckpt = load_checkpoint(path)
        arch = get_arch(ckpt.arch)
        return Loaded(
            ckpt.state_dict,
            build_model(ckpt.arch, ckpt.config),
            arch.permutation_spec(ckpt.config),
            arch.activation_points(ckpt.config),
        )
    for key in ("state_dict", "model"):
        if isinstance(blob, dict) and isinstance(blob.get(key), dict):
            blob = blob[key]
    if not (isinstance(blob, dict) and blob and all(isinstance(v, Tensor) for v in blob.values())):
        raise ValueError(f"{path}: expected a state dict (a mapping of names to tensors)")
    return Loaded(dict(blob))


def build_factory(factory: str, kwargs: dict[str, Any]) -> nn.Module:
    """``module:callable(**kwargs)`` (a module path or a ``.py`` file before the colon)."""
    try:
        net = load_factory(factory)(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"factory: {factory}(**{kwargs}) failed: {exc}") from None
    if not isinstance(net, nn.Module):
        raise ValueError(f"factory: {factory!r} returned {type(net).__name__}, not an nn.Module")
    return net
