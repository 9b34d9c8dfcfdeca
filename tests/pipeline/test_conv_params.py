"""The conv nets' parameters are validated up front with one-line errors naming them."""

from __future__ import annotations

import pytest
from dvc_repo import ROOT
from test_validate import _params

from lmclab.pipeline.stage import load_yaml
from lmclab.pipeline.validate import check_params

BASE = load_yaml(ROOT / "params.yaml")


def _check(**changes):
    check_params(_params(**changes))


def test_repository_params_are_valid_and_the_default_run_is_the_mlp():
    _check()
    assert BASE["model"]["arch"] == "mlp" and BASE["data"]["name"] == "mnist5k"


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"model__arch": "vgg", "model__vgg__width_multiplier": -1}, "model.vgg.width_multiplier: expected"),
        ({"model__arch": "resnet20", "model__resnet20__depth": 20}, "model.resnet20.depth: unknown key"),
        ({"model__arch": "vgg16"}, "model.arch"),
        ({"train__optimizer": "lbfgs"}, "train.optimizer"),
        ({"train__momentum": 1.5}, "train.momentum"),
        ({"train__weight_decay": -0.1}, "train.weight_decay"),
        ({"train__schedule": "step"}, "train.schedule"),
        ({"train__warmup_epochs": 100}, "train.warmup_epochs"),
        ({"train__augment": "cutout"}, "train.augment"),
        ({"measure__repair": "yes"}, "measure.repair"),
        ({"measure__repair_samples": 0}, "measure.repair_samples"),
        ({"data__name": "imagenet", "data__image_size": 8}, "data.image_size"),
    ],
)
def test_bad_new_params_are_one_line_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        _check(**changes)


@pytest.mark.parametrize("arch", ["vgg", "resnet20", "resnet50"])
def test_every_architecture_block_in_params_is_valid(arch):
    _check(model__arch=arch)
