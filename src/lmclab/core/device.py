"""Device selection: ``auto`` means CUDA when present, else CPU; nothing assumes CUDA."""

from __future__ import annotations

import torch

CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name.startswith("cuda"):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device: {name!r} requested but CUDA is not available; use auto or cpu")
        return torch.device(name)
    raise ValueError(f"device: unknown device {name!r}; expected auto, cpu or cuda[:N]")
