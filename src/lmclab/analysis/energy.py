"""Layer inputs, input–singular-vector energy (Figures 4, 9) and the Theorem 4.2 bound.

The input ``z_{ℓ−1}`` of a layer is captured with a forward pre-hook on the module owning the
weight (module name = weight name minus ``.weight``). For a convolution, each input patch is one
sample of ``z`` for the reshaped kernel ``(out, in·kh·kw)`` (``F.unfold``), so expectations run over
images and positions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.analysis.alignment import Factors, layer_matrix, layer_svd
from lmclab.core.data import Split


def layer_module(model: nn.Module, layer: str) -> nn.Module:
    """The ``nn.Linear``/``nn.Conv2d`` owning weight ``layer``; one-line error otherwise."""
    owner = layer.removesuffix(".weight")
    try:
        module = model.get_submodule(owner) if layer.endswith(".weight") else None
    except AttributeError:
        module = None
    if not isinstance(module, (nn.Linear, nn.Conv2d)):
        raise ValueError(f"layer {layer!r}: expected the weight of an nn.Linear or nn.Conv2d")
    return module


def product_layers(model: nn.Module, layers: Sequence[str]) -> list[str]:
    """The ``layers`` that multiply an input (the weights of ``nn.Linear`` and ``nn.Conv2d`` modules): a
    lookup table (a language model's token or position embedding) has no input ``z`` to take energy over."""
    out = []
    for layer in layers:
        owner = layer.removesuffix(".weight")
        module = model.get_submodule(owner) if layer.endswith(".weight") and owner else None
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            out.append(layer)
    return out


def input_patches(module: nn.Module, z: Tensor) -> Tensor:
    """The rows the layer's matrix multiplies: ``(samples, in)`` or ``(samples·positions, in·kh·kw)``."""
    if isinstance(module, nn.Conv2d):
        if isinstance(module.padding, str) or module.padding_mode != "zeros" or module.groups != 1:
            raise ValueError("input energy needs zero-padded, ungrouped convolutions with numeric padding")
        cols = F.unfold(
            z, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride
        )  # (N, in·kh·kw, positions)
        return cols.transpose(1, 2).reshape(-1, cols.shape[1])
    return z.reshape(-1, z.shape[-1])


@contextmanager
def _capture(model: nn.Module, layers: Sequence[str]) -> Iterator[dict[str, Tensor]]:
    seen: dict[str, Tensor] = {}
    handles = []
    for layer in layers:
        module = layer_module(model, layer)

        def hook(mod: nn.Module, args: tuple, layer: str = layer) -> None:
            seen[layer] = input_patches(mod, args[0].detach())

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def layer_inputs(
    model: nn.Module, params: Mapping[str, Tensor], split: Split, layers: Sequence[str], *, batch_size: int = 1000
) -> Iterator[tuple[int, dict[str, Tensor]]]:
    """Per batch: (number of images, {layer: input patches z_{ℓ−1}}) of the model run with
    ``params`` in eval mode."""
    device = next(iter(params.values())).device
    was_training = model.training
    model.eval()
    try:
        with _capture(model, layers) as seen:
            for start in range(0, len(split), batch_size):
                x = split.x[start : start + batch_size].to(device)
                functional_call(model, dict(params), (x,), tie_weights=False)
                yield len(x), {k: v.double() for k, v in seen.items()}
    finally:
        model.train(was_training)


def input_sizes(model: nn.Module, layers: Sequence[str], input_shape: Sequence[int]) -> dict[str, tuple[int, int]]:
    """Spatial size ``(n1, n2)`` of every conv layer's input (for the exact FFT spectrum)."""
    sizes: dict[str, tuple[int, int]] = {}
    handles = []
    for layer in layers:
        module = layer_module(model, layer)
        if isinstance(module, nn.Conv2d):

            def hook(mod: nn.Module, args: tuple, layer: str = layer) -> None:
                sizes[layer] = tuple(args[0].shape[-2:])

            handles.append(module.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ref = next(model.parameters())
            model(torch.zeros(1, *input_shape, device=ref.device, dtype=ref.dtype))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return sizes


def input_energy(
    model: nn.Module, params: Mapping[str, Tensor], split: Split, layers: Sequence[str], *, batch_size: int = 1000
) -> dict[str, tuple[Tensor, Tensor]]:
    """Figures 4, 9: per layer, ``(s_i, E[(v_iᵀ z_{ℓ−1})²])`` for every right singular vector v_i of the
    reshaped weight, in descending order of s_i; the expectation runs over ``split``."""
    factors = {name: layer_svd(params[name].detach().cpu().to(torch.float64)) for name in layers}
    bases = {name: f.Vh[0].T.to(next(iter(params.values())).device) for name, f in factors.items()}
    sums = {name: torch.zeros(f.S.shape[1], dtype=torch.float64) for name, f in factors.items()}
    rows = dict.fromkeys(layers, 0)
    for _, inputs in layer_inputs(model, params, split, layers, batch_size=batch_size):
        for name, z in inputs.items():
            sums[name] += ((z @ bases[name]) ** 2).sum(0).cpu()  # (k,)
            rows[name] += z.shape[0]
    return {name: (factors[name].S[0], sums[name] / rows[name]) for name in layers}


def theorem42_bound(
    fa: Factors, fb: Factors, energy_a: Tensor, energy_b: Tensor, cross: Tensor, lipschitz: float = 1.0
) -> float:
    """Theorem 4.2's right-hand side ``C (Σ s^a_i² E(v^a_iᵀz)² + Σ s^b_j² E(v^b_jᵀz)²
    − 2 Σ_{i,j} s^a_i s^b_j (u^a_i·u^b_j) E[(v^a_iᵀz)(v^b_jᵀz)])^{1/2}``; ``cross[i, j]`` is the last
    expectation. Equals ``C (E‖(W^a − W^b) z‖²)^{1/2}``."""
    sa, sb = fa.S[0], fb.S[0]
    uu = fa.U[0].T @ fb.U[0]  # (ka, kb)
    inner = sa**2 @ energy_a + sb**2 @ energy_b - 2 * (sa[:, None] * sb[None, :] * uu * cross).sum()
    return lipschitz * float(inner.clamp_min(0).sqrt())


def theorem42(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    split: Split,
    layers: Sequence[str],
    *,
    batch_size: int = 1000,
    factors_a: Mapping[str, Factors] | None = None,
    factors_b: Mapping[str, Factors] | None = None,
) -> list[dict]:
    """Per layer: the Theorem 4.2 bound (σ = ReLU, C = 1) next to the measured
    ``E‖σ(W^a z) − σ(W^b z)‖``, with ``z`` the layer's input in model a over ``split``.
    ``factors_a``/``factors_b``: the reshaped layers' SVDs (:func:`layer_svd`), if already computed."""
    fa = factors_a if factors_a is not None else {n: layer_svd(params_a[n].detach().cpu()) for n in layers}
    fb = factors_b if factors_b is not None else {n: layer_svd(params_b[n].detach().cpu()) for n in layers}
    device = next(iter(params_a.values())).device
    va = {n: f.Vh[0].T.to(device) for n, f in fa.items()}
    vb = {n: f.Vh[0].T.to(device) for n, f in fb.items()}
    acc = {n: {"ea": 0.0, "eb": 0.0, "cross": 0.0, "measured": 0.0, "rows": 0} for n in layers}
    for _, inputs in layer_inputs(model, params_a, split, layers, batch_size=batch_size):
        for n, z in inputs.items():
            pa, pb = z @ va[n], z @ vb[n]  # (rows, ka), (rows, kb)
            wa, wb = layer_matrix(params_a[n]).double(), layer_matrix(params_b[n]).double()
            acc[n]["ea"] += (pa**2).sum(0).cpu()
            acc[n]["eb"] += (pb**2).sum(0).cpu()
            acc[n]["cross"] += (pa.T @ pb).cpu()
            acc[n]["measured"] += float((F.relu(z @ wa.T) - F.relu(z @ wb.T)).norm(dim=1).sum())
            acc[n]["rows"] += z.shape[0]
    out = []
    for n in layers:
        a = acc[n]
        bound = theorem42_bound(fa[n], fb[n], a["ea"] / a["rows"], a["eb"] / a["rows"], a["cross"] / a["rows"])
        out.append({"layer": n, "bound": bound, "measured": a["measured"] / a["rows"]})
    return out
