"""Atomic output files: every writer of a stage output (Parquet tables, JSON, checkpoints,
permutations, figures, the report) writes to a temporary file in the output's own directory and
renames it into place (``os.replace``, atomic within a file system). An interrupted or failing
stage therefore leaves either the previous file or none, never half of one that DVC could hash."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` (same suffix, so format-by-extension writers like
    ``savefig`` still work); when the block ends normally it replaces ``path``, when it raises the
    temporary file is removed and ``path`` is left as it was. Creates the parent directory.
    Use: ``with atomic_path(out / "curve.parquet") as tmp: frame.to_parquet(tmp)``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
