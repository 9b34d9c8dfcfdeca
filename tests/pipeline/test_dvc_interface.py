"""DVC as the user interface, through real `dvc` in a temporary git repository on a tiny config:
the headline metrics, `dvc exp show`, `dvc plots show`, the metric gate (tools/metrics_diff.py),
the offline plots page in headless Chromium and the pull-request workflow's steps. (The workflow is
linted by tools/lint_workflows.sh in CI and pre-commit, not here: it needs Node.js.)"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import vl_convert
import yaml
from dvc_repo import ROOT, TINY
from dvc_repo import deep_update as _deep_update
from dvc_repo import dvc_env as _env
from dvc_repo import run as _run

from lmclab.pipeline.stage import load_yaml
from lmclab.report.headline import PAIR_METRICS, THREE_METRICS
from lmclab.report.metric_gate import parse_tolerances, tolerance_for

pytestmark = pytest.mark.slow

MERGE_MANY_HEADLINE = ("merged_acc", "naive_acc", "ensemble_acc", "<method>_acc")  # as docs/comparing.md names them
PARAMS = _deep_update(
    copy.deepcopy(TINY),
    {
        "permute": {
            "methods": ["identity", "wm", "am", "wm_sinkhorn"],  # one iterative search: its curves
            "wm_sinkhorn": {"epochs": 2, "iterations": 2},
        },
        "three": {"methods": ["wm"]},
    },
)


@pytest.fixture(scope="module")
def ran(tiny_run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The session's tiny run restored, rerun with ``PARAMS`` (one iterative search more) and committed:
    (repo, what the first `dvc repro` and this one printed)."""
    repo = tiny_run.restore(tmp_path_factory.mktemp("interface"))
    (repo / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    out = _run(repo, "dvc", "repro")
    assert "Running stage 'permute@pair0-wm_sinkhorn'" in out and "Running stage 'train@0'" not in out
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "baseline")
    return repo, tiny_run.output + out


def _reset(repo: Path) -> None:
    """Back to the committed baseline (experiments apply their results to the workspace)."""
    _run(repo, "git", "reset", "-q", "--hard")
    _run(repo, "dvc", "checkout", "-q")


def _gate(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["python", "tools/metrics_diff.py", *args], cwd=repo, env=_env(), capture_output=True, text=True
    )


def test_a_run_prints_no_library_warnings_and_no_progress_bars_off_a_terminal(ran):
    _, out = ran
    assert not re.search(r"Warning\b", out), out
    assert "it/s" not in out and "s/it" not in out  # tqdm stays quiet when stdout is not a terminal


def test_the_headline_metrics_are_the_documented_set(ran):
    repo, _ = ran
    headline = json.loads((repo / "metrics/headline.json").read_text())
    assert list(headline) == ["endpoints", "identity", "wm", "am", "wm_sinkhorn", "merge_many"]
    assert set(headline["wm"]) == {*PAIR_METRICS, *THREE_METRICS}  # wm is also a three-model method
    assert set(headline["am"]) == set(PAIR_METRICS) and set(headline["merge_many"]) == {
        *MERGE_MANY_HEADLINE[:3],
        *(f"{m}_acc" for m in PARAMS["merge_many"]["methods"] if m != "merge_many"),
    }
    assert headline["identity"]["L2_red"] == 0 and headline["wm"]["L2_red"] > 0
    assert 10 < headline["endpoints"]["acc"] <= 100
    shown = json.loads(_run(repo, "dvc", "metrics", "show", "--json", stdout_only=True))
    (workspace,) = shown.values()
    live = [f"dvclive/seed{seed}/metrics.json" for seed in PARAMS["train"]["seeds"]]  # training, per seed
    assert sorted(workspace["data"]) == sorted(["metrics/headline.json", *live])  # the detail JSON is no DVC metric
    assert "test_loss_barrier_mid" in json.loads((repo / "reports/detail/summary.json").read_text())["wm"]
    page = (ROOT / "docs" / "comparing.md").read_text()  # the docs' table of headline metrics
    for name in ("endpoints.acc", *PAIR_METRICS, *THREE_METRICS, *MERGE_MANY_HEADLINE):
        assert f"`{name}`" in page or f"`<method>.{name}`" in page or f"`merge_many.{name}`" in page, name


