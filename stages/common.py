"""Stage-side plumbing shared by the thin stage scripts: reading the keys a stage lists under
``params:`` in dvc.yaml, turning library errors into one-line messages, and running a stage in a
warm-started process (``lmclab.warmstart``) that dies with whatever started it (``lmclab.lifetime``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

STARTED_BY = os.getppid()  # read first: if this starter (dvc) is gone by run_warm, the stage must not run

import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))

from lmclab.lifetime import die_with_parent  # noqa: E402 (standard library only: no heavy import here)
from lmclab.warmstart import run_script  # noqa: E402


def read_params(path: Path, key: str) -> Any:
    """The value at dotted ``key`` of the params file, or a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: {path}: params file not found")
    value: Any = yaml.safe_load(path.read_text()) or {}
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise SystemExit(f"error: {path}: missing key {key}")
        value = value[part]
    return value


def one_line_errors(fn: Callable) -> Callable:
    """Print bad-input errors (ValueError, FileNotFoundError, ...) as ``error: …`` and exit 1."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise SystemExit(f"error: {str(exc).splitlines()[0]}") from None

    return wrapper


def run_warm(app: Callable[[], Any]) -> None:
    """Run the stage's typer ``app`` in a warm worker (``lmclab.warmstart``; ~3 s of imports saved),
    or here when warm start is off (``LMCLAB_WARM=0``), unavailable, or this is the worker. Either
    way the stage is SIGKILLed when the process that started it (``dvc``) dies, so no stage outlives
    its ``dvc`` and writes outputs behind a rerun's back."""
    die_with_parent(STARTED_BY)
    code = run_script(sys.argv[0], sys.argv[1:])
    if code is None:
        app()
    else:
        raise SystemExit(code)
