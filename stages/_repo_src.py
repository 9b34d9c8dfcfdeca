"""Put this repository's own ``src/`` first on ``sys.path`` before anything imports lmclab, so a stage
runs the code its ``deps:`` in dvc.yaml name, even where another lmclab is installed, and set what must
be set before torch loads (OpenMP's wait policy). Every stage
script imports it first (and passes ``DVC_YAML`` to its params reader); it is the one file in
``stages/`` that is not a stage."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DVC_YAML = REPO / "dvc.yaml"  # the pipeline the stage scripts belong to
SRC = str(REPO / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from lmclab.core.threads import wait_briefly  # noqa: E402 (imports no torch)

# OpenMP reads it once, when torch loads (in this process, or in the warm-start server it may start)
wait_briefly()
