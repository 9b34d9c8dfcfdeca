"""Any ``nn.Module`` an importable factory builds, with its permutation spec derived by tracing
(``lmclab.trace``): ``model.arch: traced`` with ``model.traced.factory`` = ``module:callable``
(e.g. ``torchvision.models:resnet18``, an installed package's, or the repository's own file:
``nets.mine:build`` for ``nets/mine.py``; list that file under the train stage's deps in dvc.yaml so
that editing it retrains). Attention gives headed groups (:mod:`lmclab.trace.attention`), e.g.
``torchvision.models:vit_b_16`` with ``kwargs: {image_size: 32}`` on 3 × 32 × 32 inputs.

The factory is called with ``model.traced.kwargs``, plus ``num_classes`` when it takes that keyword
and the kwargs do not set it. ``in_channels`` is the number of input channels the network expects:
a data set with one channel (the digits) is repeated over them (null: the data's own). Activation
matching reads, per group, the norms after the layers that write it (or those layers: pre-activation).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import torch
from pydantic import BeforeValidator, model_validator
from torch import Tensor, nn

from lmclab.archs.base import ArchConfig
from lmclab.core.options import Count, OptionError, escaped, got, option
from lmclab.core.spec import PermutationSpec

SHAPES = "data"  # built for the data's own shape only (lmclab.archs.base.Interface)
TRACED = True  # its spec is traced from the module: validation traces it, which is the check

Scalar = int | float | str | bool | None


def _sorted_pairs(kwargs: Any) -> Any:
    """A mapping of keyword arguments as sorted ``(name, value)`` pairs (lists as tuples): hashable, so the
    traced spec is cached per config."""
    items = kwargs.items() if isinstance(kwargs, dict) else kwargs
    if not isinstance(items, tuple | list | type({}.items())) or not all(
        isinstance(i, tuple | list) and len(i) == 2 for i in items
    ):
        raise ValueError(f"expected a mapping of names to numbers, strings, booleans or null, got {kwargs!r}")
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items))


class Config(ArchConfig):
    """The factory, its keyword arguments and the channels it expects."""

    factory: str = option(
        "torchvision.models:resnet18",
        "module:callable building the nn.Module (spec derived by torch.fx tracing, src/lmclab/trace/)",
    )
    kwargs: Annotated[tuple[tuple[str, Scalar | tuple[Scalar, ...]], ...], BeforeValidator(_sorted_pairs)] = option(
        {},
        "keyword arguments of the factory (num_classes is added when it takes it)",
        expected="a mapping of names to numbers, strings, booleans or null",
        validate_default=True,
    )
    in_channels: Count | None = option(
        None, "input channels the network expects; the data's are repeated (null: the data's own)"
    )
    partial: bool = option(False, "leave what tracing cannot prove unpermuted instead of refusing")

    @model_validator(mode="after")
    def _factory_imports(self) -> Config:
        load_factory(self.factory)
        if self.in_channels is not None and self.in_channels % self.input_shape[0]:
            raise OptionError(
                f"{{in_channels}}: {self.in_channels} is not a multiple of the data's {self.input_shape[0]} channel(s)"
            )
        return self


def load_factory(factory: str) -> Callable[..., nn.Module]:
    """``module:callable`` imported; a one-line :class:`OptionError` naming ``factory`` otherwise."""
    module_name, _, attr = factory.partition(":")
    if not module_name or not attr:
        raise OptionError(f"{{factory}}: expected 'module:callable', got {got(factory)}")
    try:
        built = getattr(_import(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise OptionError(f"{{factory}}: cannot import {got(factory)} ({escaped(exc)})") from None
    if not callable(built):
        raise OptionError(f"{{factory}}: {got(factory)} is not callable")
    return built


def _import(module_name: str) -> ModuleType:
    """An installed module, else the repository's own file ``a/b.py`` for ``a.b`` (stages run in the
    repository's root, which is not on the path of ``python stages/….py``)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError:
        path = Path(*module_name.split(".")).with_suffix(".py")
        if not path.is_file():
            raise
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        return sys.modules[module_name]


class Model(nn.Module):
    """The factory's network as ``self.net`` (state_dict keys ``net.…``)."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        factory, kwargs = load_factory(config.factory), dict(config.kwargs)
        takes = inspect.signature(factory).parameters
        if "num_classes" not in kwargs and (
            "num_classes" in takes or any(p.kind is p.VAR_KEYWORD for p in takes.values())
        ):
            kwargs["num_classes"] = config.num_classes
        try:
            self.net = factory(**kwargs)
        except (TypeError, ValueError) as exc:
            raise OptionError(
                f"{{config}}: {escaped(config.factory)}(**{escaped(kwargs)}) failed: {escaped(exc)}"
            ) from None
        if not isinstance(self.net, nn.Module):
            raise OptionError(
                f"{{factory}}: {got(config.factory)} returned {type(self.net).__name__}, not an nn.Module"
            )
        self.repeat = (config.in_channels or config.input_shape[0]) // config.input_shape[0]

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.repeat(1, self.repeat, 1, 1) if self.repeat > 1 else x)


@lru_cache(maxsize=8)
def _traced(config: Config) -> Any:
    from lmclab.trace import trace

    return trace(Model(config), torch.zeros(2, *config.input_shape), partial=config.partial)


def permutation_spec(config: Config) -> PermutationSpec:
    """Derived by tracing the model on a zero batch of the data's shape (cached per config)."""
    return _traced(config).spec


def activation_points(config: Config) -> dict[str, list[str]]:
    return _traced(config).points
