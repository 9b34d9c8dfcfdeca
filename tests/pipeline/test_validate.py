"""Every bad parameter is one line naming its key, its value and what is expected, raised before
any heavy work: wrong type, out of range, unknown key (a typo), missing key, unknown method option,
and the checks that span several keys."""

from __future__ import annotations

import copy
import inspect
import re

import pytest
from dvc_repo import ROOT
from pydantic import TypeAdapter, ValidationError, model_validator
from test_pipeline import TINY

from lmclab.archs import ARCHS, mae, vit
from lmclab.archs.base import interface
from lmclab.core.data import FOLDER_LOADERS, LOADERS
from lmclab.core.options import OptionError, got
from lmclab.core.text import TEXTS
from lmclab.pipeline.block import Block, group
from lmclab.pipeline.keys import defaults, key_rows
from lmclab.pipeline.schema import params_model
from lmclab.pipeline.stage import load_yaml
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.pipeline.validate_model import check_objective, check_text_source
from lmclab.search import METHODS
from lmclab.search.many_methods import MANY_METHODS

DELETE = object()  # remove the key instead of setting it


def _params(**changes) -> dict:
    """TINY with ``a__b=value`` changes (``DELETE`` removes the key)."""
    params = copy.deepcopy(TINY)
    for key, value in changes.items():
        node = params
        *path, last = key.split("__")
        for part in path:
            node = node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return params


def test_the_tiny_params_are_valid() -> None:
    check_params(_params())


def test_a_language_model_reads_a_text() -> None:
    check_params(_params(model__arch="gpt", data__name="pydoc", data__context=32, train__objective="lm"))


