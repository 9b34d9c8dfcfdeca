"""Checkpoints carry ``{arch, config, seed, state_dict}`` so loading never needs params.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lmclab.archs import get_arch, make_config
from lmclab.core.atomic import atomic_path

FORMAT = "lmclab-checkpoint-1"


class Checkpoint(NamedTuple):
    arch: str
    config: Any  # the architecture's Config (lmclab.archs.base.ArchConfig)
    seed: int | None
    state_dict: dict[str, Tensor]


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupted or not an lmclab checkpoint."""


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file then rename: an interruption never leaves half a file."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    atomic_save(
        {
            "format": FORMAT,
            "arch": ckpt.arch,
            "config": ckpt.config.model_dump(),
            "seed": ckpt.seed,
            "state_dict": {k: v.detach().cpu() for k, v in ckpt.state_dict.items()},
        },
        path,
    )


def load_checkpoint(path: Path) -> Checkpoint:
    """Load and validate; every failure is a one-line :class:`CheckpointError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors on truncated or corrupted files
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or corrupted: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an lmclab checkpoint (expected format {FORMAT})")
    try:
        config = make_config(blob["arch"], **blob["config"])
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    state = blob["state_dict"]
    try:
        get_arch(blob["arch"]).permutation_spec(config).check(state, what=str(path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    return Checkpoint(blob["arch"], config, blob["seed"], state)


def check_same_architecture(a: Checkpoint, b: Checkpoint, path_a: Path, path_b: Path) -> None:
    """Two endpoints can only be matched and interpolated if their architectures agree."""
    if a.arch != b.arch or a.config != b.config:
        raise CheckpointError(
            f"{path_b}: architecture {b.arch} {b.config.model_dump()} "
            f"differs from {path_a}: {a.arch} {a.config.model_dump()}"
        )
