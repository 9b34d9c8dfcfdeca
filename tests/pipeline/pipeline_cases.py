"""What ``test_arch_pipelines.py`` runs per architecture and data kind: a :class:`Case` is the params that
change the tiny run, the inputs a user brings and the checks of the finished run (``check(repo, env)``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from lmclab.archs import get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.spec import check_permutation

Check = Callable[[Path, dict], None]


@dataclass(frozen=True)
class Case:
    params: dict  # merged into the tiny run's params.yaml
    checks: tuple[Check, ...]
    write_inputs: Callable[[Path], dict] | None = None  # writes the user's files; returns extra environment

    def inputs(self, repo: Path) -> dict:
        return self.write_inputs(repo) if self.write_inputs else {}


def perms_fit(repo: Path, arch: str, methods: list[str], must: set[str]) -> None:
    ckpt = load_checkpoint(repo / "data" / "models" / "seed1.pt")
    spec = get_arch(arch).permutation_spec(ckpt.config)
    for method in methods:
        perm = torch.load(repo / "data" / "perms" / "seed0-seed1" / method / "perm.pt", weights_only=True)
        check_permutation(perm, spec.group_sizes(ckpt.state_dict), spec.heads)
        assert must <= set(perm), (method, sorted(perm))
