"""``lmclab study NAME`` and ``lmclab preset``: the seven studies over finished runs are subcommands of one
group, each keeping its own subcommands and options (their outputs are tested beside their library code in
tests/studies and tests/analysis)."""

from __future__ import annotations

from typer.testing import CliRunner

from lmclab.cli import app

STUDIES = {"lm": "collect", "many": "collect", "three": "queue", "transformer": "collect"}
SWEEPS = ("width", "sweep", "mixup")


def test_the_study_group_lists_the_seven_studies_and_each_its_own_options() -> None:
    listed = CliRunner().invoke(app, ["study", "--help"])
    assert listed.exit_code == 0
    assert all(f" {name} " in listed.output for name in [*STUDIES, *SWEEPS])
    for name, command in STUDIES.items():
        group = CliRunner().invoke(app, ["study", name, "--help"])
        assert group.exit_code == 0 and f" {command} " in group.output, name
    sweep = CliRunner().invoke(app, ["study", "sweep", "--help"])
    assert sweep.exit_code == 0 and "--param" in sweep.output and "--workspace" in sweep.output
    assert "preset" in CliRunner().invoke(app, ["--help"]).output


def test_a_sweep_study_names_a_parameter_its_experiments_lack(monkeypatch, tmp_path) -> None:
    """The swept value is read from each run's `dvc exp show` row; a key no row has is one line naming --param."""
    import lmclab.cli.studies.sweeps as sweeps

    def runs(value_of, tables, **_):
        return {value_of({"train.lr": 0.1}): {}}

    monkeypatch.setattr(sweeps, "experiment_runs", runs)
    result = CliRunner().invoke(app, ["study", "sweep", "--param", "train.nope", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "error: --param train.nope: not a parameter of these experiments" in result.output


def test_three_queue_prints_one_dvc_exp_per_point_in_a_dry_run() -> None:
    result = CliRunner().invoke(app, ["study", "three", "queue", "--points", "default,width-128", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[1].startswith("dvc exp run --queue -n three-width-128 -S ")
    assert "-S model.mlp.width=128 connect" in lines[1]
    unknown = CliRunner().invoke(app, ["study", "three", "queue", "--points", "nope", "--dry-run"])
    assert unknown.exit_code == 1 and "error: --points: unknown point(s) nope" in unknown.output
