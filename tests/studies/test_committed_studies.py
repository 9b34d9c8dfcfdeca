"""The committed studies are what the code makes of their committed tables: the three-model study's table
and page from its edges, each sweep's table, trends and page from its points, the transformer and
n-model studies' pages from their tables and runs, the mixup page's table (the experiments themselves take
hours; their tables are kept in git)."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from dvc_repo import ROOT
from pandas.testing import assert_frame_equal

REPORTS = ROOT / "reports"


def _as_written(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` written to Parquet and read back, as the study tools store it (None for a missing object)."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return pd.read_parquet(io.BytesIO(buffer.getvalue()))


SWEEPS = {"lr": "train.lr", "weight_decay": "train.weight_decay"}


def test_the_three_model_study_is_its_edges_tabulated() -> None:
    from lmclab.cli.studies import three as three_study
    from lmclab.studies.three_study import study_markdown, study_table

    folder = REPORTS / "three_study"
    edges = pd.read_parquet(folder / "edges.parquet")
    table = study_table(edges)
    assert_frame_equal(_as_written(table), pd.read_parquet(folder / "table.parquet"))
    page = study_markdown(table, defaults=three_study.defaults(ROOT / "params.yaml"), rebuild=three_study.REBUILD)
    assert page == (folder / "three_study.md").read_text()


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_each_sweep_is_its_points_tabulated_with_the_papers_trends(name: str) -> None:
    from lmclab.studies.findings import roles
    from lmclab.studies.sweep import sweep_markdown, sweep_table, trends

    folder, param = REPORTS / "sweeps" / name, SWEEPS[name]
    points = pd.read_parquet(folder / "points.parquet")
    table = sweep_table(points)
    assert_frame_equal(_as_written(table), pd.read_parquet(folder / "table.parquet"))
    verdicts = trends(points, roles(list(points["method"].unique()))["WM"], param)
    assert json.loads(json.dumps(verdicts)) == json.loads((folder / "trends.json").read_text())
    page = f"# Sweep of {param} (Appendix H.5)\n\n![sweep](sweep.png)\n\n" + sweep_markdown(table, verdicts, param)
    assert page + "\n" == (folder / "sweep.md").read_text()


def test_the_transformer_study_page_is_its_table_and_runs() -> None:
    from lmclab.cli.studies import transformer as transformer_study

    folder = REPORTS / "transformers"
    table, runs = pd.read_parquet(folder / "table.parquet"), json.loads((folder / "runs.json").read_text())
    assert transformer_study.markdown(table, runs) == (folder / "transformers.md").read_text()


def test_the_transformer_studys_orthogonal_page_is_its_table_and_runs() -> None:
    from lmclab.cli.studies import transformer as transformer_study

    folder = REPORTS / "transformers" / "orthogonal"
    table, runs = pd.read_parquet(folder / "table.parquet"), json.loads((folder / "runs.json").read_text())
    widths, families = (
        pd.read_parquet(path) if (path := folder / f"{name}.parquet").is_file() else None
        for name in ("widths", "families")
    )
    assert {info["symmetry"] for info in runs.values()} == {"permutation", "orthogonal"}
    assert transformer_study.markdown(table, runs, widths, families) == (folder / "transformers.md").read_text()


def test_the_language_model_studys_orthogonal_page_is_its_tables_and_runs() -> None:
    from lmclab.cli.studies.lm_orthogonal import markdown

    folder = REPORTS / "lm"
    names = ("orthogonal", "orthogonal_roles", "orthogonal_widths")
    table, roles, widths = (pd.read_parquet(folder / f"{name}.parquet") for name in names)
    runs = json.loads((folder / "orthogonal_runs.json").read_text())
    learned, families = (
        pd.read_parquet(path) if (path := folder / f"orthogonal_{name}.parquet").is_file() else None
        for name in ("learned", "families")
    )
    assert set(table["method"]) >= {"identity", "wm@orthogonal", "ste@orthogonal"}
    assert markdown(table, roles, runs, widths, learned, families) == (folder / "orthogonal.md").read_text()


def test_the_many_models_page_is_its_tables_and_run() -> None:
    from lmclab.cli.studies import many

    folder = REPORTS / "many_models"
    tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in ("evaluation", "methods")}
    info = json.loads((folder / "run.json").read_text())
    assert many.markdown(info, tables["evaluation"], tables["methods"]) == (folder / "many_models.md").read_text()


def test_the_mixup_page_ends_with_its_table() -> None:
    from lmclab.studies.mixup import mixup_markdown

    folder = REPORTS / "mixup"
    table = pd.read_parquet(folder / "table.parquet")
    assert (folder / "mixup.md").read_text().endswith("\n\n" + mixup_markdown(table) + "\n")


def test_the_width_study_page_is_its_alignment_table() -> None:
    from lmclab.studies.width import alignment_markdown

    folder = REPORTS / "width"
    alignment = pd.read_parquet(folder / "alignment.parquet")
    page = "# Width study (Appendix H.4)\n\n![width](width.png)\n\n" + alignment_markdown(alignment) + "\n"
    assert page == (folder / "width.md").read_text()


def test_the_language_model_study_is_its_points_tabulated() -> None:
    """The table, the explanation, each sweep's summary and trends, and the page, from the committed points."""
    from lmclab.cli.studies import lm_page as lm_study
    from lmclab.studies.lm_study import explanation, method_table, sweep_summary, sweep_trends

    folder = REPORTS / "lm"
    points = pd.read_parquet(folder / "points.parquet")
    assert_frame_equal(_as_written(method_table(points)), pd.read_parquet(folder / "table.parquet"))
    methods = [m for m in lm_study.ALIGNING if m in set(points["method"])]
    found = explanation(points, methods)
    assert json.loads(json.dumps(found)) == json.loads((folder / "explanation.json").read_text())
    sweep_points = pd.read_parquet(folder / "sweep_points.parquet")
    summaries, verdicts = [], []
    for kind, rows in sweep_points.groupby("sweep", sort=False):
        rows = rows.drop(columns=["sweep"])
        summaries.append(sweep_summary(rows).assign(sweep=kind))
        verdicts += [v for m in ("wm", "wm_sinkhorn") if m in set(rows["method"]) for v in sweep_trends(rows, m, kind)]
    sweeps = pd.concat(summaries, ignore_index=True)
    assert_frame_equal(_as_written(sweeps), pd.read_parquet(folder / "sweep.parquet"))
    assert json.loads(json.dumps(verdicts)) == json.loads((folder / "trends.json").read_text())
    runs = json.loads((folder / "runs.json").read_text())
    roles = pd.read_parquet(folder / "roles.parquet")
    page = lm_study.markdown(method_table(points), roles, sweeps, verdicts, found, runs)
    assert page == (folder / "lm.md").read_text()
