"""Each refusal of the public API names the argument it is about (model_a, model_b, repair_data,
split) and what it expected; the file readers word a failed read from the exception, cut to 120
characters; a Hugging Face folder without transformers, or with a config that is no object, says so."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from torch import nn

import lmclab
from lmclab.api.hf import _model_class
from lmclab.core.torchfile import torch_load


def _bn_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


DATA = (torch.randn(16, 6), torch.randint(0, 3, (16,)))


@pytest.mark.parametrize("which", ["model_a", "model_b"])
def test_a_model_that_is_neither_module_state_dict_nor_folder_is_named(which) -> None:
    models = {"model_a": _bn_net(0), "model_b": _bn_net(1)} | {which: 42}
    expected = f"{which} must be an nn.Module, a state dict of tensors or a checkpoint path, got int"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.curve(models["model_a"], models["model_b"], eval_data=DATA, num_lambdas=3, model=_bn_net(2))
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.find_permutation(models["model_a"], models["model_b"], method="wm", model=_bn_net(2))


def test_an_alignment_applied_to_what_is_no_model_names_params_b() -> None:
    found = lmclab.find_permutation(_bn_net(0), _bn_net(1), example_inputs=DATA[0])
    expected = "params_b must be an nn.Module, a state dict of tensors or a checkpoint path, got int"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        found.apply(42)


def test_a_given_spec_that_does_not_fit_the_models_names_model_a() -> None:
    torch.manual_seed(2)
    without_bn = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    spec = lmclab.trace_spec(without_bn, DATA[0])
    message = (
        "model_a: keys do not match the permutation spec (missing ['2.bias', '2.weight'], "
        "unexpected ['1.bias', '1.num_batches_tracked', '1.running_mean'])"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        lmclab.find_permutation(_bn_net(0), _bn_net(1), spec=spec)


def test_l2_reduction_names_model_b_when_its_shapes_differ_from_model_as() -> None:
    found = lmclab.find_permutation(_bn_net(0), _bn_net(1), example_inputs=DATA[0])
    wide = _bn_net(1).state_dict() | {"3.weight": torch.zeros(3, 9)}
    with pytest.raises(ValueError, match=r"^model_b: tensor '3\.weight' has shape \(3, 9\), model_a's \(3, 8\)$"):
        lmclab.l2_reduction(_bn_net(0), wide, found)


def test_repair_data_and_a_missing_split_are_named() -> None:
    expected = (
        "repair_data must be a DataLoader, a Dataset, an iterable of (input, target) batches or a pair of tensors, "
        "got int"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.curve(_bn_net(0), _bn_net(1), eval_data=DATA, num_lambdas=3, repair="bn", repair_data=42)
    measured = lmclab.curve(_bn_net(0), _bn_net(1), eval_data={"test": DATA}, num_lambdas=3)
    with pytest.raises(ValueError, match=r"^split: no split 'train' in this curve; it has \['test'\]$"):
        measured.barrier(split="train")


class _LengthOnly:
    def __len__(self) -> int:
        return 3


class _IndexOnly:
    def __getitem__(self, i: int):
        return DATA[0][i], DATA[1][i]


@pytest.mark.parametrize("data", [_LengthOnly(), _IndexOnly()], ids=["len-only", "getitem-only"])
def test_data_needs_both_len_and_getitem_to_be_read_as_a_dataset(data) -> None:
    """Not iterable, and a map-style Dataset needs both methods: either alone is refused, by name."""
    expected = (
        "repair_data must be a DataLoader, a Dataset, an iterable of (input, target) batches or a pair of tensors, "
        f"got {type(data).__name__}"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        lmclab.as_split(data, "repair_data")


def test_an_unreadable_pytorch_file_is_worded_from_its_exception(tmp_path, monkeypatch) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(b"")

    def fail(message: str):
        def load(*args, **kwargs):
            raise RuntimeError(message)

        return load

    monkeypatch.setattr(torch, "load", fail(""))  # no message: the exception's type
    with pytest.raises(
        ValueError, match=r"m\.pt: not a readable PyTorch file \(truncated or corrupted\? RuntimeError\)$"
    ):
        torch_load(path)
    monkeypatch.setattr(torch, "load", fail("y" * 200 + "\nsecond line"))  # its first line, 120 characters
    with pytest.raises(ValueError) as err:
        torch_load(path)
    assert str(err.value).endswith("(truncated or corrupted? " + "y" * 120 + ")")


def test_an_unreadable_safetensors_file_without_a_message_is_worded_by_its_exceptions_type(
    tmp_path, monkeypatch
) -> None:
    import safetensors.torch
    from safetensors.torch import save_file

    from lmclab.api.files import load_model_file

    path = tmp_path / "m.safetensors"
    save_file(_bn_net(0).state_dict(), path)

    def load(*args, **kwargs):
        raise OSError()  # a failed read that says nothing (as some network file systems do)

    monkeypatch.setattr(safetensors.torch, "load_file", load)
    expected = f"{path}: not a readable safetensors file (truncated or corrupted? OSError)"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        load_model_file(path)


@pytest.mark.parametrize(
    ("message", "reason"),
    [("x" * 200 + "\nsecond line", "x" * 120), ("short\n" + "y" * 200, "short")],
    ids=["long", "lines"],
)
def test_an_unreadable_safetensors_files_reason_is_its_first_line_cut_to_120_characters(
    tmp_path, monkeypatch, message: str, reason: str
) -> None:
    import safetensors.torch
    from safetensors.torch import save_file

    from lmclab.api.files import load_model_file

    path = tmp_path / "m.safetensors"
    save_file(_bn_net(0).state_dict(), path)

    def load(*args, **kwargs):
        raise OSError(message)

    monkeypatch.setattr(safetensors.torch, "load_file", load)
    expected = f"{path}: not a readable safetensors file (truncated or corrupted? {reason})"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        load_model_file(path)


def test_a_hugging_face_folder_needs_transformers_and_a_config_object(tmp_path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text(json.dumps(["not", "an", "object"]))
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'config.json'))}: expected a JSON object$"):
        _model_class(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    expected = f"{tmp_path}: a Hugging Face folder needs transformers (pip install 'lmclab[models]')"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        _model_class(tmp_path)
