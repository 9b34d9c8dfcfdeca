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
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.core.options import OptionError, escaped, got
from lmclab.core.spec import PermutationSpec


@dataclass(frozen=True)
class Config:
    input_shape: tuple[int, int, int]
    num_classes: int
    factory: str = "torchvision.models:resnet18"
    kwargs: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs: hashable, so specs are cached
    in_channels: int | None = None
    partial: bool = False

    def __post_init__(self) -> None:
        items = self.kwargs.items() if isinstance(self.kwargs, dict) else self.kwargs
        object.__setattr__(
            self, "kwargs", tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items))
        )
        load_factory(self.factory)
        if self.in_channels is not None and self.in_channels % self.input_shape[0]:
            raise OptionError(
                f"{{in_channels}}: {self.in_channels} is not a multiple of the data's {self.input_shape[0]} channel(s)"
            )


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
