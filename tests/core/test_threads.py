"""The thread policy: ``auto`` or a positive count (also as text, as an environment variable gives it),
anything else refused in one line; setting it changes torch's intra-op threads and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmclab.core.threads import resolve_threads, starting_threads, use_threads, wait_briefly

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("threads", "count"), [(1, 1), (3, 3), ("2", 2), (" 4 ", 4)])
def test_a_positive_count_is_resolved(threads, count: int) -> None:
    assert resolve_threads(threads) == count


def test_auto_is_the_count_torch_started_with_whatever_was_set_since(restore_threads) -> None:
    start = starting_threads()
    torch.set_num_threads(start + 1)
    assert resolve_threads("auto") == start == starting_threads()


@pytest.mark.parametrize("threads", [0, -1, "0", "-2", "x", "", "Auto", True, False, 1.0, 2.5, None])
def test_anything_else_is_refused_in_one_line(threads) -> None:
    with pytest.raises(ValueError, match=rf"^threads: expected auto or a positive integer, got {threads!r}$"):
        resolve_threads(threads)


def test_use_threads_sets_torchs_intra_op_threads(restore_threads) -> None:
    assert use_threads(3) == 3 and torch.get_num_threads() == 3
    assert use_threads("auto") == starting_threads() and torch.get_num_threads() == starting_threads()
    use_threads(2)
    with pytest.raises(ValueError):
        use_threads(0)
    assert torch.get_num_threads() == 2  # a refused count changes nothing


def test_idle_threads_spin_briefly_unless_the_environment_chooses(monkeypatch) -> None:
    for chosen in ({}, {"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        for key, value in chosen.items():
            monkeypatch.setenv(key, value)
        wait_briefly()
        assert os.environ.get("GOMP_SPINCOUNT") == chosen.get("GOMP_SPINCOUNT", None if chosen else "1000")
        assert os.environ.get("OMP_WAIT_POLICY") == chosen.get("OMP_WAIT_POLICY")


def test_a_fresh_process_of_the_command_and_of_a_stage_spins_briefly() -> None:
    """The two entry points set the spin before torch loads (OpenMP reads it once, then)."""
    code = (
        "import os, sys; sys.argv = ['x']; {imports}; import torch; "
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for where, imports in ((ROOT / "src", "import lmclab.cli"), (ROOT / "stages", "import _repo_src")):
        out = subprocess.run(
            [sys.executable, "-c", code.format(imports=imports)],
            cwd=where,
            env={**env, "PYTHONPATH": str(where)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == ["1000", "True"], where


def test_the_library_leaves_a_callers_thread_count_alone(restore_threads) -> None:
    from torch import nn

    import lmclab

    torch.set_num_threads(2)
    a, b = (nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)) for _ in range(2))
    lmclab.find_permutation(a, b, example_inputs=torch.zeros(2, 4))
    assert torch.get_num_threads() == 2
