"""lmclab: linear mode connectivity and permutation-based model merging.

The public API (:mod:`lmclab.api`) is re-exported here lazily: ``lmclab.find_permutation`` imports
it on first use, so ``import lmclab.core.spec`` (and every pipeline stage) loads only what it uses.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
API = (
    "ARCHITECTURES",
    "Alignment",
    "Curve",
    "MANY_METHODS",
    "METHODS",
    "ManyMerge",
    "PermutationSpec",
    "align",
    "apply_permutation",
    "as_split",
    "canonicalize",
    "create_model",
    "curve",
    "find_permutation",
    "l2_reduction",
    "load_alignment",
    "merge",
    "merge_folders",
    "merge_many",
    "pairs",
    "repair",
    "trace_spec",
)
__all__ = [*API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in API:
        import importlib

        return getattr(importlib.import_module("lmclab.api"), name)
    raise AttributeError(f"module 'lmclab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
