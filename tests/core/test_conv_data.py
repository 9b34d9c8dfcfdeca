"""CIFAR-10 (torchvision on-disk format, real CIFAR10 class) and a local ImageNet ImageFolder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torchvision
from cifar_fixture import patch_class, write_cifar10
from PIL import Image

from lmclab.core.data import load_meta, load_split, prepare


@pytest.fixture
def cifar_root(tmp_path):
    lists = write_cifar10(tmp_path / "raw")
    old = patch_class(torchvision.datasets.CIFAR10, lists)
    yield tmp_path / "raw"
    for k, v in old.items():
        setattr(torchvision.datasets.CIFAR10, k, v)


def test_cifar10_fixture_is_read_by_torchvision(cifar_root, tmp_path):
    meta = prepare("cifar10", cifar_root, tmp_path / "prepared")
    assert meta["input_shape"] == [3, 32, 32] and meta["n_train"] == 100 and meta["n_test"] == 40
    train = load_split(tmp_path / "prepared", "train")
    assert train.x.shape == (100, 3, 32, 32)
    # the real class decodes CIFAR's row layout (3, 32, 32) per image: check one pixel
    raw = torchvision.datasets.CIFAR10(str(cifar_root), train=True)
    assert torch.equal(
        torch.load(tmp_path / "prepared" / "train.pt")["images"][0],
        torch.from_numpy(np.asarray(raw.data[0])).permute(2, 0, 1),
    )


def test_cifar10_changed_file_is_rejected(cifar_root, tmp_path):
    with open(cifar_root / "cifar-10-batches-py" / "data_batch_1", "ab") as f:
        f.write(b"x")  # md5 no longer matches; the loader then tries to download, which fails offline
    with pytest.raises(RuntimeError):
        prepare("cifar10", cifar_root, tmp_path / "prepared")


def _image_folder(root, classes=3, per_class=4):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"n0{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                size = (40 + 5 * i, 30 + 3 * c)  # non-square, various sizes: resized + cropped
                Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(folder / f"{i}.JPEG")
                if i == 0:
                    Image.fromarray(rng.integers(0, 255, size[::-1], dtype=np.uint8)).convert("L").save(
                        folder / "gray.JPEG"
                    )  # a grayscale file must come out RGB


def test_imagenet_image_folder(tmp_path):
    _image_folder(tmp_path / "imagenet")
    meta = prepare("imagenet", tmp_path / "imagenet", tmp_path / "prepared", image_size=32, max_train=9)
    assert meta["input_shape"] == [3, 32, 32] and meta["num_classes"] == 3
    assert meta["n_train"] == 9 and meta["n_test"] == 15
    test = torch.load(tmp_path / "prepared" / "test.pt")
    assert test["labels"].tolist() == sorted(test["labels"].tolist())  # ImageFolder order: class by class
    assert json.loads((tmp_path / "prepared" / "meta.json").read_text()) == load_meta(tmp_path / "prepared")


def test_imagenet_decodes_only_the_images_it_keeps(tmp_path, monkeypatch):
    """A subset of ImageNet's 1.28 M training images is chosen by label before any is decoded."""
    import lmclab.core.data as data

    _image_folder(tmp_path / "imagenet")  # 15 images per split
    opened, rgb = [], data._rgb
    monkeypatch.setattr(data, "_rgb", lambda path: opened.append(path) or rgb(path))
    prepare("imagenet", tmp_path / "imagenet", tmp_path / "prepared", image_size=32, max_train=6, max_test=3)
    assert sum("/train/" in p for p in opened) == 6 and sum("/val/" in p for p in opened) == 3


def test_imagenet_images_are_224_pixels_square_by_default(tmp_path):
    _image_folder(tmp_path / "imagenet", classes=2, per_class=1)  # the paper's ResNet50 input (Appendix D)
    meta = prepare("imagenet", tmp_path / "imagenet", tmp_path / "prepared")
    assert meta["input_shape"] == [3, 224, 224] and meta["n_train"] == meta["n_test"] == 4
    assert torch.load(tmp_path / "prepared" / "train.pt")["images"].shape == (4, 3, 224, 224)


def test_imagenet_missing_folder_is_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="^root: .* is not a directory"):
        prepare("imagenet", tmp_path / "nowhere", tmp_path / "prepared", image_size=32)
