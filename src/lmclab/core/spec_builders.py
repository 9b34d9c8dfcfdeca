"""The small helpers that architectures build their :class:`lmclab.core.spec.PermutationSpec` from:
each returns the axes of one layer (:func:`dense`, :func:`conv`, :func:`norm`, :func:`conv_bn`) or of a
residual block (:func:`basic_block`, :func:`bottleneck`) in PyTorch's axis order (weights ``(out, in, …)``),
each axis naming the permutation group acting on it (the paper's ``P_ℓ``, Section 2; ``None``: never
permuted). Looped over a config and joined by :func:`lmclab.core.spec.build_spec`, never hand-listed."""

from __future__ import annotations

from lmclab.core.spec import Axes


def dense(name: str, p_out: str | None, p_in: str | None, bias: bool = True) -> dict[str, Axes]:
    """A linear layer ``W: (out, in)``, ``b: (out,)``."""
    axes: dict[str, Axes] = {f"{name}.weight": (p_out, p_in)}
    if bias:
        axes[f"{name}.bias"] = (p_out,)
    return axes


def conv(name: str, p_out: str | None, p_in: str | None, bias: bool = False) -> dict[str, Axes]:
    """A 2-D convolution, kernel ``(out, in, kh, kw)``."""
    axes: dict[str, Axes] = {f"{name}.weight": (p_out, p_in, None, None)}
    if bias:
        axes[f"{name}.bias"] = (p_out,)
    return axes


def norm(name: str, p: str | None, running_stats: bool = True) -> dict[str, Axes]:
    """A BatchNorm/LayerNorm over channels ``p`` (affine parameters and running statistics)."""
    axes: dict[str, Axes] = {f"{name}.weight": (p,), f"{name}.bias": (p,)}
    if running_stats:
        axes[f"{name}.running_mean"] = (p,)
        axes[f"{name}.running_var"] = (p,)
        axes[f"{name}.num_batches_tracked"] = ()
    return axes


def conv_bn(conv_name: str, norm_name: str, p_out: str | None, p_in: str | None) -> dict[str, Axes]:
    """A bias-free convolution followed by BatchNorm over its output channels."""
    return {**conv(conv_name, p_out, p_in), **norm(norm_name, p_out)}


def basic_block(name: str, p_in: str, p_out: str, p_mid: str, downsample: bool) -> dict[str, Axes]:
    """A ResNet basic block (torchvision names ``conv1 bn1 conv2 bn2 downsample.{0,1}``).

    ``p_in``/``p_out`` are the residual streams it reads and writes (equal without a projection
    shortcut); ``p_mid`` is the block's own inner group. The 1×1 projection shortcut (conv + BN)
    maps stream ``p_in`` to stream ``p_out``."""
    if not downsample and p_in != p_out:
        raise ValueError(f"{name}: an identity shortcut needs the same stream in and out")
    axes = {
        **conv_bn(f"{name}.conv1", f"{name}.bn1", p_mid, p_in),
        **conv_bn(f"{name}.conv2", f"{name}.bn2", p_out, p_mid),
    }
    if downsample:
        axes.update(conv_bn(f"{name}.downsample.0", f"{name}.downsample.1", p_out, p_in))
    return axes


def bottleneck(name: str, p_in: str, p_out: str, p_mid: tuple[str, str], downsample: bool) -> dict[str, Axes]:
    """A ResNet bottleneck block (torchvision names ``conv1..3 bn1..3 downsample.{0,1}``);
    ``p_mid`` are the groups of its two inner layers."""
    if not downsample and p_in != p_out:
        raise ValueError(f"{name}: an identity shortcut needs the same stream in and out")
    axes = {
        **conv_bn(f"{name}.conv1", f"{name}.bn1", p_mid[0], p_in),
        **conv_bn(f"{name}.conv2", f"{name}.bn2", p_mid[1], p_mid[0]),
        **conv_bn(f"{name}.conv3", f"{name}.bn3", p_out, p_mid[1]),
    }
    if downsample:
        axes.update(conv_bn(f"{name}.downsample.0", f"{name}.downsample.1", p_out, p_in))
    return axes
