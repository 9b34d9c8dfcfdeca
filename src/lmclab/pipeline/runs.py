"""The runs of a ``dvc exp`` sweep, read back for the studies over finished runs (``lmclab study``; the
paper's Appendix H.4 and H.5 sweeps): each experiment's swept value and its ``data/tables`` from the
experiment's DVC cache, the workspace's own run beside them on request."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _flat(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        out.update(_flat(value, f"{name}.") if isinstance(value, Mapping) else {name: value})
    return out


def _read_table(table: str, rev: str | None) -> Any:
    """``data/tables/<table>.parquet`` of experiment ``rev`` (from its DVC cache), or the workspace's."""
    import io

    import dvc.api
    import pandas as pd

    path = f"data/tables/{table}.parquet"
    if rev is None:
        return pd.read_parquet(path)
    with dvc.api.open(path, rev=rev, mode="rb") as f:
        return pd.read_parquet(io.BytesIO(f.read()))


def experiment_runs(
    value_of: Callable[[dict], Any],
    tables: tuple[str, ...],
    *,
    swept: Callable[[str], bool],
    exps: str = "",
    workspace: bool = False,
) -> dict[Any, dict[str, Any]]:
    """``{value: {table name: DataFrame}}`` for the experiments of a sweep and, with ``workspace``,
    the workspace's own run: those named in ``exps`` (comma-separated), else every experiment whose
    parameters differ from the workspace's only in keys for which ``swept(key)`` is true (so the
    experiments of another sweep are left out). ``value_of`` picks a run's swept value from its
    ``dvc exp show`` row; the tables are its ``data/tables/<name>.parquet`` (read from the
    experiment's DVC cache). Two runs with the same value are an error."""
    import dvc.api

    wanted = [e for e in exps.split(",") if e]
    keys = list(_flat(dvc.api.params_show()))
    rows = dvc.api.exp_show()
    base = next(r for r in rows if r["rev"] == "workspace")
    runs: dict[Any, dict[str, Any]] = {}
    for row in rows:
        name = row.get("Experiment")
        differs = [k for k in keys if row.get(k) != base.get(k) and not swept(k)]
        is_exp = name is not None and (name in wanted if wanted else not differs)
        if name is not None and not is_exp:
            print(f"{name}: left out (differs in {', '.join(differs) or 'not named'})")
        if not (is_exp or (workspace and row["rev"] == "workspace")):
            continue
        value = value_of(row)
        if value in runs:
            raise ValueError(f"two runs have the value {value}; pick experiments with --exps")
        runs[value] = {table: _read_table(table, name if is_exp else None) for table in tables}
        print(f"{value}: {name or 'workspace'}")
    if len(runs) < 2:
        raise ValueError("found fewer than two runs; queue a sweep first (docs: Analyses and studies)")
    return runs


def experiment_files(rev: str, pattern: str) -> dict[str, str]:
    """The text of every file of experiment ``rev`` whose path matches the glob ``pattern`` (from its DVC
    cache), by path in sorted order; DVC's error when ``rev`` names no revision here."""
    import dvc.api

    fs = dvc.api.DVCFileSystem(".", rev=rev)
    return {path: fs.read_text(path) for path in sorted(fs.glob(pattern))}
