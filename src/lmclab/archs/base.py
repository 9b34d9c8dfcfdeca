"""What every architecture's config shares: an options model (:class:`lmclab.core.options.Options`) whose
fields are the architecture's own options — type, range, library default and meaning, written once — plus
the two the data gives, ``input_shape`` and ``num_classes`` (:data:`DATA_FIELDS`). The pipeline's block
``model.<arch>`` is the model's other fields (``lmclab.pipeline.schema``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from lmclab.core.options import Count, OptionError, Options, option


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
