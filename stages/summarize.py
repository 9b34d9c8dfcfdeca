"""Stage summarize: gather the measurements of the current params into Parquet tables
(``curves``, ``pairs``, ``history``, ``three_edges``, ``three_curves``, ``landscape``, ``merge_many``,
``merge_many_trace``) and ``metrics/{summary,three_models,merge_many}.json`` for ``dvc metrics``. ~2 s."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from common import one_line_errors, read_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(measure_dir: Path = typer.Option(...), perms_dir: Path = typer.Option(...),
         history_dir: Path = typer.Option(...), connect_dir: Path = typer.Option(...),
         merge_many_dir: Path = typer.Option(...), tables_dir: Path = typer.Option(...),
         metrics_dir: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    import pandas as pd

    from lmclab.summary import (merge_many_summary, metrics_summary, pair_name, tables, three_summary,
                                three_tables, triple_name)

    methods = read_params(params, "permute.methods")
    records = []
    for seed_a, seed_b in read_params(params, "permute.pairs"):
        for method in methods:
            where = Path(pair_name(seed_a, seed_b)) / method
            rec = json.loads((measure_dir / where / "summary.json").read_text())
            records.append({"seed_a": seed_a, "seed_b": seed_b, "method": method,
                            "curve": pd.read_parquet(measure_dir / where / "curve.parquet").to_dict("records"),
                            "summary": {k: v for k, v in rec.items() if k not in ("seed_a", "seed_b", "method")},
                            "search": json.loads((perms_dir / where / "stats.json").read_text())})
    out = tables(records)
    out["history"] = pd.concat([pd.read_parquet(history_dir / f"seed{s}.parquet")
                                for s in read_params(params, "train.seeds")], ignore_index=True)
    three_methods = read_params(params, "three.methods")
    triples = []
    for seeds in read_params(params, "three.triples"):
        for method in three_methods:
            where = connect_dir / triple_name(seeds) / method
            rec = json.loads((where / "edges.json").read_text())
            triples.append({"seeds": seeds, "method": method, "edges": rec["edges"],
                            "curves": pd.read_parquet(where / "curves.parquet").to_dict("records"),
                            "landscape": pd.read_parquet(where / "landscape.parquet").to_dict("records")})
    out.update(three_tables(triples))
    out["merge_many"] = pd.read_parquet(merge_many_dir / "evaluation.parquet")
    trace = json.loads((merge_many_dir / "trace.json").read_text())
    out["merge_many_trace"] = pd.DataFrame({"iteration": range(len(trace["distance"])), "distance": trace["distance"]})
    tables_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in out.items():
        frame.to_parquet(tables_dir / f"{name}.parquet", index=False)
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for name, summary in (("summary", metrics_summary(out["pairs"], methods)),
                          ("three_models", three_summary(out["three_edges"], three_methods)),
                          ("merge_many", merge_many_summary(out["merge_many"], trace))):
        (metrics_dir / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    app()
