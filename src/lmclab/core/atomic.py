"""Atomic output files: every writer of a stage output (Parquet tables, JSON, checkpoints,
permutations, figures, the report) writes to a temporary file in the output's own directory and
renames it into place (``os.replace``, atomic within a file system). An interrupted or failing
stage therefore leaves either the previous file or none, never half of one that DVC could hash.
:func:`write_table`, :func:`write_json` and :func:`write_text` are the common cases."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


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


@contextlib.contextmanager
def atomic_folder(path: Path | str) -> Iterator[Path]:
    """Yield a new folder beside ``path`` (hidden, private to this user: ``mkdtemp``); when the block ends normally
    it replaces ``path`` — which must then be absent or an empty folder —, when it raises it is removed and
    ``path`` is left as it was (a model folder written file by file is never seen half-written)."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.is_dir():
            path.rmdir()  # empty: the callers check it before any work
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`); returns ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: Path | str, obj: Any) -> Path:
    """Write ``obj`` as JSON (indented by 2, one final newline) to ``path`` atomically; returns ``path``."""
    return write_text(path, json.dumps(obj, indent=2) + "\n")


def write_table(path: Path | str, frame: pd.DataFrame, *, float_format: str | None = None) -> Path:
    """Write ``frame`` without its index to ``path`` atomically, as Parquet or CSV by the suffix
    (``float_format``: CSV only, e.g. ``"%.6g"``); returns ``path``."""
    path = Path(path)
    if path.suffix not in (".parquet", ".csv"):
        raise ValueError(f"path must end in .parquet or .csv, got {str(path)!r}")
    if float_format is not None and path.suffix != ".csv":
        raise ValueError(f"float_format applies to a .csv path, got {str(path)!r}")
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            frame.to_csv(tmp, index=False, float_format=float_format)
        else:
            frame.to_parquet(tmp, index=False)
    return path
