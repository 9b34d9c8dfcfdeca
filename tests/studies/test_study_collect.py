"""``lmclab study three collect`` and ``lmclab study transformer collect`` on runs made here: what each reads
of an experiment's or a run's files ends up in the study's tables and page."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
import torch
import yaml
from dvc_repo import ROOT
from typer.testing import CliRunner

from lmclab.cli import app

# what the connect stage's edges.json holds per edge (collect adds the triple, method, point and search columns)
ADDED = ["triple", "method", "point", "axis", "value", "stalled", "objective"]


def test_three_collect_tabulates_each_experiments_edges_under_their_method(tmp_path, monkeypatch) -> None:
    import lmclab.pipeline.runs as runs

    committed = pd.read_parquet(ROOT / "reports/three_study/edges.parquet")
    default = committed[committed["point"] == "default"].reset_index(drop=True)
    files = {}
    for (triple, method), rows in default.groupby(["triple", "method"], sort=False):
        seeds = triple.removeprefix("seed").replace("-seed", ",")
        blob = {"seeds": seeds, "method": method, "edges": rows.drop(columns=ADDED).to_dict("records")}
        blob["search"] = {"b": {"objective": [1.0, 2.0]}}  # θb's search: the a–b edge's ⟨θa, π(θb)⟩
        files[f"data/connect/{seeds}/{method}/edges.json"] = json.dumps(blob)

    def experiment_files(rev: str, pattern: str) -> dict[str, str]:
        assert (rev, pattern) == ("three-default", "data/connect/*/*/edges.json")
        return files

    monkeypatch.setattr(runs, "experiment_files", experiment_files)
    args = ["study", "three", "collect", "--out", str(tmp_path), "--points", "default", "--dpi", "30"]
    result = CliRunner().invoke(app, [*args, "--params", str(ROOT / "params.yaml")])
    assert result.exit_code == 0, result.output
    assert "default: 27 edges" in result.output
    edges = pd.read_parquet(tmp_path / "edges.parquet")
    measured = [c for c in default.columns if c not in ("stalled", "objective")]
    pd.testing.assert_frame_equal(edges[measured], default[measured])
    assert edges.loc[edges["edge"] == "a-b", "objective"].tolist() == [2.0] * 9
    assert edges.loc[edges["edge"] != "a-b", "objective"].isna().all() and not edges["stalled"].any()


def test_three_collect_refuses_when_no_experiment_has_finished_and_writes_nothing(tmp_path, monkeypatch) -> None:
    import lmclab.pipeline.runs as runs

    def experiment_files(rev: str, pattern: str) -> dict[str, str]:
        raise RuntimeError(f"unknown revision {rev}\nmore")  # dvc: still queued, or failed

    monkeypatch.setattr(runs, "experiment_files", experiment_files)
    args = ["study", "three", "collect", "--out", str(tmp_path), "--points", "default", "--dpi", "30"]
    result = CliRunner().invoke(app, [*args, "--params", str(ROOT / "params.yaml")])
    assert result.exit_code == 1 and result.output == (
        "default: left out (RuntimeError: unknown revision three-default)\n"
        "error: no finished study experiment; run `lmclab study three queue` first\n"
    )
    assert list(tmp_path.iterdir()) == []


def _transformer_run(folder, objective: str) -> str:
    """A finished run of the ViT preset (``objective`` supervised or mae) in its own git repository: two pairs
    of identity and WM, whose P_res keeps 1 and ½ of the units in place; its commit."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"].update(objective=objective, seeds=[0, 1, 2, 3], epochs=2)
    (folder / "data" / "tables").mkdir(parents=True)
    (folder / "data" / "history").mkdir()
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    rows = []
    for i, pair in enumerate(("seed0-seed1", "seed2-seed3")):
        for method, p_res in (("identity", [0, 1, 2, 3]), ("wm", [1, 0, 2, 3])):
            (folder / "data" / "perms" / pair / method).mkdir(parents=True)
            torch.save({"P_res": torch.tensor(p_res)}, folder / "data" / "perms" / pair / method / "perm.pt")
            barrier = (1.0 if method == "identity" else 0.1) + i / 10
            rows.append({"pair": pair, "method": method, "norepair_test_loss_barrier_mid": barrier})
    pd.DataFrame(rows).to_parquet(folder / "data" / "tables" / "pairs.parquet")
    acc = [0.5, 0.9] if objective == "supervised" else [float("nan")] * 2
    history = {"epoch": [1, 2], "test_loss": [2.0, 1.0], "test_acc": acc}
    if objective == "mae":  # only MAE pretraining times its epochs; supervised training records no seconds
        history["seconds"] = [3.0, 5.0]
    pd.DataFrame(history).to_parquet(folder / "data" / "history" / "seed0.parquet")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "run"], ["rev-parse", "HEAD"]):
        done = subprocess.run([*git, *command], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_transformer_collect_reads_each_runs_pairs_permutations_history_and_commit(tmp_path) -> None:
    heads = {name: _transformer_run(tmp_path / name, kind) for name, kind in (("vit", "supervised"), ("mae", "mae"))}
    out = tmp_path / "out"
    args = ["study", "transformer", "collect", "--run", f"vit={tmp_path / 'vit'}", "--run", f"mae={tmp_path / 'mae'}"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "table.parquet")
    assert list(zip(table["run"], table["method"], strict=True)) == [(r, m) for r in heads for m in ("identity", "wm")]
    assert table["p_res_identity"].tolist() == [1.0, 0.5, 1.0, 0.5]
    assert table["B_mid"].tolist() == pytest.approx([1.05, 0.15, 1.05, 0.15])
    runs = json.loads((out / "runs.json").read_text())
    for name, head in heads.items():
        assert 4 <= len(runs[name]["commit"]) < len(head) and head.startswith(runs[name]["commit"])  # --short
    assert (runs["vit"]["mae"], runs["vit"]["final_test_acc"], runs["mae"]["final_test_acc"]) == (None, 0.9, None)
    assert runs["mae"]["mae"]["mask_ratio"] == 0.75 and runs["mae"]["seconds_per_epoch"] == 4.0
    assert runs["vit"]["seconds_per_epoch"] is None  # a history without times gives none, not a made-up one
    assert f"- **vit** (commit {runs['vit']['commit']}): ViT patch 4" in (out / "transformers.md").read_text()


@pytest.mark.parametrize("item", ["{run}", "x={run}"], ids=["no-name", "no-run"])
def test_transformer_collect_refuses_a_run_without_a_name_or_a_folder_without_pairs(
    tmp_path, monkeypatch, item: str
) -> None:
    item = item.format(run=tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "data" / "tables").mkdir(parents=True)
    (tmp_path / "data" / "tables" / "pairs.parquet").touch()  # the folder the command runs in looks like a run
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["study", "transformer", "collect", "--run", item, "--out", str(out)])
    expected = f"error: --run: expected NAME=DIR of a finished run (DIR/data/tables/pairs.parquet), got {item!r}\n"
    assert result.exit_code == 1 and result.output == expected
    assert not out.exists()


