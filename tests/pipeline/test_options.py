"""One definition per search option: each method's options model (in the method's own module) holds
every option's type, range, default and meaning; the schema of params.yaml embeds those fields,
changing only the defaults its override table lists (with a reason the docs' parameter table shows); the
functions' signatures come from the models; the library's one-line errors name the function's
argument and the pipeline reports them under params.yaml's keys, worded as before."""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import pytest
import torch
import yaml
from dvc_repo import ROOT, TINY

from lmclab.archs import ARCHS
from lmclab.archs.base import DATA_FIELDS, interface
from lmclab.core.options import OptionError
from lmclab.core.spec import build_spec
from lmclab.core.spec_builders import dense
from lmclab.pipeline.defaults import PIPELINE_DEFAULTS
from lmclab.pipeline.keys import key_rows
from lmclab.pipeline.schema import params_model
from lmclab.pipeline.stage import search_errors
from lmclab.search import METHODS, check_method
from lmclab.search.many_methods import MANY_METHODS
from lmclab.search.midpoint import check_batch
from lmclab.search.weight_matching import weight_matching
from lmclab.search.wm_sinkhorn import wm_sinkhorn
from lmclab.train.training import TrainOptions

PERMUTE = params_model().model_fields["permute"].annotation
MODEL_ARCHS = [a for a, m in ARCHS.items() if not interface(m).OBJECTIVE]
OPTIONS = [(method, name) for method in METHODS for name in METHODS[method].options.model_fields]


def _own(method: str, name: str, block: str = "permute"):
    """The field of option ``name`` of ``method``: a pair method's (``permute``), an n-model one's
    (``merge_many``) or an architecture's (``model``)."""
    if block == "model":
        return ARCHS[method].Config.model_fields[name]
    if block == "train":  # train.<option>: the training function's own
        return TrainOptions.model_fields[method]
    return (METHODS if block == "permute" else MANY_METHODS)[method].options.model_fields[name]


@pytest.mark.parametrize(("method", "name"), OPTIONS, ids=[f"{m}.{n}" for m, n in OPTIONS])
def test_the_schema_embeds_each_option_as_its_method_defines_it(method: str, name: str) -> None:
    """Type, range and meaning are the method model's own objects (not a second declaration that
    happens to agree); the default is the model's unless the override table changes it."""
    own, embedded = _own(method, name), PERMUTE.model_fields[method].annotation.model_fields[name]
    assert embedded.annotation is own.annotation
    assert len(embedded.metadata) == len(own.metadata)
    assert all(mine is theirs for mine, theirs in zip(embedded.metadata, own.metadata, strict=True))
    assert embedded.description is own.description
    override = PIPELINE_DEFAULTS.get(f"permute.{method}.{name}")
    assert embedded.default == (own.default if override is None else override.default)


@pytest.mark.parametrize("method", list(METHODS))
def test_each_block_holds_exactly_its_methods_options(method: str) -> None:
    block = PERMUTE.model_fields[method].annotation
    assert list(block.model_fields) == list(METHODS[method].options.model_fields)
    assert block.__doc__ == METHODS[method].options.__doc__


@cache
def _source_strings() -> list[tuple[Path, str, int]]:
    """Every string literal of src/ (implicitly joined pieces as one) with its file, as a pattern and its literal
    length: an f-string's replacement fields match any short text (a help that states a constant), when its
    literal text is nearly all of it."""
    return [
        (path, *_pattern(node))
        for path in sorted((ROOT / "src").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))
    ]


def _pattern(node: ast.expr) -> tuple[str, int]:
    if isinstance(node, ast.Constant):
        return re.escape(node.value), len(node.value)
    pieces = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    return "".join(".{1,20}" if p is None else re.escape(p) for p in pieces), sum(len(p or "") for p in pieces)


