"""What lmclab knows by name — its pair methods, its n-model methods, its architectures — and a registered
architecture built from its config, for the API (the pipeline's ``permute.methods``, ``merge_many.methods`` and
``model.arch`` take the same names).

>>> import lmclab
>>> "wm_sinkhorn" in lmclab.METHODS and "c2m3" in lmclab.MANY_METHODS and "mlp" in lmclab.ARCHITECTURES
True
>>> net = lmclab.create_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=16, seed=0)
>>> [tuple(p.shape) for p in net.parameters()][:2]
[(16, 784), (16,)]
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lmclab.archs import ARCHS, build_model, make_config
from lmclab.core.options import keyed_errors
from lmclab.search import METHODS as _METHODS
from lmclab.search.many_methods import MANY_METHODS as _MANY

METHODS: tuple[str, ...] = tuple(_METHODS)  # the pair methods of find_permutation(method=)
MANY_METHODS: tuple[str, ...] = tuple(_MANY)  # the n-model methods of merge_many(method=)
ARCHITECTURES: tuple[str, ...] = tuple(ARCHS)  # the registered architectures of create_model


def create_model(arch: str, *, seed: int | None = None, **config: Any) -> nn.Module:
    """The module of the registered architecture ``arch`` (one of :data:`ARCHITECTURES`) with the config
    ``config`` — the data's ``input_shape`` and ``num_classes`` and the architecture's own options, as
    params.yaml's ``model.<arch>`` block names them — initialised from ``seed`` alone (None: the global
    generator). One ``ValueError`` line naming the option otherwise."""
    with keyed_errors(lambda name: "arch" if name == "arch" else name):
        return build_model(arch, make_config(arch, **config), seed=seed)
