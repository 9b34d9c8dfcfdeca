"""The thread policy of the pipeline's stages and of the ``lmclab`` command: how their processes run
PyTorch's intra-op threads (``threads`` in params.yaml, ``lmclab --threads``; ``LMCLAB_THREADS``
overrides both). The library's functions never change it: a researcher's own process keeps whatever
``torch.set_num_threads`` and OpenMP settings it chose.

Measured on a 2-core machine idle and beside 1 and 2 busy processes (``benchmarks/bench_contention.py``,
``docs/performance.md``): what makes torch slow on a shared machine is not how many threads it runs but
how they wait. With OpenMP's default wait, a thread that finishes its share of a parallel region spins on
its core for a while before sleeping, taking that core from the other processes and from its own
straggling sibling; beside two busy loops, training and weight matching ran 2–3× slower than with
threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``), which cost ~25 % on the idle machine for
training and nothing for weight matching. One thread instead of two was as good under load but ~1.8× slower
idle for training. So the policy is :func:`wait_passively` before torch loads, and ``auto`` keeps the
number of threads PyTorch starts with (the cores OpenMP sees; ``OMP_NUM_THREADS`` when set).

The order of floating-point sums depends on how a reduction is split, so results differ in their last
bits between thread counts: give a count (``threads: 1``) for results identical across machines.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

ENVIRONMENT = "LMCLAB_THREADS"  # overrides params.yaml's threads and --threads (read by the pipeline and CLI)
Threads = int | Literal["auto"]


def wait_passively() -> None:
    """Make OpenMP's idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) unless the environment says
    otherwise. OpenMP reads it once, when torch loads: call this first thing in an entry point."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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