@pytest.mark.parametrize(("method", "name"), OPTIONS, ids=[f"{m}.{n}" for m, n in OPTIONS])
def test_each_option_is_written_once(method: str, name: str) -> None:
    """Its meaning is written in one source file (its method's module, or for an option that every
    assignment-solving method shares, ``lap_backend``, its base's), and the function restates neither
    its type nor its default: the keyword comes from the model."""
    meaning = _own(method, name).description
    written = [
        path
        for path, pattern, literal in _source_strings()
        if literal >= 0.9 * len(meaning) and re.fullmatch(pattern, meaning, re.DOTALL)
    ]
    owner = next(c for c in METHODS[method].options.__mro__ if name in vars(c).get("__annotations__", {}))
    assert written == [Path(inspect.getfile(owner))]
    assert name not in inspect.signature(inspect.unwrap(METHODS[method])).parameters
    keyword = inspect.signature(METHODS[method]).parameters[name]
    assert keyword.kind is keyword.KEYWORD_ONLY and keyword.default == _own(method, name).default


def test_every_pipeline_default_that_differs_says_why_in_the_parameter_table() -> None:
    rows = {key: (default, meaning) for key, default, _, meaning in key_rows()}
    assert PIPELINE_DEFAULTS, "params.yaml runs Sinkhorn WM shorter than the paper"
    for key, override in PIPELINE_DEFAULTS.items():
        block, method, name = (key.split(".") + [""])[:3]
        library = _own(method, name, block).default
        assert override.default != library and override.reason
        default, meaning = rows[key]
        assert default == override.default
        assert meaning.endswith(f" — differs from the library default ({library}): {override.reason}")
    every = (
        [("permute", m, n) for m, n in OPTIONS]
        + [("merge_many", m, n) for m in MANY_METHODS for n in MANY_METHODS[m].options.model_fields]
        + [("model", a, n) for a in MODEL_ARCHS for n in ARCHS[a].Config.model_fields if n not in DATA_FIELDS]
    )
    train = {f"train.{n}" for n in TrainOptions.model_fields if n != "augment" and _differs(rows[f"train.{n}"][0], n)}
    differing = {f"{b}.{m}.{n}" for b, m, n in every if not _same(rows[f"{b}.{m}.{n}"][0], _own(m, n, b).default)}
    assert differing | train == set(PIPELINE_DEFAULTS)


def _differs(pipeline: object, name: str) -> bool:
    return pipeline != TrainOptions.model_fields[name].default


def _same(pipeline: object, library: object) -> bool:
    """params.yaml writes a sequence as a list, the library's frozen configs hold a tuple."""
    return pipeline == (list(library) if isinstance(library, tuple) else library)


def test_the_library_defaults_of_sinkhorn_wm_are_the_papers_steps_scored_every_ten() -> None:
    keywords = inspect.signature(wm_sinkhorn).parameters
    assert (keywords["epochs"].default, keywords["iterations"].default, keywords["lr"].default) == (100, 10, 1.0)
    assert keywords["patience"].default == 10  # stops a hundred steps after its last gain; None: the paper's
    assert (
        PIPELINE_DEFAULTS["permute.wm_sinkhorn.epochs"].default
        == yaml.safe_load((ROOT / "params.yaml").read_text())["permute"]["wm_sinkhorn"]["epochs"]
        == 25
    )


