"""What every permutation search returns."""

from __future__ import annotations

from typing import Any, NamedTuple

from lmclab.core.spec import Permutation


class SearchResult(NamedTuple):
    perm: Permutation  # group -> index tensor; π(θb) = apply_permutation(spec, perm, θb)
    stats: dict[str, Any]  # JSON-able: at least "seconds"; iterative methods add traces
