"""The naive baseline ("w/o" in the paper's tables): θb is merged as it is, π = identity."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmclab.core.options import Options, takes
from lmclab.core.spec import PermutationSpec, identity_permutation
from lmclab.search.result import SearchResult


class IdentityOptions(Options):
    """identity (the naive "w/o" baseline) takes no options"""


@takes(IdentityOptions)
def identity(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], *, options: IdentityOptions
) -> SearchResult:
    """No permutation: every group's identity (sizes read from ``params_a``)."""
    return SearchResult(identity_permutation(spec.group_sizes(params_a)), {"seconds": 0.0})