def _vit_run(folder, width: int, symmetry: str, scale: float, families: bool = False) -> None:
    """A finished supervised ViT run of ``width`` aligned by ``symmetry``: the pairs of :func:`_transformer_run`
    with their barriers × ``scale``, each circuit-space barrier 0.9 of it (and the barriers by family)."""
    _transformer_run(folder, "supervised")
    params = yaml.safe_load((folder / "params.yaml").read_text())
    params["model"]["vit"]["width"], params["permute"]["symmetry"] = width, symmetry
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    tables = folder / "data" / "tables"
    pairs = pd.read_parquet(tables / "pairs.parquet")
    pairs["norepair_test_loss_barrier_mid"] *= scale
    pairs.assign(test_loss_barrier_mid_circuits=0.9 * pairs["norepair_test_loss_barrier_mid"]).to_parquet(
        tables / "pairs.parquet"
    )
    if families:
        rows = [
            {"pair": p, "method": m, "family": f, "alone": -0.1 * scale, "all_but": b * scale}
            for p in ("seed0-seed1", "seed2-seed3")
            for m in ("identity", "wm")
            for f, b in (("(all)", 1.0), ("blocks.*.fc1", 0.4))
        ]
        pd.DataFrame(rows).to_parquet(tables / "families.parquet")


