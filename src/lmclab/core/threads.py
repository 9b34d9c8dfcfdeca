"""The thread policy of the pipeline's stages and of the ``lmclab`` command: how their processes run
PyTorch's intra-op threads (``threads`` in params.yaml, ``lmclab --threads``; ``LMCLAB_THREADS``
overrides both). The library's functions never change it: a researcher's own process keeps whatever
``torch.set_num_threads`` and OpenMP settings it chose.

Measured on a 2-core machine idle and beside 1 and 2 busy processes (``benchmarks/bench_contention.py``;
the figures are on ``docs/performance.md``): what makes torch slow on a shared machine is less how many
threads it runs than how they wait. With GNU OpenMP's default wait, a thread that finishes its share of a
parallel region spins on its core for up to 300,000 polls before it sleeps, taking that core from the
other processes and from its own straggling sibling. Threads that sleep at once
(``OMP_WAIT_POLICY=PASSIVE``) hold up beside busy processes but pay a wake-up at every region on an idle
machine; one thread loses the second core. A short spin (``GOMP_SPINCOUNT=1000``) keeps most of both, so
the policy is :func:`wait_briefly` before torch loads, and ``auto`` keeps the number of threads PyTorch
starts with (the cores OpenMP sees; ``OMP_NUM_THREADS`` when set).

The order of floating-point sums depends on how a reduction is split, so results differ in their last
bits between thread counts: give a count (``threads: 1``) for results identical across machines.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

ENVIRONMENT = "LMCLAB_THREADS"  # overrides params.yaml's threads and --threads (read by the pipeline and CLI)
Threads = int | Literal["auto"]


SPIN = "1000"  # GNU OpenMP's polls before an idle thread sleeps (its default: 300,000)


def wait_briefly() -> None:
    """Make GNU OpenMP's idle threads spin only briefly before they sleep (``GOMP_SPINCOUNT``), unless the
    environment already chooses (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` set). OpenMP reads it once, when
    torch loads: call this first thing in an entry point. (LLVM's OpenMP, PyTorch's on macOS, ignores it.)"""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPIN


@lru_cache(maxsize=1)
def starting_threads() -> int:
    """The intra-op threads PyTorch started this process with (read once, before any :func:`use_threads`)."""
    import torch

    return torch.get_num_threads()


def resolve_threads(threads: Threads | str) -> int:
    """The number of intra-op threads ``threads`` asks for: ``auto`` (:func:`starting_threads`) or a
    positive integer (also as text, as an environment variable gives it)."""
    if threads == "auto":
        return starting_threads()
    count = int(threads) if isinstance(threads, str) and threads.strip().isdigit() else threads
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"threads: expected auto or a positive integer, got {threads!r}")
    return count


def use_threads(threads: Threads | str) -> int:
    """Set this process's intra-op threads to ``resolve_threads(threads)``; returns the count. For a
    process's entry point (a stage, the command), never for library code."""
    import torch

    starting_threads()  # read before the first change
    count = resolve_threads(threads)
    torch.set_num_threads(count)
    return count
