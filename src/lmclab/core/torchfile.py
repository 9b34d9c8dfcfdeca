"""Reading a file that ``torch.save`` wrote, tensors only (``weights_only``), with one-line errors that
name the file: a foreign file, one holding pickled objects, and a truncated or corrupted one each say so.
Used by the readers of model files and of Hugging Face checkpoint folders."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch


def torch_load(path: Path) -> Any:
    """``torch.load(path)`` on the CPU, tensors only; a ``ValueError`` of one line naming ``path`` otherwise."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # a file torch reads, holding objects other than tensors, or a foreign one
        if not torch_saved(path):
            raise ValueError(f"{path}: not a PyTorch file (neither torch.save's zip archive nor a pickle)") from None
        raise ValueError(
            f"{path}: holds pickled objects, not only tensors (save model.state_dict(), not the module)"
        ) from None
    except Exception as exc:  # zip or pickle errors: a truncated, corrupted or foreign file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a readable PyTorch file (truncated or corrupted? {first[:120]})") from None


def torch_saved(path: Path) -> bool:
    """Does ``path`` start as ``torch.save`` writes: a zip archive, or (the legacy format) a pickle?"""
    with path.open("rb") as f:
        head = f.read(4)
    return head == b"PK\x03\x04" or head[:1] == b"\x80"