def test_plots_show_returns_data_for_every_declared_plot(ran):
    repo, _ = ran
    declared = [
        next(iter(p)) if isinstance(p, dict) else p for p in yaml.safe_load((repo / "dvc.yaml").read_text())["plots"]
    ]
    shown = json.loads(_run(repo, "dvc", "plots", "show", "--json", stdout_only=True))["data"]
    for plot_id in declared:
        if plot_id == "reports/figures":
            images = [k for k in shown if k.startswith("reports/figures/")]
            assert "reports/figures/interpolation.png" in images and all(shown[k][0]["type"] == "image" for k in images)
            continue
        (entry,) = shown[plot_id]
        values = entry["content"]["data"]["values"]
        assert entry["type"] == "vega" and values, plot_id
        assert entry["content"]["title"] and "<DVC_METRIC" not in json.dumps(entry["content"]), plot_id
    methods = {v["method"] for v in shown["interpolation_test_loss"][0]["content"]["data"]["values"]}
    assert methods == set(PARAMS["permute"]["methods"])


def test_the_gate_passes_an_identical_rerun_and_names_a_metric_beyond_tolerance(ran, tmp_path):
    repo, _ = ran
    _reset(repo)
    _run(repo, "dvc", "repro", "-f")  # recompute everything: same machine, same numbers
    proc = _gate(repo, "--out", str(tmp_path / "same.md"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("PASS") and "| `wm.B_loss` |" in (tmp_path / "same.md").read_text()

    rules = parse_tolerances(load_yaml(repo / "metrics/tolerances.yaml"))
    allowed = tolerance_for("wm.B_loss", rules).allowed(0.0)
    headline = json.loads((repo / "metrics/headline.json").read_text())
    within, beyond = copy.deepcopy(headline), copy.deepcopy(headline)
    within["wm"]["B_loss"] += 0.5 * allowed
    beyond["wm"]["B_loss"] += 2 * allowed
    for doc, code in ((within, 0), (beyond, 1)):
        (repo / "metrics/headline.json").write_text(json.dumps(doc))
        proc = _gate(repo, "--out", str(tmp_path / "pushed.md"))
        assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stdout.startswith("FAIL: 1 of") and "wm.B_loss (beyond)" in proc.stdout
    assert "❌ beyond" in (tmp_path / "pushed.md").read_text()
    del beyond["am"]  # a headline metric that disappears is no pass either
    (repo / "metrics/headline.json").write_text(json.dumps(beyond))
    assert "am.B_loss (missing in this run)" in _gate(repo, "--out", str(tmp_path / "gone.md")).stdout
    _reset(repo)


def test_exp_show_carries_the_headline_metrics_of_two_experiments(ran):
    repo, _ = ran
    _reset(repo)
    _run(repo, "dvc", "exp", "run", "-n", "soft-lr", "-S", "permute.wm_sinkhorn.lr=0.5")
    # DVC 3.67 also prints a hash column per changed data dependency (data/perms/…, data/measure, …);
    # without those, the changed parameter and every changed headline metric fit 160 columns
    table = subprocess.run(
        ["dvc", "exp", "show", "--only-changed", "--no-pager", "--drop", "data/"],
        cwd=repo,
        env={**_env(), "COLUMNS": "160"},
        capture_output=True,
        text=True,
    ).stdout
    header = table.splitlines()[1]
    assert "…" not in table and "permute.wm_sinkhorn.lr" in header, table
    assert {"wm_sinkhorn.B_loss", "wm_sinkhorn.L2_red", "wm_sinkhorn.R03"} <= set(header.split()), table
    _reset(repo)  # the next experiment starts from the baseline, not from soft-lr's applied params
    _run(repo, "dvc", "exp", "run", "-n", "one-sweep", "-S", "permute.wm.max_iter=1")
    rows = json.loads(_run(repo, "dvc", "exp", "show", "--json", stdout_only=True))
    exps = {e["name"]: e["revs"][0]["data"] for row in rows for e in row.get("experiments") or []}
    assert {"one-sweep", "soft-lr"} <= set(exps)
    for data in exps.values():
        headline = data["metrics"]["metrics/headline.json"]["data"]
        assert set(headline["wm"]) == {*PAIR_METRICS, *THREE_METRICS}
    diff = _run(repo, "dvc", "metrics", "diff", "soft-lr", "one-sweep", stdout_only=True)
    assert "wm_sinkhorn.B_loss" in diff and "endpoints.acc" not in diff  # only what changed
    _reset(repo)
    # the sweep study reads each experiment's tables from its DVC cache, and the workspace's own run
    _run(
        repo,
        "python",
        "-m",
        "lmclab",
        "study",
        "sweep",
        "--param",
        "permute.wm_sinkhorn.lr",
        "--exps",
        "soft-lr",
        "--workspace",
        "--methods",
        "identity,wm_sinkhorn",
        "--out",
        "reports/sweep",
    )
    table = pd.read_parquet(repo / "reports" / "sweep" / "table.parquet")
    assert sorted(table["value"].unique()) == [0.5, PARAMS["permute"]["wm_sinkhorn"]["lr"]]
    soft = exps["soft-lr"]["metrics"]["metrics/headline.json"]["data"]["wm_sinkhorn"]["B_loss"]
    assert table[(table["value"] == 0.5) & (table["method"] == "wm_sinkhorn")]["B_half_mean"].item() == pytest.approx(
        soft, abs=1e-6
    )
    assert (
        "| wm_sinkhorn's B_half falls as permute.wm_sinkhorn.lr grows |"
        in (repo / "reports" / "sweep" / "sweep.md").read_text()
    )
    _reset(repo)


def _chromium() -> str | None:
    return next(
        (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
    )


def test_the_plots_page_renders_offline_in_headless_chromium(request, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Chromium (.ci/run installs Debian's package)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    repo, _ = request.getfixturevalue("ran")  # after the check: no tiny pipeline run just to skip
    assert (repo / ".dvc/offline_plots.html").is_file(), "run `make setup` (builds the offline template)"
    _run(repo, "dvc", "plots", "show", "-o", str(tmp_path / "page"))
    page = (tmp_path / "page" / "index.html").read_text()
    assert not re.search(r"<script[^>]+src=", page) and "cdn.jsdelivr" not in page  # nothing to fetch
    assert f"vega-embed {vl_convert.get_vega_embed_version()}" in page  # the bundle of tools/offline_plots.py
    n_charts = page.count("vegaEmbed('#")
    declared = yaml.safe_load((repo / "dvc.yaml").read_text())["plots"]
    n_vega = sum(isinstance(p, dict) for p in declared)  # the one plain path is the folder of PNG figures
    n_vega += len(list(repo.glob("dvclive/seed*/plots/metrics/**/*.tsv")))  # the train stage's DVCLive curves
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            (tmp_path / "page" / "index.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    drawn = len(re.findall(r'<(?:canvas|svg)\b[^>]*\bclass="marks"', dom))  # one per chart vega drew
    marks = len(re.findall(r'aria-roledescription="[a-z]+ mark"', dom))  # the lines and points of the data
    assert n_charts == n_vega and drawn == n_charts and marks >= n_charts, (n_vega, n_charts, drawn, marks)


def test_the_pull_request_workflow_runs_the_tests_the_gate_and_the_comment():
    text = (ROOT / ".github/workflows/pull-request.yml").read_text()
    assert "cml comment create" in text and "actions/cache" in text and "make metrics-diff" in text
