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


def describe_machine() -> dict[str, str | int]:
    """What a measurement ran on: CPU model, cores, GPU (or ``none``), PyTorch and its threads, Python, OS.

    Written beside results (``reports/detail/environment.json``) so a page quoting them can say where
    they were taken."""
    import os
    import platform
    from pathlib import Path

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.machine()}",
    }
