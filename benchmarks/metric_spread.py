"""How much do the headline metrics move when nothing but the floating-point arithmetic changes?

Runs the default pipeline (this checkout's dvc.yaml, stages, library and params.yaml) from scratch
once per *variant*, each in its own temporary git + DVC repository and warm-start server, and
reports per headline metric the spread against the reference run:

- ``rerun``: the same again (run-to-run noise on one machine: 0 except the search seconds);
- ``1thread``: ``OMP_NUM_THREADS=1`` (other reduction order in every matmul and sum);
- ``mkl-avx``: MKL restricted to AVX kernels (other blocking and FMA use in the matmuls);
- ``sse``: ATen's and oneDNN's generic kernels and MKL's SSE4.2 ones (what an older CPU computes).

The last three stand in for "another machine": the same code on another CPU gives other floats,
and 10 epochs of training amplify them. ``metrics/tolerances.yaml`` takes its numbers from this
(README "Comparing experiments and CI"). Writes ``benchmarks/scratch/metric_spread.{json,md}`` and
the proposed rules ``benchmarks/scratch/tolerances.proposed.yaml`` (:func:`propose_tolerances`).

    python benchmarks/metric_spread.py [--variants rerun,1thread,mkl-avx,sse]   (~3 min per variant)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "reference": {},
    "rerun": {},
    "1thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "mkl-avx": {"MKL_ENABLE_INSTRUCTIONS": "AVX"},
    "sse": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def run_variant(name: str, env_extra: dict[str, str], work: Path) -> tuple[dict, float]:
    repo = work / name
    repo.mkdir()
    for item in ("dvc.yaml", ".dvcignore", ".gitignore", "params.yaml"):
        shutil.copy(ROOT / item, repo / item)
    for folder in ("stages", "src"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    bin_dir = str(Path(sys.executable).parent)
    warm = Path(tempfile.mkdtemp(prefix="warm-", dir=work))  # one server per variant: its env applies
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "LMCLAB_WARM_DIR": str(warm),
        **env_extra,
    }
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q", "-f"], ["dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    start = time.perf_counter()
    proc = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name}: dvc repro failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((repo / "metrics" / "headline.json").read_text()), time.perf_counter() - start


def flat(doc: dict) -> dict[str, float]:
    return {f"{group}.{key}": value for group, entries in doc.items() for key, value in entries.items()}


def spread_table(runs: dict[str, dict[str, float]]) -> tuple[list[dict], str]:
    ref = runs["reference"]
    rows, names = [], [n for n in runs if n != "reference"]
    lines = [
        "| metric | reference | " + " | ".join(f"Δ {n}" for n in names) + " | max |Δ| |",
        "|---|---:|" + "---:|" * (len(names) + 1),
    ]
    for metric, value in ref.items():
        deltas = {n: runs[n][metric] - value for n in names}
        worst = max(abs(d) for d in deltas.values())
        rows.append(
            {
                "metric": metric,
                "reference": value,
                **{f"delta_{n}": d for n, d in deltas.items()},
                "max_abs_delta": worst,
            }
        )
        lines.append(
            f"| `{metric}` | {value:.6g} | " + " | ".join(f"{d:+.4g}" for d in deltas.values()) + f" | {worst:.4g} |"
        )
    return rows, "\n".join(lines)


# another machine, as reported in a cross-machine check (committed metrics vs a fresh run elsewhere): |Δ| seen there
OTHER_MACHINE = {"endpoints.acc": 0.1, "wm.B_loss": 0.021, "merge_many.naive_acc": 1.1, "ste.bc_B_acc": 0.54}
SECONDS_RULE = {"abs": 1.0, "rel": 1.0}  # timings: see propose_tolerances


def _round_up(x: float) -> float:
    """Round up to one significant digit (0.0347 -> 0.04, 4.896 -> 5)."""
    if x <= 0:
        return 0.0
    scale = 10 ** math.floor(math.log10(x))
    return math.ceil(x / scale - 1e-9) * scale


def propose_tolerances(rows: list[dict], factor: float = 2.0) -> str:
    """Per metric: ``abs = factor × max |Δ|`` (over the variants and :data:`OTHER_MACHINE`),
    rounded up; 0-spread metrics get 1e-6. Timings (``*.sec``) vary with load, not floats: the
    largest relative run-to-run change here was ~50 %, so they get rel 1.0 (half or double) + 1 s."""
    lines, widest = ["rules:"], {}
    for row in rows:
        name = row["metric"]
        if name.endswith(".sec"):
            continue
        worst = max(row["max_abs_delta"], OTHER_MACHINE.get(name, 0.0))
        tol = max(_round_up(factor * worst), 1e-6)
        suffix = name.split(".", 1)[1]
        widest[suffix] = max(widest.get(suffix, 0.0), tol)
        lines.append(f'  "{name}": {{abs: {tol:g}}}  # max |Δ| {worst:.3g}')
    lines.append(f'  "*.sec": {{abs: {SECONDS_RULE["abs"]:g}, rel: {SECONDS_RULE["rel"]:g}}}')
    lines.append("  # methods the default run does not have: the widest tolerance of the same metric")
    lines += [f'  "*.{suffix}": {{abs: {tol:g}}}' for suffix, tol in widest.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "reference"))
    args = parser.parse_args()
    chosen = ["reference", *[v for v in args.variants.split(",") if v]]
    runs, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="metric-spread-") as tmp:
        for name in chosen:
            doc, seconds[name] = run_variant(name, VARIANTS[name], Path(tmp))
            runs[name] = flat(doc)
            print(f"{name}: {seconds[name]:.0f} s", flush=True)
    rows, table = spread_table(runs)
    record(SCRATCH / "metric_spread.json", rows, variants={n: VARIANTS[n] for n in chosen}, seconds=seconds)
    out = SCRATCH
    (out / "metric_spread.md").write_text(table + "\n")
    (out / "tolerances.proposed.yaml").write_text(propose_tolerances(rows))
    print(table)


if __name__ == "__main__":
    main()
