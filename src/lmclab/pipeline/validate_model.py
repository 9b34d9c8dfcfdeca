"""The checks of ``lmclab.pipeline.validate`` that tie the data set to the model: the data set is of the kind
the architecture reads (token windows for a language model, images for the others), the training objective
fits both, and the chosen architecture's config builds for the data's input shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmclab.archs import circuit_model, get_arch, make_config
from lmclab.archs.base import interface
from lmclab.archs.mae import from_vit
from lmclab.core.corpus import load_tokenizer, source_kind
from lmclab.core.options import OptionError
from lmclab.core.text import TEXTS
from lmclab.pipeline.schema import LANGUAGE, Params
from lmclab.pipeline.stage import model_key

Problems = Iterator[tuple[str, str]]


MAE_FIXED = {"optimizer": "adam", "mixup_alpha": 0.0, "precision": "fp32", "nproc_per_node": 1, "nnodes": 1}


def check_objective(p: Params) -> Problems:
    """``train.objective: lm`` trains on a text and a text is trained with it; ``train.objective: mae``
    pretrains ``model.vit`` (class-token pooling) with the decoder of ``train.mae`` in one fp32 process with
    AdamW, without augmentation or mixup."""
    if (p.train.objective == LANGUAGE) != (p.data.name in TEXTS):
        want = f"{LANGUAGE} (next-token prediction)" if p.data.name in TEXTS else "supervised or mae"
        line = f"data.name {p.data.name!r} trains with {want}, got {p.train.objective!r}"
        yield "train.objective", f"train.objective: {line}"
        return
    if p.train.objective != "mae":
        return
    if p.model.arch != "vit":
        yield "model.arch", f"model.arch: train.objective mae pretrains a ViT: expected vit, got {p.model.arch!r}"
        return
    for name, value in MAE_FIXED.items():
        if getattr(p.train, name) != value:
            yield (
                f"train.{name}",
                (f"train.{name}: train.objective mae needs {value!r}, got {getattr(p.train, name)!r}"),
            )
    if p.train.augment not in ("auto", "none"):
        yield (
            "train.augment",
            f"train.augment: MAE pretraining does not augment: expected auto or none, got {p.train.augment!r}",
        )
    try:
        vit = make_config("vit", input_shape=input_shape_of(p), num_classes=10, **p.model.vit.model_dump())
        from_vit(vit, **p.train.mae.model_dump())
    except OptionError as err:
        yield "train.mae", err.keyed(lambda name: {"pool": "model.vit.pool"}.get(name, f"train.mae.{name}"))
    except ValueError:  # the ViT's own options: check_architecture names them
        return


def _reads_tokens(arch: str) -> bool:
    """Whether architecture ``arch`` reads token windows (its ``INPUT``), not images."""
    return interface(get_arch(arch)).INPUT == "tokens"


def check_data_kind(p: Params) -> Problems:
    """A text (token windows) feeds a language model, images every other architecture."""
    text, tokens = p.data.name in TEXTS, _reads_tokens(p.model.arch)
    if text != tokens:
        reads, gives = ("token windows", "images") if tokens else ("images", "token windows")
        yield "model.arch", f"model.arch: {p.model.arch!r} reads {reads}, but data.name {p.data.name!r} gives {gives}"


def check_text_source(p: Params) -> Problems:
    """``data.name: text`` reads a corpus in ``data.root`` (text files or a saved dataset) and a set
    ``data.tokenizer`` is a folder transformers loads a tokenizer from: both checked before any stage reads."""
    for name, check, value in (
        ("root", source_kind, p.data.root if p.data.name == "text" else None),
        ("tokenizer", load_tokenizer, p.data.tokenizer if p.data.name in TEXTS else None),
    ):
        if value is not None:
            try:
                check(Path(value))
            except OptionError as err:
                yield f"data.{name}", err.keyed(lambda n: f"data.{n}")


def input_shape_of(p: Params) -> tuple[int, ...]:
    """The input shape ``data.name`` prepares (grey 28-pixel digits, CIFAR's 32-pixel colour, ImageNet's crop,
    a text's windows of ``data.context`` tokens)."""
    if p.data.name in TEXTS:
        return (p.data.context,)
    if p.data.name == "cifar10":
        return (3, 32, 32)
    return (3, p.data.image_size, p.data.image_size) if p.data.name == "imagenet" else (1, 28, 28)


def check_architecture(p: Params) -> Problems:
    """The chosen architecture's config builds for the data set's own shape and, unless the architecture
    builds for that shape only (its ``SHAPES``: a ViT's patches must tile the image), for 1×28×28 and 3×32×32
    images too (e.g. VGG's pools fit); an architecture whose spec is traced (``TRACED``) is traced: that is
    the check."""
    arch = p.model.arch
    if (p.data.name in TEXTS) != _reads_tokens(arch):  # check_data_kind says so
        return
    options, declared = getattr(p.model, arch).model_dump(), interface(get_arch(arch))
    shapes = [(1, 28, 28), (3, 32, 32)] if declared.SHAPES == "images" else []
    for shape in dict.fromkeys([*shapes, input_shape_of(p)]):  # ImageNet's crop is neither of the two
        try:
            config = make_config(arch, input_shape=shape, num_classes=10, **options)
            if declared.TRACED:  # tracing is the check: a graph it cannot follow is refused here
                get_arch(arch).permutation_spec(config)
        except OptionError as err:  # the library names the config's fields: here, their keys
            yield f"model.{arch}", err.keyed(model_key(arch))
            return
        except ValueError as exc:  # the line names the key (a tracer's refusal does not itself)
            yield f"model.{arch}", f"model.{arch}: {exc}"
            return


def check_circuits(p: Params) -> Problems:
    """``measure.circuits`` needs the architecture's model of heads twice as wide
    (:func:`lmclab.archs.circuit_model`), built from the chosen config before any stage runs."""
    if not p.measure.circuits:
        return
    arch, options = p.model.arch, getattr(p.model, p.model.arch).model_dump()
    try:
        circuit_model(arch, make_config(arch, input_shape=input_shape_of(p), num_classes=10, **options))
    except OptionError as err:
        yield "measure.circuits", err.keyed(lambda name: f"measure.{name}")
