"""What every architecture's config shares: an options model (:class:`lmclab.core.options.Options`) whose
fields are the architecture's own options — type, range, library default and meaning, written once — plus
the two the data gives, ``input_shape`` and ``num_classes`` (:data:`DATA_FIELDS`). The pipeline's block
``model.<arch>`` is the model's other fields (``lmclab.pipeline.schema``)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType, UnionType
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin, get_type_hints

from pydantic import BeforeValidator, Field

from lmclab.core.options import Count, OptionError, Options, got, option


def as_tuple(value: Any) -> Any:
    """A list (YAML, JSON) as the tuple a frozen, hashable config holds."""
    return tuple(value) if isinstance(value, list) else value


def tuple_of(item: Any, min_length: int = 1) -> Any:
    """A tuple of ``item`` (a list is accepted and turned into one), at least ``min_length`` long."""
    return Annotated[tuple[item, ...], BeforeValidator(as_tuple), Field(min_length=min_length)]


Shape = Annotated[tuple[Count, Count, Count], BeforeValidator(as_tuple)]
DATA_FIELDS = ("input_shape", "num_classes")  # given by the data set, not by the architecture's options


class ArchConfig(Options):
    """An architecture's config: the data's ``input_shape`` (C, H, W) and ``num_classes``, then its options."""

    input_shape: Shape = option(..., "(channels, height, width) of one input")
    num_classes: Annotated[int, Field(ge=0)] = option(..., "classes of the output layer (0: an encoder's, unused)")


def check_patches_tile(input_shape: tuple[int, int, int], patch_size: int) -> None:
    """A one-line :class:`OptionError` naming ``patch_size`` unless square patches of that side tile the image."""
    if any(side % patch_size for side in input_shape[1:]):
        raise OptionError(f"{{patch_size}}: {patch_size} does not divide the image {input_shape[1]} × {input_shape[2]}")


class Interface(NamedTuple):
    """What code outside an architecture module reads of it, beyond the required ``Config``, ``Model``,
    ``permutation_spec(config)`` and ``activation_points(config)`` (:data:`REQUIRED`): each member a module may
    set at its top level, with the default a module that does not set it gets (:func:`interface`)."""

    INPUT: Literal["images", "tokens"] = "images"  # what it reads: images, or windows of token ids (a text)
    OBJECTIVE: str | None = None  # a train.objective that reaches it instead of model.arch (mae)
    PRETRAINING_KEYS: tuple[str, ...] = ()  # the train.<objective> block's keys among its Config's fields
    SHAPES: Literal["images", "data"] = "images"  # images: builds on 1×28×28 and 3×32×32 alike; data: the data's only
    TRACED: bool = False  # its spec comes from tracing the module: validation traces it (the check)
    circuit_config: Callable | None = None  # the config of its model of heads twice as wide (circuit space)


REQUIRED = ("Config", "Model", "permutation_spec", "activation_points")


def interface(module: ModuleType) -> Interface:
    """The :class:`Interface` ``module`` declares (its top-level members of those names, the defaults
    otherwise); an ``OptionError`` naming the module when it lacks one of :data:`REQUIRED` or sets a member
    of the wrong kind."""
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise OptionError(f"{{arch}}: {module.__name__} lacks {got(missing)} of an architecture")
    found = Interface(**{name: getattr(module, name) for name in Interface._fields if hasattr(module, name)})
    hints = get_type_hints(Interface)
    for name in Interface._fields:
        if not _fits(getattr(found, name), hints[name]):
            raise OptionError(f"{{arch}}: {module.__name__}.{name} = {got(getattr(found, name))} is not {hints[name]}")
    return found


def _fits(value: Any, hint: Any) -> bool:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return value in args
    if origin in (Union, UnionType):
        return any(_fits(value, a) for a in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(isinstance(v, args[0]) for v in value)
    return value is None if hint is type(None) else isinstance(value, hint)