def test_transformer_collect_sets_the_widths_the_families_and_theus_et_al_beside_the_table(tmp_path) -> None:
    for name, width, symmetry, scale in (
        ("vit", 48, "permutation", 1.0),
        ("vit-orthogonal", 48, "orthogonal", 0.5),
        ("w24", 24, "permutation", 0.8),
        ("w24-orthogonal", 24, "orthogonal", 0.2),
        ("w96", 96, "permutation", 1.2),
    ):
        _vit_run(tmp_path / name, width, symmetry, scale, families=width == 48)
    out = tmp_path / "out"
    args = ["study", "transformer", "collect", "--run", f"supervised={tmp_path / 'vit'}", "--out", str(out)]
    args += ["--run", f"orthogonal={tmp_path / 'vit-orthogonal'}"]
    for name in ("w24", "w24-orthogonal", "w96"):
        args += ["--width", str(tmp_path / name)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert set(pd.read_parquet(out / "table.parquet")["run"]) == {"supervised", "orthogonal"}  # the others: widths
    widths = pd.read_parquet(out / "widths.parquet")
    wm = widths[widths["method"] == "wm@orthogonal"]
    assert wm["width"].tolist() == [24, 48] and wm["B_mid"].tolist() == pytest.approx([0.03, 0.075])
    page = (out / "transformers.md").read_text()
    assert (
        "| 24 | 0.840 ± 0.057 (0.756) | 0.120 ± 0.057 (0.108) | 0.210 ± 0.014 (0.189) | 0.030 ± 0.014 (0.027) |" in page
    )
    assert "| 96 | 1.260 ± 0.085 (1.134) | 0.180 ± 0.085 (0.162) | — | — |" in page
    assert (out / "widths.png").stat().st_size > 1000
    assert set(json.loads((out / "runs.json").read_text())) == {
        "supervised",
        "orthogonal",
        "supervised, width 24",
        "orthogonal, width 24",
        "supervised, width 96",
    }
    section = page[page.index("## Where the barrier is") : page.index("## Beside Theus")]
    assert "| `blocks.*.fc1` | -0.100 ± 0.000 | -0.100 ± 0.000 | -0.050 ± 0.000 | -0.050 ± 0.000 |" in section
    assert "| `blocks.*.fc1` | 0.400 ± 0.000 | 0.400 ± 0.000 | 0.200 ± 0.000 | 0.200 ± 0.000 |" in section
    head = "| family | naive (w/o) | WM (re-basin) | naive, canonical forms | WM (re-basin), orthogonal |"
    assert section.count(head) == 2  # alone, all but
    reduction = 100 * (1 - 0.075 / 1.05)  # of the supervised run's naive B½ (1.0 + 1.1) / 2
    assert f"| WM (re-basin), orthogonal | 0.075 | {reduction:.1f} | weight matching, data-free" in page
    assert page.rstrip().endswith("| 78.7 |")  # Theus et al.'s ViT: 1 − 0.36 / 1.69
    assert "| run | method | B½ | B½ REPAIR | B½ circuits |" in page
    refused = CliRunner().invoke(app, [*args, "--width", str(tmp_path / "none")])
    assert refused.exit_code == 1
    assert (
        refused.output
        == f"error: --width: expected a finished run (DIR/data/tables/pairs.parquet), got {str(tmp_path / 'none')!r}\n"
    )
