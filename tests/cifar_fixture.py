"""A tiny CIFAR-10 in torchvision's on-disk format (``cifar-10-batches-py``), read by the real
``torchvision.datasets.CIFAR10``. torchvision checks the md5 of every file against class
attributes; :func:`md5_lists` gives the lists that make it accept these small files."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np

TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _batch(rng: np.random.Generator, n: int) -> dict:
    labels = np.arange(n) % 10
    # class-dependent mean colour so a network can learn something
    base = (labels[:, None] * 23 % 256).astype(np.float64)
    data = np.clip(base + rng.normal(0, 40, (n, 3072)), 0, 255).astype(np.uint8)  # (n, 3·32·32)
    return {
        "batch_label": "fixture",
        "labels": labels.tolist(),
        "data": data,
        "filenames": [f"img{i}.png" for i in range(n)],
    }


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 40, seed: int = 0) -> dict:
    """Write the fixture under ``root/cifar-10-batches-py``; returns :func:`md5_lists`."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in TRAIN_FILES:
        (folder / name).write_bytes(pickle.dumps(_batch(rng, per_batch)))
    (folder / "test_batch").write_bytes(pickle.dumps(_batch(rng, n_test)))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": LABEL_NAMES}))
    return md5_lists(root)


def md5_lists(root: Path) -> dict:
    folder = Path(root) / "cifar-10-batches-py"
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    return {
        "train_list": [[n, md5[n]] for n in TRAIN_FILES],
        "test_list": [["test_batch", md5["test_batch"]]],
        "meta_md5": md5["batches.meta"],
    }


def patch_class(cls: type, lists: dict) -> dict:
    """Set ``CIFAR10``'s md5 lists to the fixture's; returns the old values for restoring."""
    old = {"train_list": cls.train_list, "test_list": cls.test_list, "meta": cls.meta}
    cls.train_list, cls.test_list = lists["train_list"], lists["test_list"]
    cls.meta = {**cls.meta, "md5": lists["meta_md5"]}
    return old


SITECUSTOMIZE = '''"""Test-only: make torchvision's CIFAR10 accept the fixture files (md5 lists from a JSON file
named by LMCLAB_CIFAR_MD5), patched lazily when torchvision.datasets.cifar is first imported."""
import importlib.abc, importlib.util, json, os, sys

class _PatchCifar(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar" or not os.environ.get("LMCLAB_CIFAR_MD5"):
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            lists = json.load(open(os.environ["LMCLAB_CIFAR_MD5"]))
            module.CIFAR10.train_list, module.CIFAR10.test_list = lists["train_list"], lists["test_list"]
            module.CIFAR10.meta = {**module.CIFAR10.meta, "md5": lists["meta_md5"]}
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _PatchCifar())
'''


def write_sitecustomize(folder: Path, lists: dict) -> Path:
    """A ``sitecustomize.py`` for subprocesses (put ``folder`` on PYTHONPATH and point
    LMCLAB_CIFAR_MD5 at the returned JSON file)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = folder / "cifar_md5.json"
    path.write_text(json.dumps(lists))
    return path
