"""The default-run benchmark's arithmetic: each stage's seconds run from its ``Running stage`` line to
the next (the last to the end), and families sum their stages."""

from __future__ import annotations

import sys

import pytest
from dvc_repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_default_run import families, stage_seconds  # noqa: E402


def test_each_stage_runs_to_the_next_and_the_last_to_the_end() -> None:
    lines = [
        (0.5, "Running stage 'validate':"),
        (0.7, "> python stages/validate.py"),
        (2.0, "Running stage 'train@0':"),
        (2.1, "Updating lock file 'dvc.lock'"),
        (5.5, "Running stage 'train@1':"),
        (9.0, "Running stage 'permute@0-1':"),
    ]
    assert stage_seconds(lines, end=10.0) == pytest.approx(
        {"validate": 1.5, "train@0": 3.5, "train@1": 3.5, "permute@0-1": 1.0}
    )
    assert families(stage_seconds(lines, end=10.0)) == pytest.approx({"validate": 1.5, "train": 7.0, "permute": 1.0})


def test_nothing_ran_is_no_stage() -> None:
    assert stage_seconds([(0.1, "Data and pipelines are up to date.")], end=1.0) == {}
