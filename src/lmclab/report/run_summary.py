"""One run's measurements gathered into tables and summarised — the summarize stage's work as two calls:
:func:`run_tables` reads the stage outputs of the pairs, seeds, triples and n models of a run into the
tables of :mod:`lmclab.report.summary`, :func:`run_summaries` turns them into the headline metrics, the
paper's findings checked on the run and the detail summaries."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lmclab.core.device import describe_machine
from lmclab.report.headline import headline_metrics
from lmclab.report.many_models import many_summary, objective_traces
from lmclab.report.summary import (
    collect_pairs,
    collect_triples,
    metrics_summary,
    output_scales,
    table1,
    tables,
    three_summary,
    three_tables,
)
from lmclab.studies.findings import paper_findings


@dataclass(frozen=True)
class RunSettings:
    """What a run measured: its ``pairs`` of seeds and the pair ``methods``, the trained ``seeds``, the
    three-model ``triples`` and their ``three_methods``."""

    pairs: Sequence[Sequence[int]]
    methods: Sequence[str]
    seeds: Sequence[int]
    triples: Sequence[Sequence[int]]
    three_methods: Sequence[str]


@dataclass(frozen=True)
class RunFolders:
    """Where the stages of a run wrote their outputs (measure, permute, train's history, spectra,
    connect, merge_many)."""

    measure: Path
    perms: Path
    history: Path
    spectra: Path
    connect: Path
    merge_many: Path


def run_tables(folders: RunFolders, run: RunSettings) -> dict[str, pd.DataFrame]:
    """Every table of the run by name (see the summarize stage), read from ``folders``."""
    out = tables(collect_pairs(folders.measure, folders.perms, run.pairs, run.methods))
    per_seed = lambda folder, name: pd.concat(  # noqa: E731
        [pd.read_parquet(folder / f"seed{s}" / name) for s in run.seeds], ignore_index=True
    )
    out["spectrum"], out["energy"] = (per_seed(folders.spectra, f"{n}.parquet") for n in ("spectrum", "energy"))
    out["output_scale"] = output_scales(out["spectrum"])
    out["table1"] = table1(out["pairs"], run.methods)
    history = [pd.read_parquet(folders.history / f"seed{s}.parquet") for s in run.seeds]
    out["history"] = pd.concat(history, ignore_index=True)
    out.update(three_tables(collect_triples(folders.connect, run.triples, run.three_methods)))
    for name, file in (("", "evaluation"), ("_methods", "methods"), ("_pairwise", "pairwise")):
        out[f"merge_many{name}"] = pd.read_parquet(folders.merge_many / f"{file}.parquet")
    trace = json.loads((folders.merge_many / "trace.json").read_text())
    out["merge_many_trace"] = objective_traces(trace, out["merge_many_methods"])
    return out


def run_summaries(tables: dict[str, pd.DataFrame], run: RunSettings, study: dict | None = None) -> dict[str, dict]:
    """``headline`` metrics, ``findings`` (the paper's, checked on the run; ``study``: the three-model study's
    summary, for its note) and the detail summaries ``summary``, ``three_models``, ``merge_many`` and
    ``environment`` (the machine these numbers were taken on), by name."""
    pairs, edges, evaluation = tables["pairs"], tables["three_edges"], tables["merge_many"]
    headline = headline_metrics(
        history=tables["history"],
        pairs=pairs,
        edges=edges,
        evaluation=evaluation,
        methods=run.methods,
        three_methods=run.three_methods,
    )
    spectrum, energy = tables["spectrum"], tables["energy"]
    found = paper_findings(pairs, spectrum, energy, edges, run.methods, run.three_methods, study=study)
    findings = {
        "held": sum(f.holds is True for f in found),
        "tested": sum(f.holds is not None for f in found),
        "findings": [f.as_dict() for f in found],
    }
    return {
        "headline": headline,
        "findings": findings,
        "summary": metrics_summary(pairs, run.methods),
        "three_models": three_summary(edges, run.three_methods),
        "merge_many": many_summary(evaluation, tables["merge_many_methods"]),
        "environment": describe_machine(),
    }
