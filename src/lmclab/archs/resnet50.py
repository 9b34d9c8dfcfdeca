"""ResNet50 for ImageNet: torchvision's definition (bottleneck blocks 3/4/6/3) with its spec.

The stem conv takes 1 or 3 input channels; global pooling makes any input size ≥ 28 pixels work
(the spec tests run it on small random inputs; training it is out of reach on a CPU).
Groups: the stem; one residual stream per stage (every stage starts with a projection shortcut);
two inner groups per bottleneck block.
"""

from __future__ import annotations

from torch import Tensor, nn

from lmclab.archs.base import ArchConfig
from lmclab.core.options import Positive, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import bottleneck, conv_bn, dense

BLOCKS = (3, 4, 6, 3)


class Config(ArchConfig):
    """``input_shape`` (C, H, W); ``width_multiplier`` scales torchvision's ``width_per_group``
    (64) of the inner layers, 1 = the standard ResNet50."""

    width_multiplier: Positive = option(1.0, "multiplies the inner width of every bottleneck (1 = standard)")


class Model(nn.Module):
    """torchvision.models.resnet50 with ``num_classes`` outputs and ``C`` input channels."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        from torchvision.models import resnet50  # imported here: the other archs never need it

        net = resnet50(
            weights=None, num_classes=config.num_classes, width_per_group=max(1, round(64 * config.width_multiplier))
        )
        if config.input_shape[0] != 3:
            net.conv1 = nn.Conv2d(config.input_shape[0], 64, 7, stride=2, padding=3, bias=False)
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _blocks() -> list[tuple[int, int]]:
    return [(s, b) for s, n in enumerate(BLOCKS) for b in range(n)]


def stream(stage: int) -> str:
    return f"P_stage{stage + 1}" if stage >= 0 else "P_stem"


def permutation_spec(config: Config) -> PermutationSpec:
    """Stem → ``P_stem``; block (s, b) reads the previous stream (projection at b = 0), writes
    ``P_stage{s+1}``; its inner layers get ``P_stage{s+1}_block{b}_{1,2}``."""
    parts = [conv_bn("net.conv1", "net.bn1", stream(-1), None)]
    for s, b in _blocks():
        p_in = stream(s - 1) if b == 0 else stream(s)
        mid = (f"{stream(s)}_block{b}_1", f"{stream(s)}_block{b}_2")
        parts.append(bottleneck(f"net.layer{s + 1}.{b}", p_in, stream(s), mid, downsample=b == 0))
    parts.append(dense("net.fc", None, stream(len(BLOCKS) - 1)))
    return build_spec(*parts)


def activation_points(config: Config) -> dict[str, list[str]]:
    """torchvision reuses one ReLU per block; its last call (after the residual add) is what a
    forward hook keeps, so ``relu`` carries the stream. Inner groups are read after their BN."""
    points: dict[str, list[str]] = {stream(-1): ["net.relu"]}
    for s, b in _blocks():
        name = f"net.layer{s + 1}.{b}"
        points.setdefault(stream(s), []).append(f"{name}.relu")
        points[f"{stream(s)}_block{b}_1"] = [f"{name}.bn1"]
        points[f"{stream(s)}_block{b}_2"] = [f"{name}.bn2"]
    return points
