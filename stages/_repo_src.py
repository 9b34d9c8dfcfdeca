"""Put this repository's own ``src/`` first on ``sys.path`` before anything imports lmclab, so a stage
runs the code its ``deps:`` in dvc.yaml name, even where another lmclab is installed. Every stage
script imports it first; it is the one file in ``stages/`` that is not a stage."""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
