"""Benchmark: the default run's wall time, stage by stage, as a user meets it.

    python benchmarks/bench_default_run.py [--out benchmarks/results/default_run.json] [--runs first,forced]
        [--versus COMMIT --rounds 2] [--preset NAME] [--keep DIR]

Clones the committed repository (HEAD) into a temporary folder with a DVC cache of its own, then
runs there ``dvc repro`` (``first``: what a fresh clone costs) and ``dvc repro -f`` (``forced``: every
stage again, the warm start on), with the ``python`` and ``dvc`` of this interpreter's environment.
Each line DVC prints is timestamped as it arrives; a stage's time runs from its ``Running stage``
line to the next one (so DVC's own hashing and locking after a stage count towards it) and the last
to the end. Writes the totals, every stage and the sums per stage family (``train@0``… → ``train``)
with the commit, the machine and the command (``benchmarks/record.py``: one row per run, ``mode`` first,
forced or versus). ``--versus`` clones an earlier commit beside HEAD and runs
``dvc repro -f`` of each in turn, ``--rounds`` times (the first round also fills each clone's data), under
``versus``: a change's effect on the wall time measured in one run, not against a figure from another day.
``--preset`` applies ``presets/NAME.yaml`` in the clone first (the clone's own ``lmclab preset``: e.g. the
language-model preset's run as a user meets it), ``--keep`` leaves the clone with its results at DIR (e.g.
for a study to collect). Run it with nothing else on the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
RUNNING = re.compile(r"^Running stage '([^']+)'")
COMMANDS = {"first": ["dvc", "repro"], "forced": ["dvc", "repro", "-f"]}


def stage_seconds(lines: Iterable[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds per stage from ``(time, line)`` pairs: each ``Running stage 'x'`` line to the next, the
    last to ``end``. A stage that runs twice (never in one ``dvc repro``) would be summed."""
    starts = [(t, m.group(1)) for t, line in lines if (m := RUNNING.match(line))]
    out: dict[str, float] = {}
    for (t, name), t_next in zip(starts, [t for t, _ in starts[1:]] + [end], strict=False):
        out[name] = out.get(name, 0.0) + t_next - t
    return out


def families(stages: dict[str, float]) -> dict[str, float]:
    """Sums per stage family: ``train@3`` and ``permute@0-1`` count as ``train`` and ``permute``."""
    out: dict[str, float] = {}
    for name, sec in stages.items():
        out[name.split("@")[0]] = out.get(name.split("@")[0], 0.0) + sec
    return out


def timed_run(cmd: list[str], cwd: Path, env: dict) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stdout]
    total = time.monotonic() - t0
    if proc.wait() != 0:
        tail = "\n".join(line for _, line in lines[-20:])
        raise SystemExit(f"error: {' '.join(cmd)} failed in {cwd}:\n{tail}")
    stages = stage_seconds(lines, total)
    return {
        "repro": " ".join(cmd),
        "total_sec": round(total, 1),
        "stage_processes": len(stages),
        "families_sec": {k: round(v, 1) for k, v in families(stages).items()},
        "stages_sec": {k: round(v, 2) for k, v in stages.items()},
    }


def main(
    out: Path = typer.Option(ROOT / "benchmarks/results/default_run.json", help="where the JSON goes"),
    runs: str = typer.Option("first,forced", help="comma-separated: first (dvc repro), forced (dvc repro -f)"),
    versus: str = typer.Option(
        None, help="an earlier commit: its forced run alternates with HEAD's, --rounds times (lone timings drift)"
    ),
    rounds: int = typer.Option(2, min=1, help="with --versus: forced runs of each commit, alternating"),
    preset: str = typer.Option(None, help="a preset of presets/ applied in the clone before the runs"),
    keep: Path = typer.Option(None, help="move the clone, with its results, to this new folder at the end"),
) -> None:
    names = [r.strip() for r in runs.split(",") if r.strip()]
    if not names or any(r not in COMMANDS for r in names):
        raise SystemExit(f"error: --runs: expected a comma-separated subset of {', '.join(COMMANDS)}, got {runs!r}")
    head = _commit("HEAD")
    earlier = _commit(versus) if versus else None  # refused before any run
    if keep is not None and keep.exists():
        raise SystemExit(f"error: --keep: {keep} exists; expected a new folder")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run, rows = this_run(preset=preset), []
    with tempfile.TemporaryDirectory(prefix="lmclab-bench-") as tmp:  # created 0700: ours alone
        clone = _clone(Path(tmp) / "repo", head)
        if preset:
            preset_env = {**env, "PYTHONPATH": str(clone / "src")}  # the clone's lmclab, as its stages import it
            subprocess.run([sys.executable, "-m", "lmclab", "preset", preset], cwd=clone, env=preset_env, check=True)
        for name in names:
            rows.append(measured := {"mode": name, "clone": head, **timed_run(COMMANDS[name], clone, env)})
            _report(name, measured)
        if earlier:
            clones = {head: clone, earlier: _clone(Path(tmp) / "earlier", earlier)}
            for commit, timed in _alternate(clones, rounds, env).items():
                rows += [{"mode": "versus", "clone": commit, "round": i, **r} for i, r in enumerate(timed)]
        if keep is not None:
            shutil.move(clone, keep)
    record(out, rows, run=run)
    print(f"wrote {out}")


def _commit(ref: str) -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"error: --versus: {ref!r} is no commit of {ROOT}")
    return proc.stdout.strip()


def _clone(path: Path, commit: str) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(path)], check=True)
    subprocess.run(["git", "checkout", "--quiet", commit], cwd=path, check=True)
    return path


def _alternate(clones: dict[str, Path], rounds: int, env: dict) -> dict[str, list[dict]]:
    """``dvc repro -f`` of each clone in turn, ``rounds`` times: commit → its runs, in order."""
    out: dict[str, list[dict]] = {commit: [] for commit in clones}
    for _ in range(rounds):
        for commit, clone in clones.items():
            out[commit].append(run := timed_run(COMMANDS["forced"], clone, env))
            _report(f"forced at {commit[:7]}", run)
    return out


def _report(name: str, run: dict) -> None:
    families = sorted(run["families_sec"].items(), key=lambda kv: -kv[1])
    print(f"{name}: {run['repro']} {run['total_sec']} s; " + ", ".join(f"{k} {v}" for k, v in families), flush=True)


if __name__ == "__main__":
    typer.run(main)
