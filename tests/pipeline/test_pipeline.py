"""The whole DAG through real `dvc repro` / `dvc exp run` in a temporary git repository."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dvc_repo import TINY  # TINY: also imported by other tests from here
from dvc_repo import dvc_env as _env
from dvc_repo import run as _run

from lmclab.pipeline.stage import StageParams, load_yaml

EVERY_STAGE = {
    "code",
    "validate",
    "download",
    "train",
    "permute",
    "merge",
    "measure",
    "spectra",
    "connect",
    "merge_many",
    "summarize",
    "plot",
}  # the stages of dvc.yaml, matrix instances by their base name


def _ran(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def _set(repo: Path, key: str, value) -> None:
    params = load_yaml(repo / "params.yaml")
    node = params
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _base_stages(names: set[str]) -> set[str]:
    return {n.split("@")[0] for n in names}


@pytest.fixture(scope="module")
def repo(tiny_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's finished tiny run (its first `dvc repro` is ``tiny_run.output``)."""
    return tiny_run.restore(tmp_path_factory.mktemp("pipeline"))


@pytest.mark.slow
def test_dag_reruns_exactly_what_depends_on_a_change(repo: Path, tiny_run) -> None:
    first = _ran(tiny_run.output)  # the first run: every stage ran
    assert _base_stages(first) == EVERY_STAGE
    assert len([s for s in first if s.startswith("permute@")]) == 3
    summary = json.loads((repo / "reports/detail/summary.json").read_text())
    assert set(summary) == {"identity", "wm", "am"}
    assert summary["identity"]["l2_reduction_pct"]["mean"] == 0.0
    assert summary["wm"]["l2_reduction_pct"]["mean"] > 0
    assert (repo / "reports/report.md").is_file() and (repo / "reports/figures/interpolation.png").is_file()
    cka = pd.read_parquet(repo / "data/tables/cka.parquet")  # the CKA of every hidden layer, every pair of models
    assert set(cka["pair"]) == {"a-b", "a-pi_b", "a-mid", "pi_b-mid"} and set(cka["method"]) == {"identity", "wm", "am"}
    assert "## Functional similarity: CKA" in (repo / "reports/report.md").read_text()
    assert (repo / "reports/figures/cka.png").is_file() and 0 < summary["wm"]["cka_a_mid"]["mean"] <= 1

    assert _ran(_run(repo, "dvc", "repro")) == set()  # everything cached, in the restored copy too
    assert _run(repo, "git", "status", "--porcelain", stdout_only=True) == ""  # the run is committed

    # a plot-only option reruns only plot (and validate, which reads the whole file; its output is unchanged)
    _set(repo, "plot.dpi", 50)
    assert _ran(_run(repo, "dvc", "repro")) == {"validate", "plot"}

    # one method's option reruns that method's branch, not the other methods nor training
    # (measure reruns only if the merged model changed: an identical permutation stops there)
    _set(repo, "permute.wm.tol", 1e-5)  # (1e-6 is left for the `dvc exp run -S` test below)
    ran = _ran(_run(repo, "dvc", "repro"))
    assert (
        {"permute@pair0-wm", "merge@pair0", "connect@triple0-wm"}
        <= {s for s in ran if "@" in s}
        <= {"permute@pair0-wm", "merge@pair0", "measure@pair0", "connect@triple0-wm"}
    )
    assert {"summarize", "plot"} <= ran and "download" not in ran

    # a measure option reruns measure and after, not permute or merge
    _set(repo, "measure.num_lambdas", 7)
    ran = _ran(_run(repo, "dvc", "repro"))
    assert _base_stages(ran) - {"validate"} == {"measure", "connect", "summarize", "plot"}

    # changing the method list through `dvc exp run --set-param` reruns the aggregation, not train
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "options")
    ran = _ran(_run(repo, "dvc", "exp", "run", "--set-param", "permute.methods=[identity,wm]"))
    assert not {"download", "train"} & _base_stages(ran) and {"summarize", "plot"} <= ran
    assert set(json.loads((repo / "reports/detail/summary.json").read_text())) == {"identity", "wm"}

    # train.epochs reruns train and everything after it, but not download
    _set(repo, "train.epochs", 2)
    ran = _ran(_run(repo, "dvc", "repro"))
    assert {
        "train@0",
        "train@1",
        "permute@pair0-wm",
        "merge@pair0",
        "measure@pair0",
        "summarize",
        "plot",
    } <= ran and "download" not in ran

    # reverting restores from the run cache without recomputing
    _set(repo, "train.epochs", 1)
    out = _run(repo, "dvc", "repro")
    assert not any(s.startswith("train@") for s in _ran(out))
    assert "Stage 'train@0' is cached - skipping run, checking out outputs" in out
    assert set(json.loads((repo / "reports/detail/three_models.json").read_text())) == {"identity", "wm"}
    assert {*TINY["merge_many"]["methods"], "naive", "ensemble"} <= set(
        json.loads((repo / "reports/detail/merge_many.json").read_text())
    )

    show = _run(repo, "dvc", "metrics", "show")
    assert "wm.B_loss" in show and "test_loss_barrier_mid" not in show  # headline only
    diff = _run(repo, "dvc", "metrics", "diff", "HEAD~1")  # the baseline had am, the workspace has not
    assert "metrics/headline.json" in diff and "am.L2_red" in diff


