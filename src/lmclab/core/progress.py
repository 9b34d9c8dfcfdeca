"""Progress bars for searches that loop on their own (weight matching's sweeps, activation statistics'
batches, MergeMany's passes): the caller opens a bar with :func:`progress_bar`, and the loop, which knows
nothing of it, calls :func:`tick` once per step. With no bar open, :func:`tick` does nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tqdm import tqdm

_BAR: ContextVar[tqdm | None] = ContextVar("progress_bar", default=None)


@contextmanager
def progress_bar(desc: str, unit: str, enabled: bool) -> Iterator[None]:
    """A tqdm bar on stderr (``enabled``), counting the :func:`tick` s of the block."""
    if not enabled:
        yield
        return
    with tqdm(desc=desc, unit=unit, leave=False) as bar:
        token = _BAR.set(bar)
        try:
            yield
        finally:
            _BAR.reset(token)


def tick(**postfix: object) -> None:
    """One step done (``postfix``: values shown beside the bar)."""
    bar = _BAR.get()
    if bar is not None:
        bar.update()
        if postfix:
            bar.set_postfix(postfix, refresh=False)


def note(**postfix: object) -> None:
    """Values shown beside the bar within a step (a group of a sweep), the count unchanged."""
    bar = _BAR.get()
    if bar is not None:
        bar.set_postfix(postfix)
