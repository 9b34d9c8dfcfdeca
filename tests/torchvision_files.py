"""Write small data sets in torchvision's on-disk formats, for loading by the real classes."""

from __future__ import annotations

import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx_dataset(root: Path, folder: str, n_train: int, n_test: int, seed: int = 0) -> None:
    """``root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (MNIST, FashionMNIST)."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, n) + labels.tobytes())


def write_cifar10(root: Path, per_batch: int, n_test: int, seed: int = 0) -> dict[str, str]:
    """``root/cifar-10-batches-py`` with 5 training batches, a test batch and the meta file.
    Returns {filename: md5}: torchvision verifies these sums, so tests point it at them."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        blob = {
            "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            "labels": [int(v) for v in np.arange(n) % 10],
        }
        (base / name).write_bytes(pickle.dumps(blob))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in base.iterdir()}


def trust_cifar10_files(monkeypatch, md5: dict[str, str]) -> None:
    """Make torchvision's CIFAR10 integrity check expect the fixture's checksums."""
    from torchvision.datasets import CIFAR10

    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5["batches.meta"]})
