"""Benchmark: what weight matching in the orthogonal group of a transformer's stream costs beside the
permutations alone, and what each finds, on lmclab's ``gpt`` (RMSNorm, rotary positions, untied head) and
its LayerNorm variant (a centred stream) at several widths.

    python benchmarks/bench_orthogonal.py --widths 64,128,256,512 --repeats 3

Each width: θa with random weights and random norm gains; two θb — *planted*, the canonical form of θa
(``lmclab.canonicalize``) with its stream rotated by a random orthogonal (or centred) map, its MLP units
permuted, its heads reordered and rotated inside each head (values freely; queries and keys per rotary plane
since the tracer marks them rotary: the committed results predate that, when they moved whole), and
*independent*, another random initialisation. Each pair is matched by
``lmclab.align(…, method="wm", symmetry=…)`` with ``permutation`` and with ``orthogonal``, alternating, and
each row keeps the median seconds over ``--repeats`` runs, the sweeps of the last, and the L2 reduction
(``lmclab.l2_reduction``: 100 % is θb brought onto θa). No training: the rows measure the search, not the
barrier. Writes ``benchmarks/results/orthogonal.json``; the performance page (``tools/performance_page.py``)
is generated from it.
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
NORMS = ("rmsnorm", "layernorm")
VOCAB, CONTEXT, DEPTH, HEADS = 256, 32, 4, 4


def build(width: int, norm: str, seed: int):
    """lmclab's ``gpt`` of ``width`` with random weights and norm gains drawn from [0.5, 1.5]."""
    import torch

    from lmclab.archs import gpt

    config = gpt.Config(
        input_shape=(CONTEXT,), num_classes=VOCAB, width=width, depth=DEPTH, heads=HEADS, mlp_ratio=4,
        norm=norm, position="rotary", tie_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = gpt.Model(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key and key.endswith("weight"):
                p.uniform_(0.5, 1.5)
    return model


def planted(model, tokens):
    """The canonical form of ``model`` moved by a random element of every group of its kinds."""
    import torch

    import lmclab
    from lmclab.core.spec import apply_permutation, random_permutation

    canonical = lmclab.canonicalize(model, tokens)
    spec, state = lmclab.trace_spec(canonical, tokens, symmetry="orthogonal"), canonical.state_dict()
    element = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(9), spec.heads, spec.kinds)
    twin = copy.deepcopy(canonical)
    twin.load_state_dict(apply_permutation(spec, element, state))
    return twin


def measure(width: int, norm: str, repeats: int) -> list[dict]:
    """The four rows of one width and norm (two pairs × two symmetries)."""
    import torch

    import lmclab

    tokens = torch.randint(0, VOCAB, (4, CONTEXT), generator=torch.Generator().manual_seed(1))
    model_a = build(width, norm, seed=0)
    pairs = {"planted": planted(model_a, tokens), "independent": build(width, norm, seed=1)}
    parameters = sum(p.numel() for p in model_a.parameters())
    rows = []
    for pair, model_b in pairs.items():
        seconds: dict[str, list[float]] = {"permutation": [], "orthogonal": []}
        last = {}
        for _ in range(repeats):
            for symmetry in seconds:  # alternating: a drift of the machine touches both alike
                start = time.perf_counter()
                found = lmclab.align(model_a, model_b, method="wm", symmetry=symmetry, example_inputs=tokens)
                seconds[symmetry].append(time.perf_counter() - start)
                last[symmetry] = found
        for symmetry, found in last.items():
            rows.append(
                {
                    "model": f"gpt, {norm}", "width": width, "parameters": parameters, "pair": pair,
                    "symmetry": symmetry, "kinds": sorted(set(found.spec.kinds.values())),
                    "seconds": statistics.median(seconds[symmetry]), "all_seconds": seconds[symmetry],
                    "sweeps": found.stats.get("sweeps"),
                    "l2_reduction": lmclab.l2_reduction(model_a, model_b, found),
                }
            )  # fmt: skip
    return rows


def main(
    widths: str = typer.Option("64,128,256,512", help="comma-separated model widths"),
    norms: str = typer.Option(",".join(NORMS), help=f"comma-separated, of {', '.join(NORMS)}"),
    repeats: int = typer.Option(3, min=1, help="runs of each search, alternating; the median is kept"),
    out: Path = typer.Option(ROOT / "benchmarks/results/orthogonal.json"),
) -> None:
    sizes = [int(w) for w in widths.split(",")]
    if any(w < HEADS or w % HEADS for w in sizes):
        raise typer.BadParameter(f"widths must be multiples of {HEADS}, got {widths}", param_hint="--widths")
    if unknown := set(norms.split(",")) - set(NORMS):
        raise typer.BadParameter(f"unknown norms {sorted(unknown)}; choose from {list(NORMS)}", param_hint="--norms")
    run, rows = this_run(repeats=repeats, depth=DEPTH, heads=HEADS, context=CONTEXT, vocab=VOCAB), []
    for norm in norms.split(","):
        for width in sizes:
            rows += measure(width, norm, repeats)
            for row in rows[-4:]:
                typer.echo(
                    f"{row['model']} {width} {row['pair']} {row['symmetry']}: {row['seconds']:.2f} s, "
                    f"L2 reduction {row['l2_reduction']:.2f} %"
                )
            record(out, rows, run=run)  # after each width: a long run keeps what it measured
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
