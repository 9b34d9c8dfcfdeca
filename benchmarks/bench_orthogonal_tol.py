"""Benchmark: where weight matching in the orthogonal group stops for each ``tol``, and what the alignment is
worth there. Its permutation steps end exactly (finitely many permutations), but its Procrustes steps converge
linearly: on independent pairs the default ``tol`` of 1e-7 is met late or never, and the search runs to
``max_iter``. This measures the trade for a researcher choosing ``tol`` or ``max_iter`` on a large model.

    python benchmarks/bench_orthogonal_tol.py --widths 256,512 --norms rmsnorm,layernorm

Each width and norm: lmclab's ``gpt`` with random weights (``bench_orthogonal.build``) and an independent
initialisation, matched by ``lmclab.align(…, method="wm", symmetry="orthogonal")`` for ``--sweeps`` sweeps with
``tol`` 0 (its objective after each sweep); for each ``tol`` of ``--tols``, the same search with that ``tol``: the
sweep it stops at (the descent is seeded, so its objectives are the longer one's prefix, checked), its seconds,
the objective it is short of the last sweep's by, and its L2 reduction (``lmclab.l2_reduction``).
Writes ``benchmarks/results/orthogonal_tol.json``; the performance page is generated from it.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from bench_orthogonal import CONTEXT, DEPTH, HEADS, NORMS, VOCAB, build
from record import RESULTS, record, this_run  # benchmarks/record.py: the one shape of a result

TOLS = "1e-3,1e-4,1e-5,1e-6,1e-7"


def measure(width: int, norm: str, sweeps: int, tols: list[float]) -> list[dict]:
    """One row per ``tol`` for the independent pair of ``width`` and ``norm``."""
    import torch

    import lmclab

    tokens = torch.randint(0, VOCAB, (4, CONTEXT), generator=torch.Generator().manual_seed(1))
    model_a, model_b = build(width, norm, seed=0), build(width, norm, seed=1)

    def search(tol: float) -> tuple[object, float]:
        start = time.perf_counter()
        options = {"max_iter": sweeps, "tol": tol}
        found = lmclab.align(
            model_a, model_b, method="wm", symmetry="orthogonal", options=options, example_inputs=tokens
        )
        return found, time.perf_counter() - start

    full, _ = search(0.0)
    objective, rows = full.stats["objective"], []
    for tol in tols:
        found, seconds = search(tol)  # the library's own stopping rule decides where
        k = found.stats["sweeps"]
        if found.stats["objective"] != objective[: k + 1]:
            raise RuntimeError(f"width {width}, {norm}: a search of {k} sweeps is not the longer one's prefix")
        rows.append(
            {
                "model": f"gpt, {norm}", "width": width, "tol": tol, "sweeps": k, "of": sweeps, "seconds": seconds,
                "short_of_last": (objective[-1] - objective[k]) / abs(objective[-1]),
                "l2_reduction": lmclab.l2_reduction(model_a, model_b, found),
            }
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main(
    widths: str = typer.Option("256,512", help="comma-separated model widths"),
    norms: str = typer.Option(",".join(NORMS), help=f"comma-separated, of {', '.join(NORMS)}"),
    tols: str = typer.Option(TOLS, help="comma-separated tolerances"),
    sweeps: int = typer.Option(100, min=2, help="the longest search: its sweeps (max_iter)"),
    out: Path = typer.Option(RESULTS / "orthogonal_tol.json"),
) -> None:
    run, rows = this_run(depth=DEPTH, heads=HEADS, context=CONTEXT, vocab=VOCAB, sweeps=sweeps), []
    for norm in norms.split(","):
        for width in (int(w) for w in widths.split(",")):
            rows += measure(width, norm, sweeps, [float(t) for t in tols.split(",")])
            record(out, rows, run=run)  # after each width: a long run keeps what it measured
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
