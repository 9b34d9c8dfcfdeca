"""The mixup comparison: endpoints trained with and without mixup — per value of
``train.mixup_alpha``, the endpoints' test accuracy and neural-collapse statistics (last history row of
every seed) and, per method, test B½ before (``identity``) and after alignment, L2 reduction and R_0.3
(every pair): mean ± sample std. Built from the saved ``pairs`` and ``history`` tables of each run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

ENDPOINT = {"test_acc": "acc %", "nc1": "NC1", "nc2_etf": "ETF distance", "nc_equinorm": "equinorm CV"}
PAIR = {"test_loss_barrier_mid": "B½", "l2_reduction_pct": "L2 red. %", "R_0.3": "R_0.3"}


def _pm(values: pd.Series, scale: float = 1.0) -> str:
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{scale * values.mean():.3f} ± {scale * std:.3f}"


def mixup_table(runs: Mapping[float, Mapping[str, pd.DataFrame]], methods: Sequence[str]) -> pd.DataFrame:
    """One row per ``mixup_alpha``: the endpoint columns, then ``<method> <quantity>`` columns."""
    rows = []
    for alpha, tables in sorted(runs.items()):
        history = tables["history"]
        last = history.sort_values("epoch").groupby("seed").tail(1)
        row = {"mixup_alpha": alpha, "seeds": int(last["seed"].nunique())}
        for key, name in ENDPOINT.items():
            if key in last:
                row[name] = _pm(last[key].astype(float), 100.0 if key == "test_acc" else 1.0)
        pairs = tables["pairs"]
        for method in methods:
            sub = pairs[pairs["method"] == method]
            for key, name in PAIR.items():
                if len(sub) and key in sub:
                    row[f"{method} {name}"] = _pm(sub[key].astype(float))
        rows.append(row)
    return pd.DataFrame(rows)


def mixup_markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, endpoints first, then one block of columns per method."""
    header = "| " + " | ".join(table.columns) + " |"
    lines = [header, "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
