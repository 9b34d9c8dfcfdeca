"""The library's one-line errors name the function's own arguments, never a params.yaml key; the stages
report them under params.yaml's keys (``lmclab.pipeline.stage.params_errors`` with each stage's
``KEYS``), worded exactly as the pipeline worded them before the library stopped naming keys."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import yaml
from test_validate import _params
from typer.testing import CliRunner

from lmclab.analysis.alignment import check_gammas, check_mode
from lmclab.analysis.landscape import plane_grid
from lmclab.archs import get_arch, make_config, traced
from lmclab.core.bn_repair import repair_subset
from lmclab.core.data import DataUnavailableError, FolderNotFoundError, Split, prepare
from lmclab.core.distributed import torchrun_command
from lmclab.core.metrics import lambda_grid
from lmclab.core.options import OptionError
from lmclab.core.repairs import resolved_repair
from lmclab.pipeline.stage import method_key, model_key, params_errors, params_key, under
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.search.merge_many import merge_many
from lmclab.train.augment import Mixup, augment_batch, resolve_augment
from lmclab.train.training import check_training_options, train

KEY_PREFIXES = ("train.", "measure.", "data.", "model.", "three.", "merge_many.", "permute.")
NOWHERE = Path("/nonexistent/lmclab")  # never written: every call below fails before any I/O
TINY_SPLIT = Split(torch.zeros(8, 1, 28, 28), torch.zeros(8, dtype=torch.long))


def not_a_module(num_classes: int = 10) -> int:  # a traced factory returning no nn.Module
    return num_classes


def refuses(num_classes: int = 10) -> None:  # a traced factory failing, braces in its message
    raise ValueError("no {width} here")


def _train(**options) -> None:
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=4)
    train("mlp", config, 0, TINY_SPLIT, TINY_SPLIT, epochs=1, batch_size=4, progress=False, **options)


def _options(**bad) -> None:
    check_training_options(**{"epochs": 2, "lr": 0.1, "batch_size": 4, "n_train": 8, **bad})


def _traced(**fields) -> object:
    return make_config("traced", input_shape=(1, 28, 28), num_classes=10, **fields)


MODULES = "['cifar10', 'fashion_mnist', 'imagenet', 'mnist', 'mnist5k', 'pydoc', 'text']"
FOLDER = (
    "is not a directory (expected an ImageFolder layout: <root>/train/<class>/*.JPEG and <root>/val/<class>/*.JPEG)"
)
CASES = [  # (call, the library's line, the stages reporting it, their line: the pipeline's wording before)
    (
        lambda: lambda_grid(1),
        "num_lambdas must be at least 2 (both endpoints), got 1",
        ("measure", "connect"),
        "measure.num_lambdas must be at least 2 (both endpoints), got 1",
    ),
    (
        lambda: check_mode("exact"),
        "conv_spectrum must be one of ['reshape', 'fft'], got 'exact'",
        ("measure", "spectra"),
        "measure.conv_spectrum must be one of ['reshape', 'fft'], got 'exact'",
    ),
    (
        lambda: check_gammas([0.0, 1.5]),
        "gammas: γ must lie in [0, 1], got 1.5",
        ("measure", "connect"),
        "measure.gammas: γ must lie in [0, 1], got 1.5",
    ),
    (
        lambda: repair_subset(TINY_SPLIT, 0),
        "repair_samples must be a positive number of images or null, got 0",
        ("measure", "merge"),
        "measure.repair_samples must be a positive number of images or null, got 0",
    ),
    (
        lambda: repair_subset(TINY_SPLIT, -1, key="train_samples"),
        "train_samples must be a positive number of images or null, got -1",
        ("measure", "connect"),
        "measure.train_samples must be a positive number of images or null, got -1",
    ),
    (
        lambda: resolved_repair("bn", torch.nn.Linear(2, 2)),
        "repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm",
        ("measure", "merge", "connect"),
        "measure.repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm",
    ),
    (
        lambda: plane_grid(1, 0.1),
        "resolution must be at least 2 points per axis, got 1",
        ("connect",),
        "three.resolution must be at least 2 points per axis, got 1",
    ),
    (
        lambda: plane_grid(3, -0.5),
        "margin must be non-negative, got -0.5",
        ("connect",),
        "three.margin must be non-negative, got -0.5",
    ),
    (
        lambda: merge_many(None, [{}]),
        "params must name at least 2 models, got 1",
        ("merge_many",),
        "merge_many.seeds must name at least 2 models, got 1",
    ),
    (
        lambda: merge_many(None, [{}, {}], max_iter=0),
        "max_iter must be a positive integer, got 0",
        ("merge_many",),
        "merge_many.merge_many.max_iter must be a positive integer, got 0",
    ),
    (
        lambda: merge_many(None, [{}, {}], tol=-1.0),
        "tol must be a non-negative number, got -1.0",
        ("merge_many",),
        "merge_many.merge_many.tol must be a non-negative number, got -1.0",
    ),
    (
        lambda: _options(optimizer="rmsprop"),
        "optimizer must be one of ['adam', 'sgd'], got 'rmsprop'",
        ("train",),
        "train.optimizer must be one of ['adam', 'sgd'], got 'rmsprop'",
    ),
    (
        lambda: _options(schedule="step"),
        "schedule must be one of ['constant', 'cosine', 'linear'], got 'step'",
        ("train",),
        "train.schedule must be one of ['constant', 'cosine', 'linear'], got 'step'",
    ),
    (
        lambda: _options(augment="auto"),
        "augment must be one of ['none', 'crop_flip'], got 'auto'",
        ("train",),
        "train.augment must be one of ['none', 'crop_flip'], got 'auto'",
    ),
    (
        lambda: _options(momentum=1.0),
        "momentum must be a number in [0, 1), got 1.0",
        ("train",),
        "train.momentum must be a number in [0, 1), got 1.0",
    ),
    (
        lambda: _options(weight_decay=-1.0),
        "weight_decay must be a non-negative number, got -1.0",
        ("train",),
        "train.weight_decay must be a non-negative number, got -1.0",
    ),
    (
        lambda: _options(warmup_epochs=5),
        "warmup_epochs must be between 0 and epochs (2), got 5",
        ("train",),
        "train.warmup_epochs must be between 0 and train.epochs (2), got 5",
    ),
    (
        lambda: _options(epochs=0),
        "epochs must be a positive integer, got 0",
        ("train",),
        "train.epochs must be a positive integer, got 0",
    ),
    (
        lambda: _options(lr=0.0),
        "lr must be a positive number, got 0.0",
        ("train",),
        "train.lr must be a positive number, got 0.0",
    ),
    (
        lambda: _options(batch_size=9),
        "batch_size must be between 1 and the 8 training samples, got 9",
        ("train",),
        "train.batch_size must be between 1 and the 8 training samples, got 9",
    ),
    (
        lambda: _train(precision="fp16"),
        "precision must be one of ['fp32', 'bf16'], got 'fp16'",
        ("train",),
        "train.precision must be one of ['fp32', 'bf16'], got 'fp16'",
    ),
    (
        lambda: _train(mixup_alpha=-1.0),
        "mixup_alpha must be a non-negative number, got -1.0",
        ("train",),
        "train.mixup_alpha must be a non-negative number, got -1.0",
    ),
    (
        lambda: resolve_augment("mixup", "cifar10"),
        "augment: expected auto or one of ('none', 'crop_flip'), got 'mixup'",
        ("train",),
        "train.augment: expected auto or one of ('none', 'crop_flip'), got 'mixup'",
    ),
    (
        lambda: augment_batch(TINY_SPLIT.x, "cutout", torch.Generator()),
        "augment: expected one of ('none', 'crop_flip'), got 'cutout'",
        ("train",),
        "train.augment: expected one of ('none', 'crop_flip'), got 'cutout'",
    ),
    (
        lambda: Mixup(0.0, seed=0),
        "mixup_alpha must be positive to mix (0 = off), got 0.0",
        ("train",),
        "train.mixup_alpha must be positive to mix (0 = off), got 0.0",
    ),
    (
        lambda: torchrun_command("py", "s.py", [], nproc_per_node=2, nnodes=2, rdzv_endpoint=None, run_id="r"),
        "rdzv_endpoint: 2 machines need the rendezvous host:port, got None",
        ("train",),
        "train.rdzv_endpoint: 2 machines need the rendezvous host:port, got None",
    ),
    (
        lambda: get_arch("transformer"),
        "arch: unknown architecture 'transformer'; expected one of ['gpt', 'mae', 'mixer', 'mlp', 'resnet20', "
        "'resnet50', 'traced', 'vgg', 'vit']",
        ("train",),
        "model.arch: unknown architecture 'transformer'; expected one of ['gpt', 'mae', 'mixer', 'mlp', "
        "'resnet20', 'resnet50', 'traced', 'vgg', 'vit']",
    ),
    (
        lambda: _traced(factory="nope"),
        "factory: expected 'module:callable', got 'nope'",
        ("train",),
        "model.traced.factory: expected 'module:callable', got 'nope'",
    ),
    (
        lambda: _traced(factory="os:nope"),
        "factory: cannot import 'os:nope' (module 'os' has no attribute 'nope')",
        ("train",),
        "model.traced.factory: cannot import 'os:nope' (module 'os' has no attribute 'nope')",
    ),
    (
        lambda: _traced(factory="os:sep"),
        "factory: 'os:sep' is not callable",
        ("train",),
        "model.traced.factory: 'os:sep' is not callable",
    ),
    (
        lambda: make_config("traced", input_shape=(3, 32, 32), num_classes=10, in_channels=4),
        "in_channels: 4 is not a multiple of the data's 3 channel(s)",
        ("train",),
        "model.traced.in_channels: 4 is not a multiple of the data's 3 channel(s)",
    ),
    (
        lambda: traced.Model(_traced(factory="test_library_errors:not_a_module")),
        "factory: 'test_library_errors:not_a_module' returned int, not an nn.Module",
        ("train",),
        "model.traced.factory: 'test_library_errors:not_a_module' returned int, not an nn.Module",
    ),
    (
        lambda: traced.Model(_traced(factory="test_library_errors:refuses")),
        "config: test_library_errors:refuses(**{'num_classes': 10}) failed: no {width} here",
        ("train",),
        "model.traced: test_library_errors:refuses(**{'num_classes': 10}) failed: no {width} here",
    ),
    (
        lambda: prepare("svhn", NOWHERE, NOWHERE),
        f"name: unknown data set 'svhn'; expected one of {MODULES}",
        ("download",),
        f"data.name: unknown data set 'svhn'; expected one of {MODULES}",
    ),
    (
        lambda: prepare("mnist5k", NOWHERE, NOWHERE, max_train=0),
        "max_train must be a positive number of samples or null, got 0",
        ("download",),
        "data.max_train must be a positive number of samples or null, got 0",
    ),
    (
        lambda: prepare("mnist5k", NOWHERE, NOWHERE, max_test=0),
        "max_test must be a positive number of samples or null, got 0",
        ("download",),
        "data.max_test must be a positive number of samples or null, got 0",
    ),
    (
        lambda: prepare("mnist5k", NOWHERE, NOWHERE, image_size=8),
        "image_size must be an integer of at least 28 pixels, got 8",
        ("download",),
        "data.image_size must be an integer of at least 28 pixels, got 8",
    ),
    (
        lambda: prepare("imagenet", NOWHERE, NOWHERE, image_size=32),
        f"root: {NOWHERE}/train {FOLDER}",
        ("download",),
        f"data.root: {NOWHERE}/train {FOLDER}",
    ),
]
LIBRARY = [pytest.param(call, line, id=line[:40]) for call, line, _, _ in CASES]
PIPELINE = [
    pytest.param(call, stage, line, id=f"{stage}: {line[:40]}") for call, _, stages, line in CASES for stage in stages
]


def stage_keys(stage: str) -> tuple:
    """The keys ``stage`` reports the library's errors under (its script's ``KEYS``, and what it adds)."""
    module = importlib.import_module(stage)
    keys = module.KEYS
    extra = {"train": model_key("traced"), "connect": method_key("permute", "wm")}
    if stage == "merge_many":
        extra["merge_many"] = method_key("merge_many", "merge_many")  # an n-model method's options
    return (keys, extra[stage]) if stage in extra else (keys,)


@pytest.mark.parametrize(("call", "line"), LIBRARY)
def test_library_errors_name_the_functions_arguments(call, line: str) -> None:
    with pytest.raises(OptionError) as err:
        call()
    assert str(err.value) == line and not any(prefix in line for prefix in KEY_PREFIXES)


@pytest.mark.parametrize(("call", "stage", "line"), PIPELINE)
def test_the_stages_report_them_under_params_keys_as_before(call, stage: str, line: str) -> None:
    with pytest.raises(ValueError) as err, params_errors(*stage_keys(stage)):
        call()
    assert str(err.value) == line and not isinstance(err.value, OptionError)


def test_data_errors_keep_their_kinds() -> None:
    assert issubclass(DataUnavailableError, RuntimeError) and issubclass(FolderNotFoundError, FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        prepare("imagenet", NOWHERE, NOWHERE, image_size=32)


def test_an_argument_takes_the_key_of_the_first_that_knows_it() -> None:
    key = params_key(under("measure", "num_lambdas", "conv_spectrum"), {"conv_spectrum": "elsewhere"})
    assert [key(n) for n in ("num_lambdas", "conv_spectrum", "tol")] == [
        "measure.num_lambdas",
        "measure.conv_spectrum",
        "tol",
    ]
    key = params_key({"margin": "three.margin"}, method_key("permute", "wm"), {"tol": "never"})
    assert [key(n) for n in ("margin", "tol", "method")] == ["three.margin", "permute.wm.tol", "permute.methods"]
    names = ("arch", "config", "layers")
    assert [model_key("vgg")(n) for n in names] == ["model.arch", "model.vgg", "model.vgg.layers"]
    many = method_key("merge_many", "c2m3")
    assert [many(n) for n in ("method", "options", "tol")] == [
        "merge_many.methods",
        "merge_many.c2m3",
        "merge_many.c2m3.tol",
    ]


def test_validate_reports_a_traced_factory_under_its_key() -> None:
    with pytest.raises(ParamsError) as err:
        check_params(_params(model__arch="traced", model__traced__factory="nope"))
    assert err.value.lines == ["model.traced.factory: expected 'module:callable', got 'nope'"]


@pytest.mark.parametrize(
    ("stage", "params", "line"),
    [
        (
            "download",
            {
                "data": {
                    "name": "mnist5k",
                    "root": str(NOWHERE),
                    "max_train": 0,
                    "max_test": None,
                    "image_size": 224,
                    "context": 64,
                    "tokenizer": None,
                    "text_column": "text",
                }
            },
            "error: data.max_train must be a positive number of samples or null, got 0",
        ),
        (
            "spectra",
            {"device": "cpu", "threads": 1, "train": {"seeds": [0]}, "measure": {"conv_spectrum": "exact"}},
            "error: measure.conv_spectrum must be one of ['reshape', 'fft'], got 'exact'",
        ),
    ],
)
def test_a_stage_prints_the_keyed_line(tmp_path: Path, stage: str, params: dict, line: str) -> None:
    args = ["--out", str(tmp_path / "out")]
    args += ["--models", str(tmp_path), "--data", str(tmp_path)] if stage == "spectra" else []
    assert _last_line(tmp_path, stage, params, args) == line


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"train__batch_size": 100_000},
            "error: train.batch_size must be between 1 and the 800 training samples, got 100000",
        ),
        (
            {"model__arch": "traced", "model__traced__factory": "nope"},
            "error: model.traced.factory: expected 'module:callable', got 'nope'",
        ),
    ],
)
def test_the_train_stage_prints_the_keyed_line(prepared: Path, tmp_path: Path, changes: dict, line: str) -> None:
    args = [
        "--seed",
        "0",
        "--data",
        str(prepared),
        "--out",
        str(tmp_path / "seed0.pt"),
        "--history",
        str(tmp_path / "seed0.parquet"),
        "--live",
        str(tmp_path / "live"),
    ]
    assert _last_line(tmp_path, "train", _params(**changes), args) == line


def _last_line(tmp_path: Path, stage: str, params: dict, args: list[str]) -> str:
    """The last line ``stage`` prints when run on ``params`` with ``args``; it must fail."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    res = CliRunner().invoke(importlib.import_module(stage).app, [*args, "--params", str(tmp_path / "params.yaml")])
    assert res.exit_code == 1, res.output
    return res.output.strip().splitlines()[-1]
