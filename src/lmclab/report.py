"""The Markdown report a researcher reads: tables in the paper's layout plus the figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lmclab.plots import label


def _pm(values: pd.Series, digits: int = 3) -> str:
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.{digits}f} ± {std:.{digits}f}"


def table1(pairs: pd.DataFrame, methods: Sequence[str], split: str = "test") -> str:
    """Table 1 layout: B_½, Taylor, Diff., ‖θa−θb‖, ‖θa−π(θb)‖, reduction %. Columns not yet
    computed by the pipeline are shown as "—"."""
    head = ("| method | B_½ (loss) | Taylor approx. | Diff. | ‖θa−θb‖ | ‖θa−π(θb)‖ | reduction % |\n"
            "|---|---|---|---|---|---|---|")
    lines = [head]
    for m in methods:
        r = pairs[pairs["method"] == m]
        taylor = _pm(r["taylor_barrier_mid"]) if "taylor_barrier_mid" in r else "—"
        diff = (_pm(r["taylor_barrier_mid"] - r[f"{split}_loss_barrier_mid"])
                if "taylor_barrier_mid" in r else "—")
        lines.append(f"| {label(m)} | {_pm(r[f'{split}_loss_barrier_mid'])} | {taylor} | {diff} | "
                     f"{_pm(r['l2_before'])} | {_pm(r['l2_after'])} | {_pm(r['l2_reduction_pct'], 2)} |")
    return "\n".join(lines)


def barrier_table(pairs: pd.DataFrame, methods: Sequence[str]) -> str:
    """Every barrier: loss and accuracy (points), max over λ and at λ = ½, train and test."""
    cols = [(f"{s}_{q}_barrier_{k}", f"{s} {q} {'max' if k == 'max' else '½'}")
            for s in ("train", "test") for q in ("loss", "acc") for k in ("max", "mid")]
    lines = ["| method | " + " | ".join(c[1] for c in cols) + " | search s |",
             "|---|" + "---|" * (len(cols) + 1)]
    for m in methods:
        r = pairs[pairs["method"] == m]
        cells = [_pm(r[c[0]], 2 if "acc" in c[0] else 3) for c in cols]
        lines.append(f"| {label(m)} | " + " | ".join(cells) + f" | {_pm(r['search_seconds'], 2)} |")
    return "\n".join(lines)


def endpoint_table(history: pd.DataFrame) -> str:
    last = history.sort_values("epoch").groupby("seed").tail(1)
    lines = ["| seed | epochs | train loss | test loss | test acc % |", "|---|---|---|---|---|"]
    for _, r in last.iterrows():
        lines.append(f"| {int(r['seed'])} | {int(r['epoch'])} | {r['train_loss']:.4f} | "
                     f"{r['test_loss']:.4f} | {100 * r['test_acc']:.2f} |")
    return "\n".join(lines)


def write_report(path: Path, *, title: str, pairs: pd.DataFrame, history: pd.DataFrame,
                 methods: Sequence[str], figures: dict[str, Path]) -> Path:
    """Write ``report.md``; figure paths are made relative to the report's folder."""
    path = Path(path)
    rel = {k: Path(v).relative_to(path.parent).as_posix() for k, v in figures.items()}
    n_pairs = pairs["pair"].nunique()
    text = f"""# {title}

Mean ± sample std over {n_pairs} pair(s): {", ".join(sorted(pairs["pair"].unique()))}.
λ = 1 is θa, λ = 0 is π(θb); barriers follow SPEC.md §2 (max over the λ grid, and at λ = ½).

## Endpoints

{endpoint_table(history)}

![training]({rel["training"]})

## Table 1 layout (test split, λ = ½)

{table1(pairs, methods)}

## Barriers (loss in nats, accuracy in percentage points)

{barrier_table(pairs, methods)}

## Interpolation curves

![interpolation]({rel["interpolation"]})
"""
    if "search_curves" in rel:
        text += f"""
## Search learning curves (paper Figure 6)

Per epoch of the iterative searches: L2 distance with the current hard permutation and the
merged midpoint model's test loss and accuracy (epoch 0 is the initial permutation).

![search curves]({rel["search_curves"]})
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
