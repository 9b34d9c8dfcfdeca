"""Where a warning of lmclab points: the first line outside the library, whichever of its functions the caller
called (``lmclab.align`` runs weight matching three calls down; a warning at a fixed ``stacklevel`` would name a
line of lmclab's own)."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parents[1])  # src/lmclab, or wherever the package is installed


def caller_level() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called from the function that warns, of the first frame
    whose file lies outside lmclab's package: the warning names the caller's line."""
    frame, level = sys._getframe(2), 2
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