def _changed_stages(repo: Path) -> set[str]:
    """The stages ``dvc status`` reports as changed (a dependency, a param or an output) once the code
    stage has rewritten the stages' code files (``dvc status`` alone shows an edit as the code stage's)."""
    _run(repo, "dvc", "repro", "code")
    return set(json.loads(_run(repo, "dvc", "status", "--json", stdout_only=True) or "{}"))


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.slow
def test_an_edit_to_code_a_stage_imports_marks_that_stage_changed(repo: Path) -> None:
    """The cache cannot serve results of old code: the stage scripts' import closures are their deps
    (through their code files), and an edit marks no stage that does not import the edited file."""
    _set(repo, "permute.methods", ["identity", "wm", "am"])  # as TINY has them (an earlier test may drop am)
    _run(repo, "dvc", "repro")
    assert _changed_stages(repo) == set()
    data, mlp = repo / "src/lmclab/core/data.py", repo / "src/lmclab/archs/mlp.py"
    saved = {p: p.read_text() for p in (data, mlp, repo / "src/lmclab/pipeline/stage.py")}
    try:
        _edit(data, "def load_split(", "def load_split(  # edited\n")  # what train and every analysis read
        changed = _changed_stages(repo)
        assert {
            "download",
            "train@0",
            "train@1",
            "train@2",
            "permute@pair0-am",
            "merge@pair0",
            "measure@pair0",
            "spectra",
            "merge_many",
        } <= changed and "plot" not in changed
        data.write_text(saved[data])
        _edit(mlp, "def activation_points(", "def activation_points(  # edited\n")  # AM builds the model
        changed = _changed_stages(repo)
        assert {"train@0", "permute@pair0-am", "permute@pair0-wm", "connect@triple0-wm"} <= changed
        assert not {"download", "summarize", "plot"} & changed
        mlp.write_text(saved[mlp])
        (repo / "src/lmclab/pipeline/stage.py").write_text(saved[repo / "src/lmclab/pipeline/stage.py"] + "# edited\n")
        assert {s.split("@")[0] for s in _changed_stages(repo)} == EVERY_STAGE - {"code"}
    finally:
        for path, text in saved.items():
            path.write_text(text)
    assert _changed_stages(repo) == set()


