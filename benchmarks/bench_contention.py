"""Benchmark: speed on a shared machine. Weight matching on the default pair (beside git-re-basin's),
a slice of the default training and the whole default run, each idle and beside 1 and 2 busy loops
(pure-Python processes spinning on a core, stopped when the measurement ends), under each thread setting.

    python benchmarks/bench_contention.py --models data/models --busy 0,1,2 --settings torch,1,2,auto \
        --workloads wm,train,pipeline [--rebasin /tmp/git-re-basin --site /tmp/jax-site]

A *setting* is how a measured process runs its threads: ``torch`` leaves PyTorch's default (as many
intra-op threads as cores, OpenMP's default spin-then-sleep wait); ``1``/``2`` fix that many threads
with the same wait; a ``p`` suffix (``1p``, ``torchp``) makes OpenMP's idle threads sleep at once
(``OMP_WAIT_POLICY=PASSIVE``), an ``s`` suffix makes them spin briefly first (``GOMP_SPINCOUNT=1000``;
``s30000``: that many polls);
``auto`` is lmclab's thread policy, whole (``lmclab.core.threads``: the brief spin and ``threads: auto``).
Every measurement runs in a fresh process (OpenMP reads its environment once, when torch loads).

``wm``: weight matching (library defaults, and one start) on ``--models``' seed0.pt and seed1.pt (the
default run's: run ``make pipeline`` first), ``--repeats`` times after an untimed run, alternating with
git-re-basin's ``weight_matching`` in the same process when ``--rebasin`` is given (``bench_lap.py``
says how to get it; the peer stays outside the project); medians. ``sinkhorn``: the default run's
``wm_sinkhorn`` search of that pair (params.yaml's options), once. ``train``: ``--steps`` Adam steps of
the default MLP on mnist5k at the default batch size. ``pipeline``: ``dvc repro -f`` of the committed
default run in a temporary clone (as ``bench_default_run.py``), stopped after ``--pipeline-limit``
seconds (the row then says so). Writes ``benchmarks/results/contention.json`` with the command, commit,
date, machine and the load average before each row.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
WORKLOADS = ("wm", "sinkhorn", "train", "pipeline")


@contextmanager
def busy_loops(count: int, seconds: float):
    """``count`` processes each spinning on a core for at most ``seconds``; stopped on leaving."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)]) for _ in range(count)]
    try:
        time.sleep(0.5 if procs else 0)  # running before the measurement starts
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


SETTING = re.compile(r"^(torch|auto|[1-9][0-9]*)(p?)(?:s([0-9]*))?$")
GOMP_DEFAULT_SPIN = "300000"  # GNU OpenMP's polls before an idle thread sleeps, when nothing sets them


def parse_setting(setting: str) -> tuple[str, bool, str | None]:
    """``(threads, passive, spin)`` of a setting: ``torch``, ``auto`` or a count, then ``p`` (sleep at once)
    and/or ``s`` with an optional spin count (``s``: 1000, ``s30000``: 30,000 polls)."""
    match = SETTING.match(setting)
    if match is None:
        raise SystemExit(f"error: --settings: {setting!r} is not torch, auto or a count, with p and/or s<polls>")
    threads, passive, spin = match.groups()
    return threads, passive == "p", None if spin is None else (spin or "1000")


def setting_env(setting: str) -> dict[str, str]:
    """The environment of a measured process under ``setting`` (module docstring). Outside ``auto`` the
    spin is set explicitly (GNU's default unless the setting gives one): the stages of the pipeline
    apply lmclab's brief spin whenever the environment leaves it open."""
    threads, passive, spin = parse_setting(setting)
    omp = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "LMCLAB_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in omp}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")])
    env["BENCH_SETTING"] = setting
    if passive:  # OpenMP threads that sleep at once when idle, instead of spinning first
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif setting != "auto":
        env["GOMP_SPINCOUNT"] = spin or GOMP_DEFAULT_SPIN
    if threads != "torch":
        env["LMCLAB_THREADS"] = threads
    return env