def test_a_language_model_reads_a_folder_of_text_files(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("some text")
    lm = {"model__arch": "gpt", "train__objective": "lm", "data__context": 8}
    check_params(_params(data__name="text", data__root=str(tmp_path), **lm))
    (tmp_path / "a.txt").unlink()
    with pytest.raises(ParamsError) as err:
        check_params(_params(data__name="text", data__root=str(tmp_path), **lm))
    assert err.value.lines == [
        f"data.root: {tmp_path} holds no text file (*.txt, *.md, *.rst, *.text) and no saved "
        "Hugging Face dataset (dataset_dict.json or state.json)"
    ]
    check_params(_params(data__root=str(tmp_path / "unread")))  # a root is only a corpus for data.name text


def test_orthogonal_maps_are_sought_by_the_methods_that_seek_them() -> None:
    methods = ["identity", "wm", "am", "ste"]
    check_params(
        _params(
            permute__symmetry="orthogonal", permute__methods=methods, three__methods=["wm"], permute__ste__batch_size=64
        )
    )


def test_a_headed_architecture_takes_the_sinkhorn_methods() -> None:
    """The Sinkhorn methods search headed groups (soft headed permutations) like the others."""
    methods = ["identity", "wm", "wm_sinkhorn", "ste_sinkhorn"]
    check_params(
        _params(
            model__arch="vit",
            permute__methods=methods,
            three__methods=["wm_sinkhorn"],
            permute__ste_sinkhorn__batch_size=64,
        )
    )


BAD = [  # (change, expected line), a line is "<key>: expected …, got <value>"
    # a string where a number belongs (these once were tracebacks)
    ({"train__lr": "abc"}, "train.lr: expected a number > 0, got 'abc'"),
    ({"measure__num_lambdas": "abc"}, "measure.num_lambdas: expected an integer ≥ 2, got 'abc'"),
    ({"three__margin": "abc"}, "three.margin: expected a number ≥ 0, got 'abc'"),
    ({"permute__wm__tol": "1e-06"}, "permute.wm.tol: expected a number ≥ 0, got '1e-06'"),
    ({"train__epochs": 2.5}, "train.epochs: expected an integer ≥ 1, got 2.5"),
    ({"model__mlp__width": True}, "model.mlp.width: expected an integer ≥ 1, got True"),
    ({"measure__repair": True}, "measure.repair: expected one of auto, none, bn, repair, got True"),
    ({"train__seeds": [0, "1"]}, "train.seeds: expected a non-empty list of integers ≥ 0, got [0, '1']"),
    ({"permute__wm": 5}, "permute.wm: expected a block with the keys lap_backend, max_iter, tol, restarts, got 5"),
    ({"permute__identity": 5}, "permute.identity: expected a block with the keys (none), got 5"),
    # out of range
    ({"permute__wm__max_iter": 0}, "permute.wm.max_iter: expected an integer ≥ 1, got 0"),
    ({"train__lr": -1.0}, "train.lr: expected a number > 0, got -1.0"),
    ({"train__momentum": 1.0}, "train.momentum: expected a number in [0, 1), got 1.0"),
    ({"permute__ste__holdout": 1.5}, "permute.ste.holdout: expected a number in [0, 1), got 1.5"),
    ({"measure__gammas": [0, 1.5]}, "measure.gammas: expected a non-empty list of numbers in [0, 1], got [0, 1.5]"),
    ({"measure__repair_samples": 1}, "measure.repair_samples: expected an integer ≥ 2 or null, got 1"),
    ({"three__resolution": 1}, "three.resolution: expected an integer ≥ 2, got 1"),
    ({"data__image_size": 8}, "data.image_size: expected an integer ≥ 28, got 8"),
    ({"permute__wm_sinkhorn__tau": float("inf")}, "permute.wm_sinkhorn.tau: expected a number > 0, got inf"),
    ({"train__seeds": []}, "train.seeds: expected a non-empty list of integers ≥ 0, got []"),
    ({"three__triples": [[0, 1]]}, "three.triples: expected a non-empty list of lists of 3 integers ≥ 0, got [[0, 1]]"),
    (
        {"three__triples": [[0, 1, 2, 2]]},
        "three.triples: expected a non-empty list of lists of 3 integers ≥ 0, got [[0, 1, 2, 2]]",
    ),
    ({"permute__pairs": [[0, 1, 2]]}, "permute.pairs: expected a non-empty list of lists of 2 integers ≥ 0, got"),
    # names not in a registry
    (
        {"data__name": "imagenet21k"},
        "data.name: expected one of mnist5k, mnist, fashion_mnist, cifar10, imagenet, pydoc, text, got 'imagenet21k'",
    ),
    (
        {"model__arch": "transformer"},
        "model.arch: expected one of mlp, vgg, resnet20, resnet50, traced, mixer, vit, gpt, got 'transformer'",
    ),
    (
        {"permute__methods": ["wm", "magic"]},
        "permute.methods: expected a non-empty list of values among identity, wm, am, ste, wm_sinkhorn, ste_sinkhorn, "
        "got ['wm', 'magic']",
    ),
    ({"train__optimizer": "lbfgs"}, "train.optimizer: expected one of adam, sgd, got 'lbfgs'"),
    (
        {"measure__taylor_splits": ["val"]},
        "measure.taylor_splits: expected a non-empty list of values among train, test, got ['val']",
    ),
    ({"device": "tpu"}, "device: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
    # unknown keys (typos) and missing keys
    (
        {"permute__wm__iters": 3},
        "permute.wm.iters: unknown key (set to 3); expected only the keys lap_backend, max_iter, tol, restarts",
    ),
    (
        {"trian": {"epochs": 1}},
        "trian: unknown key (set to {'epochs': 1}); expected only the keys device, threads, data, ",
    ),
    (
        {"model__resnet20__depth": 20},
        "model.resnet20.depth: unknown key (set to 20); expected only the keys width_multiplier, blocks",
    ),
    ({"permute__seed": DELETE}, "permute.seed: missing; expected an integer ≥ 0 (default: 0)"),
    (
        {"permute__am": DELETE},
        "permute.am: missing; expected a block with the keys lap_backend, statistic, batch_size, max_samples "
        "(default: ",
    ),
    # checks that span several keys
    ({"train__seeds": [0, 0, 1, 2]}, "train.seeds: expected no repeated entries, got [0, 0, 1, 2] (0 more than once)"),
    (
        {"permute__pairs": [[0, 1], [0, 1]]},
        "permute.pairs: expected no repeated entries, got [[0, 1], [0, 1]] ([0, 1] more than once)",
    ),
    (
        {"measure__gammas": [0, 0.5, 1, 0.5]},
        "measure.gammas: expected no repeated entries, got [0.0, 0.5, 1.0, 0.5] (0.5 more than once)",
    ),
    (
        {"three__methods": ["wm", "wm"]},
        "three.methods: expected no repeated entries, got ['wm', 'wm'] ('wm' more than once)",
    ),
    (
        {"permute__methods": ["identity", "wm", "am", "wm"]},
        "permute.methods: expected no repeated entries, got ['identity', 'wm', 'am', 'wm']",
    ),
    (
        {"permute__pairs": [[0, 7], [8, 9], [0, 1]]},
        "permute.pairs: expected seeds of train.seeds [0, 1, 2], got [0, 7] ([7] ",
    ),
    (
        {"permute__pairs": [[0, 1], [0, 7]]},
        "permute.pairs: expected seeds of train.seeds [0, 1, 2], got [0, 7] ([7] not trained)",
    ),
    ({"permute__pairs": [[0, 1], [1, 1]]}, "permute.pairs: expected different seeds in each group, got [1, 1]"),
    (
        {"three__triples": [[0, 2, 1]]},
        "three.triples: expected each triple's first two seeds (θa, θb) to be a pair of permute.pairs [[0, 1]] "
        "(connect reuses its alignment), got [0, 2, 1]",
    ),
    (  # one line per key: the repeat, not also the method missing from permute.methods
        {"three__methods": ["wm_sinkhorn", "wm_sinkhorn"]},
        "three.methods: expected no repeated entries, got ['wm_sinkhorn', 'wm_sinkhorn']",
    ),
    (
        {"three__methods": ["wm", "wm_sinkhorn"]},
        "three.methods: expected methods of permute.methods ['identity', 'wm', 'am'] (connect reuses their "
        "θb → θa alignments), got ['wm_sinkhorn'] not among them",
    ),
    (
        {"three__triples": [[0, 1, 9]]},
        "three.triples: expected seeds of train.seeds [0, 1, 2], got [0, 1, 9] ([9] not trained)",
    ),
    (
        {"merge_many__seeds": [0, 5]},
        "merge_many.seeds: expected seeds of train.seeds [0, 1, 2], got [0, 5] ([5] not trained)",
    ),
    ({"merge_many__seeds": [0]}, "merge_many.seeds: expected a list of at least 2 integers ≥ 0, got [0]"),
    (
        {"merge_many__seeds": [0, 1, 0]},
        "merge_many.seeds: expected no repeated entries, got [0, 1, 0] (0 more than once)",
    ),
    ({"train__warmup_epochs": 5}, "train.warmup_epochs must be between 0 and train.epochs (1), got 5"),
    (  # a check of the method's own options model, under the block's keys
        {"permute__ste__select": "holdout", "permute__ste__holdout": 0.0},
        "permute.ste.holdout must be above 0 when permute.ste.select is 'holdout' "
        "(or choose select: best_batch), got 0",
    ),
    (
        {"model__arch": "vgg", "model__vgg__layers": [8, "M", "M", "M", "M", "M", "M"]},
        "model.vgg.layers: 6 max-pools do not fit 32 pixels",
    ),
    (  # the data's own images too, not only 28- and 32-pixel ones: ImageNet's 224-pixel crop
        {"data__name": "imagenet", "model__arch": "vgg"},
        "model.vgg.input_shape: vgg takes images of 28 to 32 pixels a side (padded to 32), got (3, 224, 224)",
    ),
    (
        {
            "data__max_train": 100,
            "permute__methods": ["ste"],
            "three__methods": ["ste"],
            "permute__ste__batch_size": 91,
        },
        "permute.ste.batch_size: expected at most the 90 training samples available, got 91",
    ),
    # MAE pretraining (train.objective: mae) of model.vit
    ({"train__objective": "mae"}, "model.arch: train.objective mae pretrains a ViT: expected vit, got 'mlp'"),
    ({"train__objective": "byol"}, "train.objective: expected one of supervised, lm, mae, got 'byol'"),
    ({"model__arch": "mae"}, "model.arch: expected one of"),
    (
        {"train__objective": "mae", "model__arch": "vit", "model__vit__pool": "mean"},
        "model.vit.pool: an MAE encoder has a class token: expected 'cls', got 'mean'",
    ),
    (
        {"train__objective": "mae", "model__arch": "vit", "train__mae__decoder_width": 30},
        "train.mae.decoder_heads: 4 heads do not divide train.mae.decoder_width 30",
    ),
    (
        {"train__objective": "mae", "model__arch": "vit", "train__optimizer": "sgd"},
        "train.optimizer: train.objective mae needs 'adam', got 'sgd'",
    ),
    (  # one process: the pretraining is not sharded
        {"train__objective": "mae", "model__arch": "vit", "train__nproc_per_node": 2},
        "train.nproc_per_node: train.objective mae needs 1, got 2",
    ),
    (
        {"train__objective": "mae", "model__arch": "vit", "train__mae__mask_ratio": 1.0},
        "train.mae.mask_ratio: expected a number in (0, 1), got 1.0",
    ),
    ({"measure__repair_samples": 1}, "measure.repair_samples: expected"),
    # the data set's kind and the architecture's input
    ({"model__arch": "gpt"}, "model.arch: 'gpt' reads token windows, but data.name 'mnist5k' gives images"),
    (
        {"data__name": "pydoc", "train__objective": "lm"},
        "model.arch: 'mlp' reads images, but data.name 'pydoc' gives token windows",
    ),
    (
        {"data__name": "pydoc", "model__arch": "gpt"},
        "train.objective: data.name 'pydoc' trains with lm (next-token prediction), got 'supervised'",
    ),
    ({"train__objective": "lm"}, "train.objective: data.name 'mnist5k' trains with supervised or mae, got 'lm'"),
    (
        {"data__name": "pydoc", "model__arch": "gpt", "train__objective": "lm", "model__gpt__kv_heads": 3},
        "model.gpt.kv_heads: 3 key/value heads do not divide the 4 heads",
    ),
    ({"data__context": 0}, "data.context: expected an integer ≥ 1, got 0"),
    (
        {"permute__symmetry": "rotation"},
        "permute.symmetry: expected one of permutation, orthogonal, got 'rotation'",
    ),
    (  # the paper's WM is a Sinkhorn search of soft permutations only: refused before any stage runs
        {"permute__symmetry": "orthogonal", "permute__methods": ["identity", "wm", "wm_sinkhorn"]},
        "permute.methods: ['wm_sinkhorn'] seek permutations only; permute.symmetry orthogonal by "
        "('identity', 'wm', 'am', 'ste', 'ste_sinkhorn')",
    ),
    # a researcher's corpus and tokenizer, checked before the download stage reads them
    (
        {"data__name": "text", "model__arch": "gpt", "train__objective": "lm", "data__root": "no/such"},
        "data.root: no/such is not a folder (expected text files or a saved Hugging Face dataset)",
    ),
    (
        {"data__name": "pydoc", "model__arch": "gpt", "train__objective": "lm", "data__tokenizer": "no/tok"},
        "data.tokenizer: no/tok is not a folder (expected a saved tokenizer)",
    ),
]


@pytest.mark.parametrize(("change", "line"), BAD, ids=[" ".join(c) for c, _ in BAD])
def test_a_bad_value_is_one_line_naming_key_value_and_expectation(change: dict, line: str) -> None:
    with pytest.raises(ParamsError) as err:
        check_params(_params(**change))
    assert len(err.value.lines) == 1, err.value.lines
    assert err.value.lines[0].startswith(line)


def test_a_seed_group_holds_exactly_its_number_of_seeds() -> None:
    triples = TypeAdapter(group(3))
    assert triples.validate_python([[0, 1, 2], [3, 4, 5]]) == [[0, 1, 2], [3, 4, 5]]
    assert triples.validate_python([[0, 1, 2]]) == [[0, 1, 2]]  # one group is enough
    for bad in ([], [[0, 1]], [[0, 1, 2, 3]], [[0, 1, -2]]):
        with pytest.raises(ValidationError):
            triples.validate_python(bad)


@pytest.mark.parametrize("repair", ["auto", "none", "repair"])
@pytest.mark.parametrize("method", ["cca", "zipit"])
def test_transform_merges_of_a_headed_net_are_refused_whatever_the_repair(method: str, repair: str) -> None:
    """CCA Merge and ZipIt! mix attention heads through general linear maps: refused on the ViT with the
    default ``repair: auto`` as with an explicit one (the check must not return early on ``auto``)."""
    with pytest.raises(ParamsError) as err:
        check_params(_params(model__arch="vit", merge_many__methods=["merge_many", method], merge_many__repair=repair))
    assert err.value.lines == [
        f"merge_many.methods: [{method!r}] merge through general linear maps, which would mix the attention "
        f"heads of 'vit'; expected methods among ['merge_many', 'c2m3', 'sync', 'star']"
    ]


def test_an_image_architecture_is_built_for_colour_images_too_beside_grey_data(monkeypatch) -> None:
    """``mlp`` declares it builds for any images (its ``SHAPES``): validation builds it for grey digits and for
    3×32×32 colour images whatever the data; a variant that takes grey images only is refused beside MNIST,
    naming the colour shape."""
    from lmclab.archs import mlp

    class GreyOnly(mlp.Config):
        @model_validator(mode="after")
        def _grey(self) -> GreyOnly:
            if self.input_shape[0] != 1:
                raise OptionError(f"{{input_shape}}: grey images only, got {got(self.input_shape)}")
            return self

    monkeypatch.setattr(mlp, "Config", GreyOnly)
    with pytest.raises(ParamsError) as err:
        check_params(_params())
    assert err.value.lines == ["model.mlp.input_shape: grey images only, got (3, 32, 32)"]


def test_a_tokenizer_set_for_image_data_is_not_read() -> None:
    """``data.tokenizer`` is for texts only: beside MNIST a folder that does not exist is no error."""
    check_params(_params(data__tokenizer="no/tok"))


def test_the_checks_of_the_model_and_its_data_yield_each_line_with_its_key() -> None:
    mae = params_model().model_validate(_params(train__objective="mae", model__arch="vit", train__augment="crop_flip"))
    line = "train.augment: MAE pretraining does not augment: expected auto or none, got 'crop_flip'"
    assert list(check_objective(mae)) == [("train.augment", line)]
    lm = {"model__arch": "gpt", "train__objective": "lm", "data__tokenizer": "no/tok"}
    text = params_model().model_validate(_params(data__name="text", data__root="no/such", **lm))
    assert [key for key, _ in check_text_source(text)] == ["data.root", "data.tokenizer"]


def test_a_params_file_that_is_not_a_mapping_is_one_line_showing_it() -> None:
    with pytest.raises(ParamsError) as err:
        check_params([1, 2])
    assert [line.split(",")[0] for line in err.value.lines] == ["params.yaml: expected a block with the keys device"]
    assert err.value.lines[0].endswith(", got [1, 2]")


def test_every_bad_key_gets_its_own_line() -> None:
    with pytest.raises(ParamsError) as err:
        check_params(_params(train__lr="abc", permute__wm__max_iter=0, plot__dpi=None))
    assert [ln.split(":")[0] for ln in err.value.lines] == ["train.lr", "permute.wm.max_iter", "plot.dpi"]


def test_an_integer_where_a_number_belongs_is_fine() -> None:
    check_params(_params(train__lr=1, permute__wm__tol=0, three__margin=1, measure__gammas=[0, 1]))


def test_the_schema_defaults_are_the_repository_params() -> None:
    params_yaml = load_yaml(ROOT / "params.yaml")
    assert defaults() == params_yaml
    check_params(params_yaml)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_block_lists_exactly_the_options_its_search_takes(method: str) -> None:
    takes = inspect.signature(METHODS[method]).parameters
    accepted = [p for p in takes if p in METHODS[method].options.model_fields]
    assert (
        list(params_model().model_fields["permute"].annotation.model_fields[method].annotation.model_fields) == accepted
    )
    assert accepted == list(METHODS[method].options.model_fields)


def test_mae_pretraining_of_the_vit_is_valid() -> None:
    check_params(_params(train__objective="mae", model__arch="vit"))


def test_the_mae_block_lists_exactly_the_mae_config_fields_the_vit_does_not_give() -> None:
    given = ("input_shape", "num_classes", "pool", *mae.ENCODER_KEYS)
    fields = [name for name in mae.Config.model_fields if name not in given]
    assert list(params_model().model_fields["train"].annotation.model_fields["mae"].annotation.model_fields) == fields
    assert set(mae.ENCODER_KEYS) <= set(vit.Config.model_fields)


@pytest.mark.parametrize("arch", sorted(a for a, m in ARCHS.items() if not interface(m).OBJECTIVE))
def test_each_architecture_block_lists_exactly_its_config_fields(arch: str) -> None:
    config = ARCHS[arch].Config
    fields = [name for name in config.model_fields if name not in ("input_shape", "num_classes")]
    block = params_model().model_fields["model"].annotation.model_fields[arch].annotation
    assert issubclass(block, Block) and list(block.model_fields) == fields
    for name in fields:  # the library's one definition: its meaning and range, only the default may differ
        assert block.model_fields[name].description == config.model_fields[name].description
        assert block.model_fields[name].metadata == config.model_fields[name].metadata


def test_every_key_has_a_meaning() -> None:
    assert all(meaning for _, _, _, meaning in key_rows())


def test_a_key_declared_without_a_meaning_has_an_empty_one_in_the_table() -> None:
    """What the test above catches in params.yaml's schema, in a block of its own: no text is made up."""

    class Bare(Block):
        count: int = 2

    assert [(key, default, meaning) for key, default, _, meaning in key_rows(Bare, "x.")] == [("x.count", 2, "")]


def test_the_docs_parameter_table_is_the_schemas() -> None:
    """Regenerate with `python tools/params_table.py` after changing the schema."""
    from params_table import PAGE, with_table

    page = (ROOT / "docs" / "parameters.md").read_text()
    assert PAGE == ROOT / "docs" / "parameters.md"
    assert with_table(page) == page


def _comment(start: str, following: int) -> set[str]:
    """The words of the comment on params.yaml's first line starting ``start`` and on the ``following`` lines."""
    lines = (ROOT / "params.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    return set(re.findall(r"[a-z_0-9]+", " ".join(line.split("#", 1)[1] for line in lines[at : at + following + 1])))


@pytest.mark.parametrize(
    ("start", "following", "registry"),
    [
        ("arch:", 0, lambda: [a for a, m in ARCHS.items() if not interface(m).OBJECTIVE]),
        ("name:", 2, lambda: [*LOADERS, *FOLDER_LOADERS, *TEXTS]),
        ("methods: [merge_many", 3, lambda: list(MANY_METHODS)),
    ],
)
def test_params_yaml_comments_name_every_registered_choice(start: str, following: int, registry) -> None:
    """The comments that list a registry's names by hand (model.arch, data.name, merge_many.methods) list all."""
    missing = [name for name in registry() if name not in _comment(start, following)]
    assert not missing, f"params.yaml's comment on {start} does not name {missing}"
