"""The bookkeeping of :mod:`lmclab.trace`: tags on graph values, the union-find over channel groups,
and the tables of modules and functions that carry or merge a group."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import nn

FIXED = -1  # the union-find root of every group that must not be permuted
CARRY_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid,
                 nn.LeakyReLU, nn.ELU, nn.Dropout, nn.Identity, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
                 nn.Hardtanh, nn.Softplus, nn.Mish)
CARRY_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.gelu, torch.nn.functional.silu,
                   torch.sigmoid, torch.tanh, torch.nn.functional.dropout, torch.nn.functional.relu6,
                   torch.nn.functional.hardswish, torch.nn.functional.max_pool2d, torch.nn.functional.avg_pool2d,
                   torch.nn.functional.adaptive_avg_pool2d, operator.neg}
MERGE_FUNCTIONS = {operator.add, torch.add, operator.mul, torch.mul, operator.iadd, operator.imul}


@dataclass(frozen=True)
class Tag:
    """Axis ``axis`` of a node's output is permuted by union-find element ``group``."""

    group: int
    axis: int


class TraceError(ValueError):
    """A node the tracer cannot prove permutation-equivariant."""


class Groups:
    """Union-find over group ids; ``FIXED`` absorbs every group that must stay unpermuted."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {FIXED: FIXED}

    def new(self) -> int:
        gid = len(self.parent) - 1
        self.parent[gid] = gid
        return gid

    def find(self, gid: int) -> int:
        while self.parent[gid] != gid:
            self.parent[gid] = self.parent[self.parent[gid]]
            gid = self.parent[gid]
        return gid

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            root, child = (ra, rb) if ra == FIXED or (rb != FIXED and ra < rb) else (rb, ra)
            self.parent[child] = root
        return self.find(a)
