"""Group elements of either kind: permutations of hidden units and orthogonal maps of them.

A group of a :class:`~lmclab.core.spec.PermutationSpec` is of kind ``permutation`` (the paper's Section 2)
or ``orthogonal``: an orthogonal matrix ``O`` (``n × n``, ``OᵀO = I``) acts on its ``n`` units, which keeps
the function wherever every operation on the units commutes with rotations (linear reads and writes,
residual adds, norms whose gains are folded into their readers; Theus et al. 2025, Section 3); or of kind
``centred``: an orthogonal ``O`` that fixes the all-ones vector (``O1 = 1``), which commutes with LayerNorm's
centring too (``mean(Ox) = mean(x)`` and ``Ox − μ1 = O(x − μ1)``). Every permutation is centred. Permutations
are the orthogonal maps with one 1 per row, so both kinds act the same way on a tensor: the group's
element multiplies every axis the group appears on, ``W' = O W Oᵀ`` for a weight that reads and writes the
units (``W'_ℓ = P_ℓ W_ℓ P_{ℓ-1}ᵀ`` for a permutation), ``E' = E Oᵀ`` for an embedding that writes them along
its last axis. A permutation ``perm`` is kept as its index tensor (``perm[i]`` = the unit of θb that lands
on unit ``i``), the matrix ``P`` with ``P[i, perm[i]] = 1``; an orthogonal element as its matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

KINDS = ("permutation", "centred", "orthogonal", "rotary")  # each of the first three a subgroup of the next
MATRIX_KINDS = ("centred", "orthogonal", "rotary")  # rotary: of headed groups only (lmclab.core.heads)
SYMMETRIES = ("permutation", "orthogonal")  # what a search seeks: permutations, or the largest kind proved


def is_matrix(element: Tensor) -> bool:
    """True for an orthogonal element (a matrix), False for a permutation (an index tensor)."""
    return element.dim() == 2


def as_matrix(element: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
    """The matrix of ``element``: ``P[i, perm[i]] = 1`` for an index tensor, the matrix itself otherwise."""
    if is_matrix(element):
        return element.to(dtype)
    return torch.eye(len(element), dtype=dtype, device=element.device)[element]


def act(value: Tensor, axis: int, element: Tensor, block: int = 1) -> Tensor:
    """``element`` applied to the units along ``axis`` of ``value`` (each unit ``block`` consecutive
    entries): ``value[perm[i]]`` per unit for an index tensor, ``Σ_j O[i, j] value[j]`` for a matrix."""
    if not is_matrix(element):
        index = (element.to(value.device)[:, None] * block + torch.arange(block, device=value.device)).reshape(-1)
        return value.index_select(axis, index)
    moved = value.movedim(axis, 0)
    rows = moved.reshape(moved.shape[0] // block, -1)  # (units, block · other axes)
    dtype = torch.promote_types(value.dtype, element.dtype)  # float64 maps keep float32 weights exact to rounding
    mixed = element.to(device=value.device, dtype=dtype) @ rows.to(dtype)
    return mixed.to(value.dtype).reshape(moved.shape).movedim(0, axis)


def inverse(element: Tensor) -> Tensor:
    """``element⁻¹``: the argsort of an index tensor, the transpose of an orthogonal matrix."""
    return element.T.contiguous() if is_matrix(element) else torch.argsort(element)


def composed(outer: Tensor, inner: Tensor) -> Tensor:
    """The element that applies ``inner`` first, then ``outer`` (``inner[outer]`` for two index tensors,
    ``O_outer · O_inner`` once either is a matrix)."""
    if not is_matrix(outer) and not is_matrix(inner):
        return inner[outer]
    dtypes = [e.dtype for e in (outer, inner) if is_matrix(e)]
    dtype = torch.promote_types(dtypes[0], dtypes[-1])
    return as_matrix(outer, dtype) @ as_matrix(inner, dtype)


def random_orthogonal(n: int, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Tensor:
    """An orthogonal ``n × n`` matrix drawn from the Haar measure (the QR factor of a Gaussian matrix with
    the signs of ``R``'s diagonal moved into ``Q``; Mezzadri 2007)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def polar(cost: Tensor) -> Tensor:
    """``argmax_O ⟨O, C⟩`` over orthogonal ``O``: the polar factor ``U Vᵀ`` of ``C = U S Vᵀ`` (orthogonal
    Procrustes; Schönemann 1966). It is weight matching's step for an orthogonal group, as the assignment
    ``argmax_P ⟨P, C⟩`` is for a permutation."""
    u, _, vh = torch.linalg.svd(cost.to(torch.float64))
    return u @ vh


def check_orthogonal(group: str, element: Tensor, n: int, atol: float = 1e-6) -> None:
    """One-line error unless ``element`` is an ``n × n`` orthogonal matrix (``‖OᵀO − I‖_max ≤ atol``)."""
    if element.shape != (n, n) or not element.is_floating_point():
        raise ValueError(f"group {group!r}: expected an orthogonal {n}×{n} matrix, got shape {tuple(element.shape)}")
    gram = element.to(torch.float64).T @ element.to(torch.float64)
    error = float((gram - torch.eye(n, dtype=torch.float64, device=element.device)).abs().max()) if n else 0.0
    if not error <= atol:
        raise ValueError(f"group {group!r}: the matrix is not orthogonal (max |OᵀO − I| = {error:.2g} > {atol})")


def ones_basis(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """A symmetric orthogonal ``H`` whose first column is ``1/√n`` (the Householder reflection that maps ``e_1``
    onto it): ``O = H diag(1, Q) H`` is centred for every orthogonal ``Q`` of size ``n − 1``, and every centred
    ``O`` is of that form."""
    u = torch.full((n,), n**-0.5, dtype=dtype)
    v = -u
    v[0] += 1.0
    norm = float(v @ v)
    return torch.eye(n, dtype=dtype) - (2.0 / norm) * torch.outer(v, v) if norm > 1e-30 else torch.eye(n, dtype=dtype)


def centred_of(q: Tensor) -> Tensor:
    """The centred map ``H diag(1, Q) H`` of an orthogonal ``Q`` on the complement of the all-ones vector."""
    n = q.shape[0] + 1
    h, inner = ones_basis(n), torch.eye(n, dtype=torch.float64)
    inner[1:, 1:] = q
    return h @ inner @ h


def random_centred(n: int, generator: torch.Generator) -> Tensor:
    """A Haar-random centred map: ``H diag(1, Q) H`` with ``Q`` Haar-random of size ``n − 1``."""
    return centred_of(random_orthogonal(n - 1, generator))


def polar_centred(cost: Tensor) -> Tensor:
    """``argmax_O ⟨O, C⟩`` over centred ``O``: ``⟨H diag(1, Q) H, C⟩ = M₀₀ + ⟨Q, M₁₁⟩`` with ``M = H C H``, so
    ``Q`` is the polar factor of ``M``'s lower-right block (:func:`polar`)."""
    h = ones_basis(cost.shape[0])
    m = h @ cost.to(torch.float64) @ h
    return centred_of(polar(m[1:, 1:]))


def check_centred(group: str, element: Tensor, n: int, atol: float = 1e-6) -> None:
    """:func:`check_orthogonal`, and one line unless ``element`` fixes the all-ones vector."""
    check_orthogonal(group, element, n, atol)
    ones = torch.ones(n, dtype=torch.float64, device=element.device)
    error = float((element.to(torch.float64) @ ones - ones).abs().max()) if n else 0.0
    if not error <= atol:
        raise ValueError(f"group {group!r}: the matrix moves the all-ones vector (max |O1 − 1| = {error:.2g} > {atol})")


def check_matrix(group: str, element: Tensor, n: int, kind: str) -> None:
    """One line unless the matrix ``element`` is an element of ``group``'s ``kind`` (``n`` units)."""
    if kind not in MATRIX_KINDS:
        raise ValueError(f"group {group!r} is a permutation group: an orthogonal map of its units changes the function")
    (check_centred if kind == "centred" else check_orthogonal)(group, element, n)


RANDOM = {"orthogonal": random_orthogonal, "centred": random_centred}  # a Haar-random element of each matrix kind
POLAR = {"orthogonal": polar, "centred": polar_centred}  # argmax_O ⟨O, C⟩ over each matrix kind