def apply_setting() -> dict:
    """In a measured process: the threads of its setting, and what it runs with."""
    if os.environ["BENCH_SETTING"] == "auto":  # the policy of the stages and the command, whole
        from lmclab.core.threads import wait_briefly

        wait_briefly()
    import torch

    if "LMCLAB_THREADS" in os.environ:
        from lmclab.core.threads import use_threads

        use_threads(os.environ["LMCLAB_THREADS"])
    return {"threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}


def worker_wm(models: Path, repeats: int, rebasin: Path | None) -> dict:
    """Weight matching on the default pair, alternating with git-re-basin's when given."""
    import bench_lap

    from lmclab.archs import get_arch
    from lmclab.search.weight_matching import matching_objective, weight_matching

    ((_, config, params_a, params_b),) = bench_lap._pairs([models]).values()
    spec = get_arch("mlp").permutation_spec(config)
    runs = {
        "lmclab": lambda: weight_matching(spec, params_a, params_b),  # the defaults: 2 starts
        "lmclab, 1 start": lambda: weight_matching(spec, params_a, params_b, restarts=1),
    }
    if rebasin:
        peer = bench_lap._rebasin(config, params_a, params_b)
        runs["git-re-basin"] = peer
    times: dict[str, list[float]] = {name: [] for name in runs}
    found = {name: run() for name, run in runs.items()}  # warm-up, untimed
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    objective = {k: matching_objective(spec, getattr(v, "perm", v), params_a, params_b) for k, v in found.items()}
    return {"median_s": {k: statistics.median(v) for k, v in times.items()}, "objective": objective}


def worker_sinkhorn(models: Path) -> dict:
    """The default run's ``wm_sinkhorn`` search (params.yaml's options) of the default pair, once."""
    import bench_lap

    from lmclab.archs import get_arch
    from lmclab.pipeline.stage import load_yaml
    from lmclab.search import SearchProblem, run_search
    from lmclab.search.weight_matching import matching_objective

    ((_, config, params_a, params_b),) = bench_lap._pairs([models]).values()
    options = load_yaml(ROOT / "params.yaml")["permute"]["wm_sinkhorn"]
    problem = SearchProblem(get_arch("mlp").permutation_spec(config), params_a, params_b)
    start = time.perf_counter()
    found = run_search("wm_sinkhorn", problem, seed=0, options=options)
    seconds = time.perf_counter() - start
    objective = matching_objective(problem.spec, found.perm, params_a, params_b)
    return {"median_s": {"lmclab": seconds}, "objective": {"lmclab": objective}}


def worker_train(steps: int) -> dict:
    """``steps`` Adam steps of the default MLP on mnist5k at the default batch size (first one untimed)."""
    import tempfile

    import torch

    from lmclab.archs import build_model, make_config
    from lmclab.core.data import load_split, prepare
    from lmclab.pipeline.stage import load_yaml
    from lmclab.train.training import make_optimizer

    params = load_yaml(ROOT / "params.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare("mnist5k", Path(tmp) / "raw", Path(tmp) / "prepared")
        train = load_split(Path(tmp) / "prepared", "train")
    config = make_config("mlp", input_shape=meta["input_shape"], num_classes=10, **params["model"]["mlp"])
    model = build_model("mlp", config, seed=0).train()
    opt = make_optimizer(model.parameters(), optimizer="adam", lr=1e-3, momentum=0.9, weight_decay=0.0)
    size = params["train"]["batch_size"]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    start = 0.0
    for step in range(steps + 1):
        idx = order[(step * size) % (len(train) - size) :][:size]
        loss = torch.nn.functional.cross_entropy(model(train.x[idx]), train.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        start = start or time.perf_counter()
    return {"median_s": {"lmclab": time.perf_counter() - start}, "steps": steps, "batch_size": size}


def measure(workload: str, setting: str, args: dict) -> dict:
    """One measurement in a fresh process under ``setting``."""
    if workload == "pipeline":
        return measure_pipeline(setting, args["pipeline_limit"])
    cmd = [sys.executable, __file__, "--worker", workload, "--models", str(args["models"])]
    cmd += ["--repeats", str(args["repeats"]), "--steps", str(args["steps"])]
    if args["rebasin"]:
        cmd += ["--rebasin", str(args["rebasin"]), "--site", str(args["site"])]
    proc = subprocess.run(cmd, env=setting_env(setting), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"error: {workload} under {setting} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_pipeline(setting: str, limit: float) -> dict:
    """``dvc repro -f`` of HEAD in a temporary clone, at most ``limit`` seconds."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lmclab-bench-") as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        env = setting_env(setting)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        env.pop("PYTHONPATH")
        subprocess.run(["dvc", "repro", "-q", "download"], cwd=repo, env=env, check=True, capture_output=True)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                ["dvc", "repro", "-f"], cwd=repo, env=env, capture_output=True, text=True, timeout=limit
            )
        except subprocess.TimeoutExpired:
            return {"median_s": {"lmclab": None}, "stopped_after_s": limit}
        if proc.returncode:
            raise SystemExit(f"error: dvc repro -f under {setting} failed:\n{proc.stdout[-2000:]}")
        return {"median_s": {"lmclab": time.monotonic() - start}}


def main(
    workloads: str = typer.Option("wm,train,pipeline", help=f"comma-separated subset of {', '.join(WORKLOADS)}"),
    busy: str = typer.Option("0,1,2", help="numbers of busy loops beside each measurement"),
    settings: str = typer.Option("torch,1,2,auto", help="thread settings: torch, auto or a count"),
    models: Path = typer.Option(ROOT / "data" / "models", help="folder with the default run's seed0.pt, seed1.pt"),
    repeats: int = typer.Option(5, min=1),
    steps: int = typer.Option(30, min=1, help="train: timed Adam steps"),
    pipeline_limit: float = typer.Option(1800.0, help="pipeline: seconds before a run is stopped"),
    rebasin: Path = typer.Option(None, help="git-re-basin checkout (bench_lap.py), for the wm peer"),
    site: Path = typer.Option(None, help="folder with jax for --rebasin"),
    worker: str = typer.Option(None, hidden=True),
    out: Path = typer.Option(ROOT / "benchmarks" / "results" / "contention.json"),
    append: bool = typer.Option(False, help="keep --out's rows of the other workloads (and its commands)"),
) -> None:
    if worker:
        if site:
            sys.path.insert(0, str(site))
        if rebasin:
            sys.path.insert(0, str(rebasin / "src"))
        info = {**apply_setting(), "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "default")}
        workers = {
            "wm": lambda: worker_wm(models, repeats, rebasin),
            "sinkhorn": lambda: worker_sinkhorn(models),
            "train": lambda: worker_train(steps),
        }
        result = workers[worker]()
        print(json.dumps({**info, **result}))
        return
    chosen = [w.strip() for w in workloads.split(",") if w.strip()]
    if not chosen or any(w not in WORKLOADS for w in chosen):
        raise SystemExit(f"error: --workloads: expected a subset of {', '.join(WORKLOADS)}, got {workloads!r}")
    if {"wm", "sinkhorn"} & set(chosen) and not (models / "seed0.pt").is_file():
        raise SystemExit(f"error: --models: {models} has no seed0.pt (run `make pipeline` first)")
    chosen_settings = [s.strip() for s in settings.split(",")]
    for setting in chosen_settings:
        parse_setting(setting)  # every setting checked before the first measurement
    args = {"models": models, "repeats": repeats, "steps": steps, "rebasin": rebasin, "site": site}
    args["pipeline_limit"] = pipeline_limit
    rows = []
    for workload in chosen:
        for loops in [int(b) for b in busy.split(",")]:
            for setting in chosen_settings:
                load = os.getloadavg()[0]
                with busy_loops(loops, pipeline_limit + 600):
                    row = measure(workload, setting, args)
                rows.append({"workload": workload, "busy_loops": loops, "setting": setting, "load_before": load, **row})
                print(json.dumps(rows[-1]), flush=True)
    write(out, rows, chosen, append)


def write(out: Path, rows: list[dict], chosen: list[str], append: bool) -> None:
    """The JSON record (benchmarks/record.py); with ``append``, the earlier rows of other workloads, busy loops
    or settings are kept beside (each row names its run: command, commit, date, machine)."""
    new = {(r["workload"], r["busy_loops"], r["setting"]) for r in rows}
    keep = (lambda r: (r["workload"], r["busy_loops"], r["setting"]) not in new) if append else None
    record(out, rows, run=this_run(workloads=chosen), keep=keep)


if __name__ == "__main__":
    typer.run(main)
