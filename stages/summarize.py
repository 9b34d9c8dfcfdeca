"""Stage summarize: gather every (pair, method) measurement of the current params into Parquet
tables (``curves``, ``pairs``, ``history``; from the analyses ``taylor``, ``theorem42``,
``spectrum``, ``energy``, ``output_scale``, ``table1``) and ``metrics/summary.json`` for ``dvc metrics``. ~2 s."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from common import one_line_errors, read_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(measure_dir: Path = typer.Option(...), perms_dir: Path = typer.Option(...),
         history_dir: Path = typer.Option(...), analysis_dir: Path = typer.Option(...),
         spectra_dir: Path = typer.Option(...), tables_dir: Path = typer.Option(...),
         metrics: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    import pandas as pd

    from lmclab.summary import metrics_summary, output_scales, pair_name, table1, tables

    methods = read_params(params, "permute.methods")
    records = []
    for seed_a, seed_b in read_params(params, "permute.pairs"):
        for method in methods:
            where = Path(pair_name(seed_a, seed_b)) / method
            rec = json.loads((measure_dir / where / "summary.json").read_text())
            rec.update(json.loads((analysis_dir / where / "summary.json").read_text()))
            records.append({"seed_a": seed_a, "seed_b": seed_b, "method": method,
                            "curve": pd.read_parquet(measure_dir / where / "curve.parquet").to_dict("records"),
                            "summary": {k: v for k, v in rec.items() if k not in ("seed_a", "seed_b", "method")},
                            "search": json.loads((perms_dir / where / "stats.json").read_text()),
                            **{name: pd.read_parquet(analysis_dir / where / f"{name}.parquet").to_dict("records")
                               for name in ("taylor", "theorem42")}})
    out = tables(records)
    seeds = read_params(params, "train.seeds")
    for name in ("spectrum", "energy"):
        out[name] = pd.concat([pd.read_parquet(spectra_dir / f"seed{s}" / f"{name}.parquet") for s in seeds],
                              ignore_index=True)
    out["output_scale"] = output_scales(out["spectrum"])
    out["table1"] = table1(out["pairs"], methods)
    out["history"] = pd.concat([pd.read_parquet(history_dir / f"seed{s}.parquet")
                                for s in seeds], ignore_index=True)
    tables_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in out.items():
        frame.to_parquet(tables_dir / f"{name}.parquet", index=False)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text(json.dumps(metrics_summary(out["pairs"], methods), indent=2) + "\n")


if __name__ == "__main__":
    app()
