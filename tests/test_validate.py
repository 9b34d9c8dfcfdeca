"""Every bad parameter is a one-line error naming it, raised before any heavy work."""

from __future__ import annotations

import copy

import pytest

from lmclab.validate import check_params
from test_pipeline import TINY


def _params(**changes) -> dict:  # noqa: ANN003
    params = copy.deepcopy(TINY)
    for key, value in changes.items():
        node = params
        *path, last = key.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return {k: params[k] for k in ("data", "model", "train", "permute", "measure", "device", "three",
                                   "merge_many")}


def test_the_tiny_params_are_valid() -> None:
    check_params(**_params())


@pytest.mark.parametrize(("change", "message"), [
    ({"data__name": "imagenet21k"}, r"^data.name: unknown data set 'imagenet21k'"),
    ({"model__arch": "transformer"}, r"^model.arch: unknown architecture 'transformer'"),
    ({"model__mlp__width": 0}, r"^model.mlp.width must be a positive"),
    ({"model__mlp__width": -3}, r"^model.mlp.width must be a positive"),
    ({"model__mlp__hidden": 0}, r"^model.mlp.hidden must be a positive"),
    ({"train__epochs": 0}, r"^train.epochs must be a positive integer"),
    ({"train__batch_size": 0}, r"^train.batch_size must be a positive integer"),
    ({"train__lr": -1.0}, r"^train.lr must be positive"),
    ({"permute__pairs": [[0, 7]]}, r"^permute.pairs: pair \[0, 7\] names seed\(s\) \[7\] not in train.seeds"),
    ({"permute__pairs": [[1, 1]]}, r"^permute.pairs: \[1, 1\] is not a pair of two different seeds"),
    ({"permute__methods": ["wm", "magic"]}, r"^permute.methods: unknown method 'magic'"),
    ({"permute__wm": {"iters": 3}}, r"^permute.wm: unknown option\(s\) \['iters'\]"),
    ({"measure__num_lambdas": 1}, r"^measure.num_lambdas must be at least 2"),
    ({"device": "tpu"}, r"^device: unknown device 'tpu'"),
    ({"measure__taylor_splits": ["val"]}, r"^measure.taylor_splits must be a non-empty list of train/test"),
    ({"three__triples": [[0, 1]]}, r"^three.triples: \[0, 1\] is not a list of 3 different seeds"),
    ({"three__triples": [[0, 1, 9]]}, r"^three.triples: \[0, 1, 9\] names seed\(s\) \[9\] not in train.seeds"),
    ({"three__methods": ["wm", "magic"]}, r"^three.methods: unknown method 'magic'"),
    ({"three__resolution": 1}, r"^three.resolution must be at least 2"),
    ({"merge_many__seeds": [0, 5]}, r"^merge_many.seeds: \[0, 5\] names seed\(s\) \[5\]"),
    ({"merge_many__seeds": [0]}, r"^merge_many: needs at least 2 seeds"),
])
def test_bad_parameters(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        check_params(**_params(**change))
    assert "\n" not in str(err.value)


def test_a_method_without_its_options_block() -> None:
    params = _params()
    del params["permute"]["am"]
    with pytest.raises(ValueError, match=r"^permute.am: missing options block"):
        check_params(**params)