def _experiment_metrics_by_dpi(repo: Path) -> dict[int, dict]:
    """``plot.dpi`` -> metrics files of every experiment of HEAD (`dvc exp show --json`)."""
    found = {}
    for rev in json.loads(_run(repo, "dvc", "exp", "show", "--json", stdout_only=True)):
        for exp in rev.get("experiments") or []:
            data = exp["revs"][0]["data"]
            found[data["params"]["params.yaml"]["data"]["plot"]["dpi"]] = data.get("metrics") or {}
    return found


@pytest.mark.slow
def test_a_queued_experiment_runs_through_dvc_queue(repo: Path) -> None:
    """The queue runs the experiment in a workspace of its own, which restores unchanged stages from the
    run-cache: only what the changed param reaches runs (the figures' resolution: plot)."""
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "--allow-empty", "-qm", "before the queue")  # earlier tests may leave nothing new
    _run(repo, "dvc", "exp", "run", "--queue", "-S", "plot.dpi=31")
    _run(repo, "dvc", "queue", "start", "-j", "1")
    deadline, status = time.monotonic() + 300, ""
    while time.monotonic() < deadline:
        status = _run(repo, "dvc", "queue", "status")
        if "Success" in status or "Failed" in status:
            break
        time.sleep(2)
    assert "Success" in status, status
    metrics = _experiment_metrics_by_dpi(repo)[31]
    assert "B_loss" in metrics["metrics/headline.json"]["data"]["wm"]


@pytest.mark.slow
def test_a_bad_pair_fails_in_validate_before_any_training(repo: Path) -> None:
    _set(repo, "permute.pairs", [[0, 1], [0, 7]])  # (0, 1): the triple's (θa, θb) stays a pair
    proc = subprocess.run(
        [sys.executable, "stages/validate.py", "--out", "data/validated.txt"],
        cwd=repo,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: permute.pairs: expected seeds of train.seeds [0, 1, 2], got [0, 7] ([7] not trained)"
    )
    _set(repo, "permute.pairs", [[0, 1]])


@pytest.mark.slow
def test_floats_as_dvc_writes_them_reach_the_stages_as_numbers(repo: Path) -> None:
    """`dvc exp run -S` (the README's way) with 1e-6, 1E-3, .5 and 5e2: DVC writes `tol: 1e-06` back,
    which PyYAML would read as a string; the stages read params.yaml as DVC does (YAML 1.2)."""
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "before -S floats", "--allow-empty")
    sets = {
        "permute.wm.tol": "1e-6",
        "permute.ste.lr": "1E-3",
        "three.margin": ".5",
        "merge_many.merge_many.tol": "5e2",
    }
    ran = _ran(_run(repo, "dvc", "exp", "run", *[a for k, v in sets.items() for a in ("-S", f"{k}={v}")]))
    assert {"validate", "permute@pair0-wm", "connect@triple0-wm", "merge_many"} <= ran
    text = (repo / "params.yaml").read_text()
    assert "tol: 1e-06" in text and yaml.safe_load(text)["permute"]["wm"]["tol"] == "1e-06"  # the trap
    read = StageParams("validate", repo / "params.yaml", dvc_yaml=repo / "dvc.yaml").read  # the stages' reader
    assert [read(k) for k in sets] == [1e-6, 1e-3, 0.5, 500.0] and all(type(read(k)) is float for k in sets)
    landscape = pd.read_parquet(repo / "data/connect/seed0-seed1-seed2/wm/landscape.parquet")
    assert landscape["u"].min() == -0.5  # connect read three.margin = .5 as a number


@pytest.mark.slow
def test_a_string_where_a_number_belongs_is_one_line_from_validate_before_training(repo: Path) -> None:
    proc = subprocess.run(
        ["dvc", "exp", "run", "-S", "train.lr=abc"], cwd=repo, env=_env(), capture_output=True, text=True
    )
    _run(repo, "git", "checkout", "params.yaml")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert [ln for ln in output.splitlines() if ln.startswith("error:")] == [
        "error: train.lr: expected a number > 0, got 'abc'"
    ]
    assert "Traceback" not in output and not {s for s in _ran(output) if s != "validate"}
