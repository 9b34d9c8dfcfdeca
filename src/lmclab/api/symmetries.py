"""Which symmetry an alignment seeks, and whether the model and method allow it: the permutations of hidden
units (the paper's), or orthogonal maps of every group the tracer proves may take one (Theus et al. 2025)."""

from __future__ import annotations

import dataclasses

from lmclab.api.inputs import Problem
from lmclab.core.canonical import shared_parameters
from lmclab.core.options import OptionError, got
from lmclab.core.orthogonal import SYMMETRIES
from lmclab.core.spec import PermutationSpec

# the methods that seek orthogonal maps (Procrustes steps, lmclab.core.orthogonal; STE's projections are WM's), and
# the identity, an element of every group (the naive baseline in the canonical form)
ORTHOGONAL_METHODS = ("identity", "wm", "am", "ste", "ste_sinkhorn")


def check_symmetry(symmetry: str, method: str, seekers: tuple[str, ...] = ORTHOGONAL_METHODS) -> None:
    """One line naming ``symmetry`` or ``method`` unless ``method`` (one of ``seekers`` for orthogonal maps) seeks
    elements of that kind."""
    if symmetry not in SYMMETRIES:
        raise OptionError(f"{{symmetry}}: expected one of {SYMMETRIES}, got {got(symmetry)}")
    if symmetry == "orthogonal" and method not in seekers:
        raise OptionError(f"{{method}}: {got(method)} seeks permutations only; {{symmetry}} orthogonal by {seekers}")


def in_symmetry(problem: Problem, symmetry: str, what: str) -> Problem:
    """``problem`` with its spec's kinds for ``symmetry``: none for ``"permutation"`` (the gains a spec folds stay
    folded); for ``"orthogonal"``, one line naming ``symmetry`` when no group may take an orthogonal map, or when
    the group on the most tensors (the stream) may not because two entries are one tensor (a tied head: the
    copies :func:`lmclab.canonicalize` returns are untied); and for ``"permutation"`` a spec with a rotary group (no
    permutation inside its heads keeps the function: such heads move whole in the spec traced for permutations)."""
    if symmetry == "permutation":
        if rotary := sorted(g for g, kind in problem.spec.kinds.items() if kind == "rotary"):
            raise OptionError(f"{{spec}}: group {rotary[0]!r} is rotary, which no permutation inside its heads keeps")
        return problem._replace(spec=dataclasses.replace(problem.spec, kinds={}))
    kinds = problem.spec.kinds
    shared = shared_parameters(problem.model) if problem.model is not None else []
    if not kinds or (shared and _widest(problem.spec) not in kinds):
        names = " and ".join(map(repr, shared[0])) if shared else ""
        tied = f"; {names} are one tensor: align the untied copies lmclab.canonicalize returns" if shared else ""
        proved = f"no group of {what} orthogonal" if not kinds else f"{len(kinds)} groups of {what} orthogonal, but"
        raise OptionError(f"{{symmetry}}: the tracer proves {proved}{_why_not(problem.spec, bool(kinds))}{tied}")
    return problem


def _widest(spec: PermutationSpec) -> str | None:
    """The group on the most tensors (a residual stream)."""
    groups = spec.groups
    return max(groups, key=lambda g: len(groups[g])) if groups else None


def _why_not(spec: PermutationSpec, some: bool = False) -> str:
    """Why the group on the most tensors (a residual stream) is no orthogonal group, as the trace recorded it
    (``some``: other groups are)."""
    widest = _widest(spec)
    if widest is None:
        return ": it has no group of units"
    if widest not in spec.kind_reasons:  # a spec given, or traced for permutations only
        return " (the spec marks none: trace_spec(..., symmetry='orthogonal') marks those it proves)"
    lead = " " if some else "; "
    return f"{lead}{widest}, the group on the most tensors, stays a permutation group: {spec.kind_reasons[widest]}"
