"""Learning curves of the iterative searches: the long table, the figure and the report section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lmclab.report.document import write_report
from lmclab.report.plots import plot_search_curves
from lmclab.report.summary import SEARCH_CURVE_COLUMNS, tables


def _record(seed_a: int, seed_b: int, method: str, curve: list[dict] | None) -> dict:
    search = {"seconds": 1.0, **({"curve": curve} if curve is not None else {})}
    summary = {"test_loss_barrier_mid": 0.1, "l2_before": 2.0, "l2_after": 1.0, "l2_reduction_pct": 50.0}
    return {
        "seed_a": seed_a,
        "seed_b": seed_b,
        "method": method,
        "search": search,
        "summary": summary,
        "curve": [{"split": "test", "lam": lam, "loss": 1.0, "acc": 0.5} for lam in (0.0, 0.5, 1.0)],
    }


def test_search_curves_long_table_and_figure(tmp_path: Path) -> None:
    curve = [
        {"epoch": e, "l2": 3.0 - e, "test_loss": 1.0 / (e + 1), "test_acc": 0.5 + 0.1 * e, "soft_loss": 0.0}
        for e in range(3)
    ]
    records = [_record(0, 1, "wm", None), _record(0, 1, "wm_sinkhorn", curve), _record(2, 3, "wm_sinkhorn", curve)]
    frame = tables(records)["search_curves"]
    assert list(frame.columns) == list(SEARCH_CURVE_COLUMNS)
    assert len(frame) == 6 and set(frame["method"]) == {"wm_sinkhorn"}
    assert frame[frame["pair"] == "seed2-seed3"]["l2"].tolist() == [3.0, 2.0, 1.0]
    frame.to_parquet(tmp_path / "search_curves.parquet", index=False)
    figure = plot_search_curves(
        pd.read_parquet(tmp_path / "search_curves.parquet"), tmp_path / "figures" / "search_curves.png"
    )
    assert figure.stat().st_size > 0
    pairs = tables(records)["pairs"].assign(
        **{
            c: 0.0
            for c in (
                "train_loss_barrier_max",
                "train_loss_barrier_mid",
                "train_acc_barrier_max",
                "train_acc_barrier_mid",
                "test_loss_barrier_max",
                "test_acc_barrier_max",
                "test_acc_barrier_mid",
            )
        }
    )
    history = pd.DataFrame([{"seed": 0, "epoch": 1, "train_loss": 1.0, "test_loss": 1.0, "test_acc": 0.9}])
    report = write_report(
        tmp_path / "report.md",
        title="t",
        pairs=pairs,
        history=history,
        methods=["wm", "wm_sinkhorn"],
        figures={"interpolation": figure, "training": figure, "search_curves": figure},
    )
    assert "Search learning curves (paper Figure 6)" in report.read_text()
    assert "figures/search_curves.png" in report.read_text()


def test_no_iterative_method_gives_empty_table_with_columns() -> None:
    frame = tables([_record(0, 1, "wm", None)])["search_curves"]
    assert frame.empty and list(frame.columns) == list(SEARCH_CURVE_COLUMNS)
