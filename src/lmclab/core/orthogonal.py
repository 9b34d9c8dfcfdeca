"""Group elements of either kind: permutations of hidden units and orthogonal maps of them.

A group of a :class:`~lmclab.core.spec.PermutationSpec` is of kind ``permutation`` (the paper's Section 2)
or ``orthogonal``: an orthogonal matrix ``O`` (``n × n``, ``OᵀO = I``) acts on its ``n`` units, which keeps
the function wherever every operation on the units commutes with rotations (linear reads and writes,
residual adds, norms whose gains are folded into their readers; Theus et al. 2025, Section 3). Permutations
are the orthogonal maps with one 1 per row, so both kinds act the same way on a tensor: the group's
element multiplies every axis the group appears on, ``W' = O W Oᵀ`` for a weight that reads and writes the
units (``W'_ℓ = P_ℓ W_ℓ P_{ℓ-1}ᵀ`` for a permutation), ``E' = E Oᵀ`` for an embedding that writes them along
its last axis. A permutation ``perm`` is kept as its index tensor (``perm[i]`` = the unit of θb that lands
on unit ``i``), the matrix ``P`` with ``P[i, perm[i]] = 1``; an orthogonal element as its matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

KINDS = ("permutation", "orthogonal")


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
