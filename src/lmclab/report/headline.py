"""The headline metrics: the few numbers a researcher compares across experiments.

``dvc exp show`` turns every number of a file under ``metrics:`` into a column, and
``dvc metrics diff`` into a row, so only these go there (``metrics/headline.json``); every other
statistic stays in the Parquet tables, the detail JSON files and the report. Names are stable:

========================  ==========================================================================
``endpoints.acc``         mean test accuracy (%) of the trained endpoints (last epoch)
``<method>.B_loss``       test loss barrier at λ = ½, ``B_½`` (Tables 1–2), mean over pairs
``<method>.B_acc``        test accuracy barrier, max over λ, in percentage points, mean over pairs
``<method>.L2_red``       L2 reduction ``(‖θa−θb‖ − ‖θa−π(θb)‖)/‖θa−θb‖`` in %, mean over pairs
``<method>.R03``          alignment ``R_0.3(θa, π(θb))`` (Theorem 4.1), mean over pairs
``<method>.sec``          seconds the permutation search took, mean over pairs
``<method>.bc_B_loss``    three models: test loss barrier (max over λ) between π_b(θb) and π_c(θc)
``<method>.bc_B_acc``     the same for accuracy, points (Table 3 layout), mean over triples
``merge_many.merged_acc`` MergeMany average's test accuracy (%); ``naive_acc`` the unaligned
                          average; ``ensemble_acc`` the output ensemble of the same models;
                          ``<method>_acc`` each other n-model method's merge (``c2m3_acc``, …)
========================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

# headline name -> column of the ``pairs`` table (mean over pairs)
PAIR_METRICS = {
    "B_loss": "test_loss_barrier_mid",
    "B_acc": "test_acc_barrier_max",
    "L2_red": "l2_reduction_pct",
    "R03": "R_0.3",
    "sec": "search_seconds",
}
# headline name -> column of the ``three_edges`` table at edge b-c (mean over triples)
THREE_METRICS = {"bc_B_loss": "test_loss_barrier_max", "bc_B_acc": "test_acc_barrier_max"}
DIGITS = 6  # decimals kept: float noise below this is not a difference


def _mean(values: pd.Series) -> float:
    return round(float(values.astype(float).mean()), DIGITS)


def endpoint_metrics(history: pd.DataFrame) -> dict[str, float]:
    """``acc``: the endpoints' last-epoch test accuracy in %, mean over seeds."""
    last = history.sort_values(["seed", "epoch"]).groupby("seed").tail(1)
    return {"acc": _mean(100 * last["test_acc"])}


def pair_metrics(pairs: pd.DataFrame, method: str) -> dict[str, float]:
    """The per-method pair metrics of :data:`PAIR_METRICS` (a column the run lacks is skipped:
    ``R03`` needs 0.3 among ``measure.gammas``)."""
    rows = pairs[pairs["method"] == method]
    return {name: _mean(rows[col]) for name, col in PAIR_METRICS.items() if col in rows and len(rows)}


def three_metrics(edges: pd.DataFrame, method: str) -> dict[str, float]:
    """The b–c barriers of :data:`THREE_METRICS` for one method."""
    rows = edges[(edges["method"] == method) & (edges["edge"] == "b-c")]
    return {name: _mean(rows[col]) for name, col in THREE_METRICS.items() if len(rows)}


def merge_many_metrics(evaluation: pd.DataFrame) -> dict[str, float]:
    """Test accuracy (%) of the unrepaired merges: MergeMany's (``merged_acc``), the naive average, the
    ensemble and every other n-model method's (``<method>_acc``)."""
    test = evaluation[(evaluation["split"] == "test") & ~evaluation["repaired"].astype(bool)]
    acc = {m: round(100 * float(a), DIGITS) for m, a in zip(test["method"], test["acc"], strict=True) if m != "models"}
    names = {"merge_many": "merged_acc", "naive": "naive_acc", "ensemble": "ensemble_acc"}
    first = [m for m in names if m in acc]  # MergeMany's and the references' names first, as before
    return {names.get(m, f"{m}_acc"): acc[m] for m in [*first, *(m for m in acc if m not in names)]}


def headline_metrics(
    *,
    history: pd.DataFrame,
    pairs: pd.DataFrame,
    edges: pd.DataFrame,
    evaluation: pd.DataFrame,
    methods: Sequence[str],
    three_methods: Sequence[str],
) -> dict[str, dict[str, float]]:
    """``{"endpoints": …, <method>: {pair and three-model metrics}, "merge_many": …}`` (module doc)."""
    out: dict[str, dict[str, float]] = {"endpoints": endpoint_metrics(history)}
    for method in dict.fromkeys([*methods, *three_methods]):
        out[method] = {
            **(pair_metrics(pairs, method) if method in methods else {}),
            **(three_metrics(edges, method) if method in three_methods else {}),
        }
    out["merge_many"] = merge_many_metrics(evaluation)
    return out
