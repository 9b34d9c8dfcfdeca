"""lmclab's public Python API, re-exported from :mod:`lmclab`: align two models by the permutation
symmetries of their hidden units, merge them, and measure the path between them.

    res   = lmclab.find_permutation(model_a, model_b, method="wm", example_inputs=x)
    pi_b  = lmclab.apply_permutation(res.spec, res.perm, model_b.state_dict())
    curve = lmclab.curve(model_a, pi_b, data=test_loader, lams=11)
    print(curve.barrier(), lmclab.l2_reduction(model_a, model_b, res))
"""

from lmclab.api.curves import Curve, curve
from lmclab.api.functions import Alignment, apply_permutation, find_permutation, l2_reduction, merge
from lmclab.api.inputs import as_split, pairs
from lmclab.api.many import ManyMerge, merge_many, repair

__all__ = [
    "Alignment",
    "Curve",
    "ManyMerge",
    "apply_permutation",
    "as_split",
    "curve",
    "find_permutation",
    "l2_reduction",
    "merge",
    "merge_many",
    "pairs",
    "repair",
]
