"""CIFAR-style ResNet20 with BatchNorm (He et al. 2016; the paper's settings: width ×16).

Stem conv 3×3 → BN → ReLU, then 3 stages × ``blocks`` basic blocks of 16/32/64 ×
``width_multiplier`` channels (strides 1, 2, 2), global average pooling and a linear read-out.
Shortcuts are identities, or a 1×1 conv + BN projection where the shape changes.

Permutation groups: one per stage for its residual stream (the stem writes stage 1's stream),
shared by every layer that writes into it; one per block for its inner layer. Module names follow
torchvision's ResNet (``conv1 bn1 layer{1,2,3}.{b} fc``), so the spec uses the shared builders.
Any input size works (convolutions + global pooling): 1 or 3 channels, 28 or 32 pixels.
"""

from __future__ import annotations

from torch import Tensor, nn

from lmclab.archs.base import ArchConfig
from lmclab.core.options import Count, Positive, option
from lmclab.core.spec import PermutationSpec, build_spec
from lmclab.core.spec_builders import basic_block, conv_bn, dense

STAGE_WIDTHS = (16, 32, 64)


class Config(ArchConfig):
    """``input_shape`` (C, H, W); ``blocks`` per stage (3 = ResNet20); paper ``width_multiplier`` 16."""

    width_multiplier: Positive = option(1.0, "multiplies the 16/32/64 channels of the three stages (paper: 16)")
    blocks: Count = option(3, "basic blocks per stage (3 = ResNet20)")

    def widths(self) -> list[int]:
        return [max(1, round(w * self.width_multiplier)) for w in STAGE_WIDTHS]


class BasicBlock(nn.Module):
    """``relu2(bn2(conv2(relu1(bn1(conv1 x)))) + shortcut(x))``; separate ReLU modules so
    activation matching can hook the inner and the stream activations apart."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu2 = nn.ReLU()
        self.downsample = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + (x if self.downsample is None else self.downsample(x)))


def _plan(config: Config) -> list[tuple[int, int, int, int]]:
    """(stage, block, c_in, stride) of every block, in order."""
    plan, c_in = [], config.widths()[0]
    for s, width in enumerate(config.widths()):
        for b in range(config.blocks):
            stride = 2 if s > 0 and b == 0 else 1
            plan.append((s, b, c_in, stride))
            c_in = width
    return plan


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        widths = config.widths()
        self.conv1 = nn.Conv2d(config.input_shape[0], widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        stages: list[list[nn.Module]] = [[] for _ in widths]
        for s, _b, c_in, stride in _plan(config):
            stages[s].append(BasicBlock(c_in, widths[s], stride))
        self.layer1, self.layer2, self.layer3 = (nn.Sequential(*blocks) for blocks in stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[-1], config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        z = self.relu(self.bn1(self.conv1(x)))
        z = self.layer3(self.layer2(self.layer1(z)))  # (B, 64·w, H/4, W/4)
        return self.fc(self.pool(z).flatten(1))


def stream(stage: int) -> str:
    return f"P_stage{stage + 1}"


def inner(stage: int, block: int) -> str:
    return f"P_stage{stage + 1}_block{block}"


def permutation_spec(config: Config) -> PermutationSpec:
    """Stem writes stream 1; block (s, b) reads stream s (or s−1 for the first block of a later
    stage, through its projection) and writes stream s; the read-out reads the last stream."""
    parts = [conv_bn("conv1", "bn1", stream(0), None)]
    for s, b, c_in, stride in _plan(config):
        p_in = stream(s - 1) if s > 0 and b == 0 else stream(s)
        downsample = stride != 1 or c_in != config.widths()[s]
        parts.append(basic_block(f"layer{s + 1}.{b}", p_in, stream(s), inner(s, b), downsample))
    parts.append(dense("fc", None, stream(len(STAGE_WIDTHS) - 1)))
    return build_spec(*parts)


def activation_points(config: Config) -> dict[str, list[str]]:
    """A stream is carried by the stem's output and every block output of its stage; an inner
    group by its block's first ReLU."""
    points: dict[str, list[str]] = {stream(0): ["relu"]}
    for s, b, _c_in, _stride in _plan(config):
        points.setdefault(stream(s), []).append(f"layer{s + 1}.{b}.relu2")
        points[inner(s, b)] = [f"layer{s + 1}.{b}.relu1"]
    return points