ERRORS = [  # (method, options, the library's line, the pipeline's line: as the stages reported it before)
    (
        "wm",
        {"max_iter": 0},
        "max_iter must be a positive integer, got 0",
        "permute.wm.max_iter must be a positive integer, got 0",
    ),
    (
        "wm",
        {"max_iter": 2.0},
        "max_iter must be a positive integer, got 2.0",
        "permute.wm.max_iter must be a positive integer, got 2.0",
    ),
    (
        "wm_sinkhorn",
        {"iterations": 0},
        "iterations must be a positive integer, got 0",
        "permute.wm_sinkhorn.iterations must be a positive integer, got 0",
    ),
    (
        "wm_sinkhorn",
        {"patience": 0},
        "patience must be a positive integer or null, got 0",
        "permute.wm_sinkhorn.patience must be a positive integer or null, got 0",
    ),
    (
        "wm_sinkhorn",
        {"tau": -1.0},
        "tau must be a positive number, got -1.0",
        "permute.wm_sinkhorn.tau must be a positive number, got -1.0",
    ),
    (
        "ste",
        {"holdout": 1.5},
        "holdout must be a number in [0, 1), got 1.5",
        "permute.ste.holdout must be a number in [0, 1), got 1.5",
    ),
    (
        "ste",
        {"optimizer": "lbfgs"},
        "optimizer must be one of ['adam', 'sgd'], got 'lbfgs'",
        "permute.ste.optimizer must be one of ['adam', 'sgd'], got 'lbfgs'",
    ),
    (
        "ste",
        {"holdout": 0, "select": "holdout"},
        "holdout must be above 0 when select is 'holdout' (or choose select: best_batch), got 0",
        "permute.ste.holdout must be above 0 when permute.ste.select is 'holdout' "
        "(or choose select: best_batch), got 0",
    ),
    (
        "ste_sinkhorn",
        {"drop_last": 1},
        "drop_last must be true or false, got 1",
        "permute.ste_sinkhorn.drop_last must be true or false, got 1",
    ),
    (
        "ste_sinkhorn",
        {"weight_decay": -1},
        "weight_decay must be a non-negative number, got -1",
        "permute.ste_sinkhorn.weight_decay must be a non-negative number, got -1",
    ),
    (
        "ste_sinkhorn",
        {"precision": "fp16"},
        "precision must be one of ['fp32', 'bf16'], got 'fp16'",
        "permute.ste_sinkhorn.precision must be one of ['fp32', 'bf16'], got 'fp16'",
    ),
    (
        "wm",
        {"iters": 3},
        "options: unknown option(s) ['iters']; expected some of ['lap_backend', 'max_iter', 'tol', 'restarts']",
        "permute.wm: unknown option(s) ['iters']; expected some of ['lap_backend', 'max_iter', 'tol', 'restarts']",
    ),
    (
        "identity",
        {"x": {1: 2}},
        "options: unknown option(s) ['x']; expected some of []",
        "permute.identity: unknown option(s) ['x']; expected some of []",
    ),
    (
        "nope",
        {},
        "method: unknown method 'nope'; expected one of ['am', 'identity', 'ste', 'ste_sinkhorn', 'wm', 'wm_sinkhorn']",
        "permute.methods: unknown method 'nope'; expected one of ['am', 'identity', 'ste', "
        "'ste_sinkhorn', 'wm', 'wm_sinkhorn']",
    ),
]


@pytest.mark.parametrize(("method", "options", "library", "pipeline"), ERRORS)
def test_library_errors_name_the_argument(method: str, options: dict, library: str, pipeline: str) -> None:
    with pytest.raises(OptionError) as err:
        check_method(method, options)
    assert str(err.value) == library and "permute" not in library


@pytest.mark.parametrize(("method", "options", "library", "pipeline"), ERRORS)
def test_the_pipeline_reports_them_under_params_keys(method: str, options: dict, library: str, pipeline: str) -> None:
    with pytest.raises(ValueError) as err, search_errors(method):
        check_method(method, options)
    assert str(err.value) == pipeline


def test_a_function_called_directly_raises_the_same_line() -> None:
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    params = {
        "l0.weight": torch.ones(3, 2),
        "l0.bias": torch.ones(3),
        "l1.weight": torch.ones(2, 3),
        "l1.bias": torch.ones(2),
    }
    assert weight_matching(spec, params, params, max_iter=1).stats["sweeps"] == 1
    with pytest.raises(OptionError, match=r"^max_iter must be a positive integer, got 0$"):
        weight_matching(spec, params, params, max_iter=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'iters'"):  # as Python says it
        weight_matching(spec, params, params, iters=3)


def test_the_batch_check_names_batch_size_only() -> None:
    with pytest.raises(OptionError) as err:
        check_batch(10, 5)
    assert str(err.value) == "batch_size must be at most the 5 training samples available for the search, got 10"
    with pytest.raises(ValueError) as err, search_errors("ste_sinkhorn"):
        check_batch(10, 5)
    assert str(err.value) == (
        "permute.ste_sinkhorn.batch_size must be at most the 5 training samples available for the search, got 10"
    )


def test_the_permute_stage_reports_a_bad_option_under_its_key_before_loading_anything(tmp_path: Path) -> None:
    import permute  # stages/permute.py

    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["permute"]["wm"]["max_iter"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    missing = tmp_path / "absent"  # never opened: the options fail first
    with pytest.raises(SystemExit, match=r"^error: permute.wm.max_iter must be a positive integer, got 0$"):
        permute.main(
            method="wm", model_a=missing, model_b=missing, data=missing, out=missing, params=tmp_path / "params.yaml"
        )
