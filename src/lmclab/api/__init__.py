"""lmclab's public Python API, re-exported from :mod:`lmclab`: align two models by the permutation
symmetries of their hidden units, merge them, and measure the path between them.

    res   = lmclab.find_permutation(model_a, model_b, method="wm", example_inputs=x)
    curve = lmclab.curve(model_a, model_b, alignment=res, eval_data=test_loader, num_lambdas=11)
    print(curve.barrier(), lmclab.l2_reduction(model_a, model_b, res))
    res.save("perm.pt"); res = lmclab.load_alignment("perm.pt")
    rot   = lmclab.align(model_a, model_b, symmetry="orthogonal", example_inputs=x)  # orthogonal maps of streams
"""

from lmclab.api.alignment import Alignment, apply_permutation, load_alignment
from lmclab.api.curves import Curve, curve
from lmclab.api.functions import align, canonicalize, find_permutation, l2_reduction, merge
from lmclab.api.inputs import as_split, pairs
from lmclab.api.many import ManyMerge, merge_many, repair
from lmclab.api.registry import ARCHITECTURES, MANY_METHODS, METHODS, create_model
from lmclab.api.streamed import merge_folders
from lmclab.core.spec import PermutationSpec
from lmclab.trace import trace_spec

__all__ = [
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
]
