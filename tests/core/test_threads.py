"""The thread policy: ``auto`` or a positive count (also as text, as an environment variable gives it),
anything else refused in one line; setting it changes torch's intra-op threads and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmclab.core.threads import resolve_threads, starting_threads, use_threads, wait_passively

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


def test_the_wait_policy_is_passive_unless_the_environment_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    wait_passively()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    wait_passively()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_fresh_process_of_the_command_and_of_a_stage_waits_passively() -> None:
    """The two entry points set the wait policy before torch loads (the policy is read once, then)."""
    code = (
        "import os, sys; sys.argv = ['x']; {imports}; import torch; "
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for where, imports in ((ROOT / "src", "import lmclab.cli"), (ROOT / "stages", "import _repo_src")):
        out = subprocess.run(
            [sys.executable, "-c", code.format(imports=imports)],
            cwd=where,
            env={**env, "PYTHONPATH": str(where)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == ["PASSIVE", "True"], where


def test_the_library_leaves_a_callers_thread_count_alone(restore_threads) -> None:
    from torch import nn

    import lmclab

    torch.set_num_threads(2)
    a, b = (nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)) for _ in range(2))
    lmclab.find_permutation(a, b, example_inputs=torch.zeros(2, 4))
    assert torch.get_num_threads() == 2
