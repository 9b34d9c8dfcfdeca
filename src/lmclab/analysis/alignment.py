"""Singular value spectra and singular-vector alignment R_γ (Theorem 4.1, Appendix B).

A *layer* is every floating ≥2-D entry of the spec that is not a running statistic (linear
weights ``(out, in)``, conv kernels ``(out, in, kh, kw)``); 1-D entries (biases, norms) are not
layers. R compares the already aligned parameters ``π(θb)``: computing R on ``π(θb)`` equals the
formula with explicit ``P_ℓ`` and ``P_{ℓ−1}`` (for conv kernels reshaped to ``(out, in·kh·kw)`` the
input permutation acts as ``P_{ℓ−1} ⊗ I_{kh·kw}``, which is what permuting dim 1 then reshaping does).

Two spectra are available (``mode``):
- ``"reshape"``: the SVD of the kernel reshaped to ``(out, in·kh·kw)`` (the paper's default);
- ``"fft"``: the exact spectrum of the circular convolution on an ``n1 × n2`` input (Theorem F.1):
  for each 2-D frequency w, the SVD of the ``out × in`` complex matrix ``G[:, :, w]`` (the 2-D DFT
  of the kernel zero-padded to the input size); the layer's singular values are all of them.
  Linear layers have the same spectrum in both modes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from lmclab.core.options import OptionError, got
from lmclab.core.spec import PermutationSpec

MODES = ("reshape", "fft")


class Factors(NamedTuple):
    """A batch of SVDs ``W_b = U_b diag(S_b) Vh_b``: ``U (B, out, k)``, ``S (B, k)``, ``Vh (B, k, in)``.
    B = 1 for a matrix, B = n1·n2 frequencies for the exact convolution spectrum."""

    U: Tensor
    S: Tensor
    Vh: Tensor


def check_mode(conv_spectrum: str) -> None:
    """``conv_spectrum`` (how conv kernels enter R_γ and the spectra) is one of :data:`MODES`."""
    if conv_spectrum not in MODES:
        raise OptionError(f"{{conv_spectrum}} must be one of {got(list(MODES))}, got {got(conv_spectrum)}")


def check_gammas(gammas: Sequence[float]) -> None:
    """Every threshold γ of R_γ (Theorem 4.1) lies in [0, 1]."""
    for gamma in gammas:
        if not 0.0 <= gamma <= 1.0:
            raise OptionError(f"{{gammas}}: γ must lie in [0, 1], got {gamma}")


def layer_names(spec: PermutationSpec, params: Mapping[str, Tensor]) -> list[str]:
    """The ≥2-D ``.weight`` s that count as layers for R and spectra, in spec order (a class token or a
    position embedding is ≥2-D but no layer's weight)."""
    return [
        name
        for name in spec.axes
        if name.endswith(".weight")
        and name not in spec.stats
        and params[name].is_floating_point()
        and params[name].dim() >= 2
    ]


def output_layer(spec: PermutationSpec, layers: Sequence[str]) -> str:
    """The last layer whose output axis is never permuted (the logits layer)."""
    fixed = [name for name in layers if spec.axes[name][0] is None]
    if not fixed:
        raise ValueError("the permutation spec has no layer with an unpermuted output axis")
    return fixed[-1]


def layer_matrix(weight: Tensor) -> Tensor:
    """A kernel ``(out, in, kh, kw)`` as the matrix ``(out, in·kh·kw)``."""
    return weight.reshape(weight.shape[0], -1)


def circular_operator_blocks(weight: Tensor, input_size: tuple[int, int]) -> Tensor:
    """Theorem F.1: ``G[w] = DFT2(kernel zero-padded to n1 × n2)`` at each frequency w,
    returned as ``(n1·n2, out, in)`` complex blocks."""
    n1, n2 = input_size
    if weight.shape[-2] > n1 or weight.shape[-1] > n2:
        raise ValueError(f"kernel {tuple(weight.shape[-2:])} is larger than its input {input_size}")
    g = torch.fft.fft2(weight.double(), s=(n1, n2))  # (out, in, n1, n2)
    return g.permute(2, 3, 0, 1).reshape(n1 * n2, weight.shape[0], weight.shape[1])


def layer_svd(weight: Tensor, *, mode: str = "reshape", input_size: tuple[int, int] | None = None) -> Factors:
    """The SVD of one layer in float64 (complex128 for the exact convolution spectrum)."""
    check_mode(mode)
    if mode == "fft" and weight.dim() == 4:
        if input_size is None:
            raise ValueError("the exact convolution spectrum needs the layer's input size")
        blocks = circular_operator_blocks(weight, input_size)
    else:
        blocks = layer_matrix(weight).double()[None]
    u, s, vh = torch.linalg.svd(blocks, full_matrices=False)
    return Factors(u, s, vh)


def model_factors(
    params: Mapping[str, Tensor],
    layers: Sequence[str],
    *,
    mode: str = "reshape",
    input_sizes: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, Factors]:
    """:func:`layer_svd` of every layer of one model."""
    sizes = input_sizes or {}
    return {name: layer_svd(params[name].detach().cpu(), mode=mode, input_size=sizes.get(name)) for name in layers}


def singular_values(factors: Factors) -> Tensor:
    """All singular values of a layer, descending (float64)."""
    return torch.sort(factors.S.flatten(), descending=True).values


def _kept(factors: Factors, threshold: float) -> tuple[Tensor, Tensor, int]:
    """``U`` and ``Vh`` with the triplets below ``threshold`` zeroed, and how many were kept."""
    mask = factors.S.ge(threshold).to(factors.U.dtype)  # (B, k)
    return factors.U * mask[:, None, :], factors.Vh * mask[:, :, None], int(mask.real.sum())


def layer_alignment(
    factors_a: Mapping[str, Factors], factors_b: Mapping[str, Factors], gamma: float
) -> dict[str, tuple[float, int]]:
    """Each layer's share of :func:`alignment_r`: ``{layer: (Σ_{i,j} (u^a_i·u^b_j)(v^a_i·v^b_j), min(n^a_ℓ,
    n^b_ℓ))}`` with the model-wide thresholds ``γ s_max`` (Theorem 4.1), so that R_γ of any set of layers is
    the sum of their numerators over the sum of their counts, and of every layer :func:`alignment_r`."""
    if not 0.0 <= gamma <= 1.0:
        raise OptionError(f"{{gamma}}: γ must lie in [0, 1], got {gamma}")
    top_a = max(float(f.S.max()) for f in factors_a.values())
    top_b = max(float(f.S.max()) for f in factors_b.values())
    shares = {}
    for name, fa in factors_a.items():
        ua, vha, na = _kept(fa, gamma * top_a)
        ub, vhb, nb = _kept(factors_b[name], gamma * top_b)
        uu = ua.mH @ ub  # (B, ka, kb): u^aᴴ u^b
        vv = vha @ vhb.mH  # (B, ka, kb): v^aᴴ v^b
        shares[name] = (float((uu * vv.conj()).sum().real), min(na, nb))
    return shares


def alignment_r(factors_a: Mapping[str, Factors], factors_b: Mapping[str, Factors], gamma: float) -> float:
    """Theorem 4.1 / Appendix B: ``R_γ = Σ_ℓ Σ_{i,j} (u^a_i·u^b_j)(v^a_i·v^b_j) / Σ_ℓ min(n^a_ℓ, n^b_ℓ)``,
    keeping triplets with ``s ≥ γ s_max`` where ``s_max`` is the largest singular value over all
    layers of that model. ``factors_b`` must be of the aligned model π(θb). Complex factors use
    ``Re Σ (u^aᴴu^b)(v^bᴴv^a)``, the Frobenius product of the two operators' ``U Vᴴ``."""
    shares = layer_alignment(factors_a, factors_b, gamma).values()
    denominator = sum(kept for _, kept in shares)
    return sum(numerator for numerator, _ in shares) / denominator if denominator else 0.0


def _float64(values: Tensor | Sequence[float]) -> Tensor:
    """A float64 copy: pandas hands out read-only arrays, which torch warns about and may not share."""
    if isinstance(values, Tensor):
        return values.detach().to(torch.float64).clone()
    return torch.from_numpy(np.array(values, dtype=np.float64))


def output_scale(s_a: Tensor, s_b: Tensor) -> float:
    """Figure 8: the least-squares α of ``s^a_{L,i} ≈ α s^b_{L,i}``, ``α = ⟨s^a, s^b⟩ / ‖s^b‖²``."""
    s_a, s_b = _float64(s_a), _float64(s_b)
    if s_a.shape != s_b.shape:
        raise ValueError(f"output spectra differ in length: {tuple(s_a.shape)} vs {tuple(s_b.shape)}")
    return float((s_a @ s_b) / (s_b @ s_b))
