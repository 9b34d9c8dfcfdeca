"""Data-parallel stages: relaunching a stage under ``torchrun`` and joining its process group (only
the stages that train or evaluate in parallel import this, so the others do not depend on
:mod:`lmclab.core.distributed`)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

# lmclab.core.distributed (torch) is imported inside the functions: a stage script imports this
# module before its warm start, which must stay free of heavy imports


def relaunch_under_torchrun(
    script: str, args: list[str], *, run_id: str, nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str | None = None
) -> None:
    """Run this stage again as ``nproc_per_node`` × ``nnodes`` torchrun processes (data-parallel) and exit
    with torchrun's status; a no-op for one process or when already one of torchrun's processes."""
    if nproc_per_node * nnodes == 1 or "LOCAL_RANK" in os.environ:
        return
    from lmclab.core.distributed import torchrun_command

    command = torchrun_command(
        sys.executable,
        script,
        args,
        run_id=run_id,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
    )
    raise SystemExit(subprocess.run(command, env={**os.environ, "LMCLAB_WARM": "0"}).returncode)


def join_torchrun(device: Any) -> Any:
    """This process's ``lmclab.core.distributed.World``: its rank among torchrun's processes, or alone."""
    from lmclab.core.distributed import World, join_world

    if "LOCAL_RANK" not in os.environ:
        return World(device=device)
    return join_world(
        int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]), device.type
    )
