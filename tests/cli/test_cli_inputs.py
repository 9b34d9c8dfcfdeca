"""What the command reads, called directly: a data set by name prepared in a private folder and read
back, its channels repeated for a colour model, the refusals named by the command's options, and the
inputs a model is traced on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.cli.inputs import load_data, parse_options, trace_inputs, traced_only
from lmclab.core.data import load_split, prepare


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("digits")
    prepare("mnist5k", folder / "raw", folder / "prepared")
    return folder


def test_a_data_set_by_name_is_the_prepared_split_and_leaves_no_folder(digits, tmp_path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the private folder is made here, then removed
    test = load_data("mnist5k", "test", digits / "raw", None)
    expected = load_split(digits / "prepared", "test")
    assert torch.equal(test.x, expected.x) and torch.equal(test.y, expected.y)
    assert not any(tmp_path.iterdir())
    train = load_data(str(digits / "prepared"), "train", digits / "raw", None)
    assert len(train) == 4000 and torch.equal(train.x, load_split(digits / "prepared", "train").x)


def test_grey_digits_are_repeated_into_every_channel_a_colour_model_reads(digits) -> None:
    grey = load_split(digits / "prepared", "test")
    rgb = load_data(str(digits / "prepared"), "test", digits / "raw", 3)
    assert rgb.x.shape == (1000, 3, 28, 28) and torch.equal(rgb.y, grey.y)
    assert all(torch.equal(rgb.x[:, c], grey.x[:, 0]) for c in range(3))


def test_a_data_set_that_cannot_be_prepared_is_named_as_the_data_option(tmp_path, monkeypatch) -> None:
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens there: no network
    with pytest.raises(ValueError, match=r"^--data: MNIST is not under .* could not be downloaded") as err:
        load_data("mnist", "test", tmp_path / "raw", None)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^--data: expected one of \[.*'mnist5k'.*\] or a prepared data folder"):
        load_data(str(tmp_path / "nowhere"), "test", tmp_path, None)


def test_options_are_yaml_values_and_a_pair_without_a_key_is_refused() -> None:
    assert parse_options(["lr=1e-3", "steps=10", "name=x", "flag=true", "none=null"]) == {
        "lr": 0.001,
        "steps": 10,
        "name": "x",
        "flag": True,
        "none": None,
    }
    for bad in ("lr", "=3"):
        with pytest.raises(ValueError, match=rf"^--option: expected key=value, got '{bad}'$"):
            parse_options([bad])


def test_a_plain_module_is_traced_on_a_batch_of_two_zeros_of_the_given_shape() -> None:
    x = trace_inputs(nn.Linear(5, 2), (5,))
    assert torch.equal(x, torch.zeros(2, 5))
    assert trace_inputs(nn.Linear(5, 2), None) is None


def test_partial_is_refused_for_lmclab_checkpoints_only() -> None:
    traced_only(True, None)  # traced: --partial applies
    traced_only(False, object())
    with pytest.raises(ValueError, match=r"^--partial: the models are lmclab checkpoints, whose architecture"):
        traced_only(True, object())
