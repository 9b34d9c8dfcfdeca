"""Benchmark: the three-model landscape at the default resolution and MergeMany of N models.

Uses the default pipeline's checkpoints (data/models/seed*.pt) and prepared data; run `dvc repro`
first. Prints wall times and writes benchmarks/scratch/three.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import typer
import yaml
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.analysis.landscape import landscape, plane_grid
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.search.merge_many import merge_many

ROOT = Path(__file__).resolve().parent.parent


def main(out: Path = SCRATCH / "three.json") -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    three, many = params["three"], params["merge_many"]
    ckpts = [load_checkpoint(ROOT / f"data/models/seed{s}.pt") for s in three["triples"][0]]
    spec = get_arch(ckpts[0].arch).permutation_spec(ckpts[0].config)
    test = load_split(ROOT / "data/prepared", "test")
    grid = plane_grid(three["resolution"], three["margin"])
    model = build_model(ckpts[0].arch, ckpts[0].config)
    start = time.perf_counter()
    landscape(model, *(c.state_dict for c in ckpts), grid, test, keys=sorted(spec.matched(ckpts[0].state_dict)))
    plane_s = time.perf_counter() - start
    members = [load_checkpoint(ROOT / f"data/models/seed{s}.pt").state_dict for s in many["seeds"]]
    start = time.perf_counter()
    result = merge_many(
        spec, members, max_iter=many["max_iter"], tol=many["tol"], generator=torch.Generator().manual_seed(0)
    )
    many_s = time.perf_counter() - start
    rows = [
        {"work": "landscape", "grid": f"{len(grid)} x {len(grid)}", "test_images": len(test), "seconds": plane_s},
        {"work": "merge_many", "models": len(members), "iterations": result.stats["iterations"], "seconds": many_s},
    ]
    typer.echo(json.dumps(rows, indent=2))
    record(out, rows)


if __name__ == "__main__":
    typer.run(main)
