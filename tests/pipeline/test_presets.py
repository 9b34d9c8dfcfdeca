"""Named presets: the paper's settings, the transformer extensions and the n-model one; each applies to
the repository's params.yaml, keeps its comments, and validates; a typo in a preset is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dvc_repo import ROOT
from preset import PRESETS, apply_preset, flatten, set_values

from lmclab.pipeline.stage import parse_yaml
from lmclab.pipeline.validate import check_params

NAMES = sorted(p.stem for p in PRESETS.glob("*.yaml"))
PAPER = ["cifar10_resnet20", "cifar10_vgg11", "fashion_mnist_mlp", "imagenet_resnet50", "mnist_mlp"]
EXTENSIONS = ["cifar10_mae", "cifar10_vit", "mae", "vit"]  # transformers (docs/transformers.md)
MANY = ["cifar10_resnet20x4_many"]  # n models in one frame (docs/methods.md)


def test_the_papers_settings_and_the_extensions_are_all_there():
    assert sorted(PAPER + EXTENSIONS + MANY) == NAMES


def _applied(name: str) -> dict:
    """The preset applied to params.yaml: its values set, every other line and comment kept, valid."""
    text = (ROOT / "params.yaml").read_text()
    new = apply_preset(name, text)
    preset = flatten(parse_yaml((PRESETS / f"{name}.yaml").read_text()))
    tree = parse_yaml(new)
    assert all(flatten(tree)[k] == v for k, v in preset.items())
    assert len(new.splitlines()) == len(text.splitlines())
    assert [ln.split(" # ", 1)[1] for ln in new.splitlines() if " # " in ln] == [
        ln.split(" # ", 1)[1] for ln in text.splitlines() if " # " in ln
    ]
    check_params(tree)
    return tree


@pytest.mark.parametrize("name", PAPER)
def test_preset_applies_keeps_comments_and_validates(name):
    tree = _applied(name)
    assert tree["train"]["batch_size"] == 512 and len(tree["permute"]["pairs"]) == 5
    # every table runs the paper's WM and STE (the Sinkhorn methods, Appendix D.2) at its settings
    assert {"wm_sinkhorn", "ste_sinkhorn"} <= set(tree["permute"]["methods"])
    assert tree["three"]["methods"][:2] == ["wm_sinkhorn", "ste_sinkhorn"]
    lr = 10.0 if name == "imagenet_resnet50" else 1.0  # Appendix D: lr 10 for ResNet50
    assert tree["permute"]["ste_sinkhorn"]["lr"] == tree["permute"]["wm_sinkhorn"]["lr"] == lr
    assert tree["permute"]["ste_sinkhorn"]["epochs"] == 5
    assert tree["permute"]["wm_sinkhorn"]["epochs"] * tree["permute"]["wm_sinkhorn"]["iterations"] == 1000


def test_unknown_key_and_block_are_errors():
    text = "a:\n  b: 1   # units\n  c:\n    d: x\n"
    assert yaml.safe_load(set_values(text, {"a.b": [1, 2], "a.c.d": "y z"})) == {"a": {"b": [1, 2], "c": {"d": "y z"}}}
    assert "# units" in set_values(text, {"a.b": 2})
    with pytest.raises(ValueError, match="a.e"):
        set_values(text, {"a.e": 1})
    with pytest.raises(ValueError, match="block"):
        set_values(text, {"a.c": 1})


def test_unknown_preset_is_one_line_error():
    with pytest.raises(FileNotFoundError, match="known"):
        apply_preset("cifar100_wrn", Path(ROOT / "params.yaml").read_text())


@pytest.mark.parametrize("name", EXTENSIONS)
def test_transformer_presets_pretrain_or_train_the_same_vit_and_measure_repair(name):
    tree = _applied(name)
    assert tree["model"]["arch"] == "vit" and tree["model"]["vit"]["pool"] == "cls"
    assert tree["train"]["objective"] == ("mae" if name.endswith("mae") else "supervised")
    assert tree["data"]["name"] == ("cifar10" if name.startswith("cifar10") else "mnist5k")  # offline: mnist5k
    assert {"identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"} <= set(tree["permute"]["methods"])
    assert tree["measure"]["repair"] is True and len(tree["permute"]["pairs"]) >= 3
    twin = _applied(name.replace("mae", "vit") if name.endswith("mae") else name.replace("vit", "mae"))
    assert twin["model"]["vit"] == tree["model"]["vit"]  # supervised and MAE: the same encoder
    assert twin["train"]["seeds"] == tree["train"]["seeds"] and twin["permute"]["pairs"] == tree["permute"]["pairs"]


@pytest.mark.parametrize("name", MANY)
def test_many_model_preset_merges_five_batchnorm_nets_by_every_method_with_bn_repair(name):
    tree = _applied(name)
    assert tree["model"]["arch"] == "resnet20" and tree["model"]["resnet20"]["width_multiplier"] == 4
    assert tree["merge_many"]["seeds"] == tree["train"]["seeds"] == [0, 1, 2, 3, 4]
    assert tree["merge_many"]["methods"] == ["merge_many", "c2m3", "sync", "star"]
    assert tree["merge_many"]["repair"] == "bn"  # validate refuses REPAIR on a BatchNorm net
