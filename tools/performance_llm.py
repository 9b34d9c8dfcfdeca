"""The performance page's sections on language models at their stored size (``tools/performance_page.py`` puts
them in its generated part): the streamed and in-memory commands on Llama-style folders
(``benchmarks/results/llm_memory.json``), the assignment solvers at language-model widths
(``benchmarks/results/lap_widths.json``), the cost model's projection to 7 B and 70 B shapes, checked against
the measured ones, and where weight matching in the orthogonal group stops for each ``tol``
(``benchmarks/results/orthogonal_tol.json``), the sweeps such a search of a large model pays for."""

from __future__ import annotations

import re

from lmclab.core.assignment import AUTO, AUTO_SCIPY_FROM, resolve_backend


def _by(run: dict) -> str:
    """``command` at commit … on date: the machine``: who measured a record's rows (every section's)."""
    machine = run["machine"]
    return (
        f"`{run['command']}` at commit `{run['commit'][:7]}` on {run['date']}: "
        f"{machine['cpu']}, {machine['cores']} cores, GPU {machine['gpu']}, torch {machine['torch']}"
    )


def _seconds(value: float | None, stopped: float | None = None) -> str:
    """Seconds to three significant digits or so (a search stopped unfinished: ``> stopped``)."""
    if value is None:
        return f"> {stopped:.0f}" if stopped else "–"
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def _search(output: str) -> tuple[str, str, str]:
    """The search's seconds, sweeps and GB read from a ``lmclab match`` line (dashes for a merge's)."""
    found = re.search(r"groups(?: \([^)]*\))?, ([\d.]+) s(?:, (\d+) sweeps)?", output)
    read = re.search(r"\(([\d.]+) GB read\)", output)
    return (
        _seconds(float(found.group(1))) if found else "–",
        found.group(2) or "–" if found else "–",
        read.group(1) if read else "–",
    )


def llm_memory(record: dict) -> str:
    """Per shape, pair, path and command: wall seconds, the search's seconds and sweeps, GB read, peak resident
    memory against one folder and the goal (1.5 × one folder + 1 GB); each run's planted check."""
    runs = record["runs"]
    out = [
        "Measured by " + "; ".join(_by(r) for r in runs if not r.get("projection")) + ". Llama-style Hugging Face "
        "folders of bfloat16 shards built from a config with random weights; each command in its own process (its "
        "peak resident memory, the interpreter's imports included); the goal is 1.5 × one folder + 1 GB.",
        "",
        "| shape | parameters | one folder | pair | symmetry | path | command | seconds | search s | sweeps "
        "| GB read | peak memory | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        seconds, sweeps, read = _search(row["output"])
        goal = 1.5 * row["checkpoint_gb"] + 1
        met = "✓" if row["peak_gb"] <= goal else "✗"
        out.append(
            f"| {row['shape']} | {row['params'] / 1e6:,.1f} M | {row['checkpoint_gb']:.2f} GB | {row['pair']} "
            f"| {row.get('symmetry', 'permutation')} | {row['path']} | `lmclab {row['command']}` "
            f"| {_seconds(row['seconds'])} | {seconds} | {sweeps} "
            f"| {read} | {row['peak_gb']:.2f} GB | {met} {goal:.2f} GB |"
        )
    checks = [
        f"{r['shape']}: π(θp) = θa in every entry {'✓' if r['planted_check'].get('recovered') else '✗'}, the merged "
        f"folder loaded by `from_pretrained` {'✓' if r['planted_check'].get('merged_loads') else '✗'}"
        for r in runs
        if r.get("planted_check")
    ]
    return "\n".join(out) + ("\n\nThe planted copies: " + "; ".join(checks) + ".\n" if checks else "\n")


def lap_widths(record: dict) -> str:
    """Seconds of each solver per width and kind of cost, the ratio, whether both reached one optimum, and the
    solver ``lap_backend: auto`` picks at that width (:func:`lmclab.core.assignment.resolve_backend`)."""
    run = record["runs"][-1]
    repeats = run.get("repeats", 1)
    each = "one assignment" if repeats == 1 else f"the best of {repeats} assignments"
    out = [
        f"Measured by {_by(run)}; {each} per width, cost and solver (float32, solved in float64), the solvers "
        f"alternating. `lap_backend: auto` picks lapx below {AUTO_SCIPY_FROM:,} units and scipy from there.",
        "",
        "| width | cost | scipy s | lapx s | lapx / scipy | same optimum | cost in float64 | auto picks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        out.append(
            f"| {row['n']:,} | {row['kind']} | {_seconds(row['seconds']['scipy'])} "
            f"| {_seconds(row['seconds']['lapx'])} | {row['ratio_lapx']:.2f} "
            f"| {'yes' if row['same_optimum'] else 'no'} | {row['cost_gb']:.2f} GB "
            f"| {resolve_backend(AUTO, row['n'])} |"
        )
    return "\n".join(out) + "\n"


def projection(record: dict) -> str:
    """The cost model per shape: a sweep's products and seconds on this CPU and one GPU, the search's memory; the
    measured shapes' streamed matches beside it."""
    if "projection" not in record:
        return ""
    rates, run = record["rates"], next(r for r in reversed(record["runs"]) if r.get("projection"))
    out = [
        f"Computed by {_by(run)} (`lmclab.search.wm_estimate` on each shape traced on the meta device): this "
        f"machine measured at {rates['cpu_flops'] / 1e9:.0f} GFLOP/s in float32 products and "
        f"{rates['lap_1024_s'] * 1e3:.0f} ms per 1,024² assignment; the GPU is assumed at "
        f"{rates['gpu_flops'] / 1e12:.1f} TFLOP/s (an A100's float32 peak; none here), its assignments on this CPU.",
        "",
        "| shape | parameters | bfloat16 folder | groups | TFLOP per sweep | s per sweep, CPU | s per sweep, GPU "
        "| search memory | measured: search s, sweeps, peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["projection"]:
        out.append(
            f"| {row['shape']} | {row['params'] / 1e9:.2f} B | {row['checkpoint_gb']:.1f} GB | {row['groups']} "
            f"| {row['tflop_per_sweep']:,.1f} | {_seconds(row['cpu_s_per_sweep'])} "
            f"| {_seconds(row['gpu_s_per_sweep'])} "
            f"| {row['search_gb']:.2f} GB | {_measured(record['rows'], row['shape'])} |"
        )
    return "\n".join(out) + "\n"


def _measured(rows: list[dict], shape: str) -> str:
    """The streamed match of ``shape``'s independent pair by permutations (the section above): its search's seconds
    and sweeps and the process's peak; a dash for a shape not measured."""
    for row in rows:
        if (row["shape"], row["pair"], row["path"], row["symmetry"], row["command"]) == (
            shape, "independent", "stream", "permutation", "match",
        ):  # fmt: skip
            seconds, sweeps, _ = _search(row["output"])
            return f"{seconds} s, {sweeps}, {row['peak_gb']:.2f} GB"
    return "–"


def orthogonal_tol(record: dict) -> str:
    """Per model, width and ``tol``: the sweep at which weight matching in the orthogonal group stops, its seconds,
    how far its objective is short of the longest search's, and its L2 reduction."""
    run = record["runs"][-1]
    out = [
        f'Measured by {_by(run)}; `lmclab.align(…, method="wm", symmetry="orthogonal")` on independent pairs of '
        f"`gpt` (depth {run['depth']}, {run['heads']} heads, random weights): one search of {run['sweeps']} sweeps "
        "and, for each `tol`, the search that `tol` would stop (the same seeded descent, its prefix).",
        "",
        "| model | width | tol | sweeps | seconds | objective short of the longest by | L2 reduction |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        out.append(
            f"| {row['model']} | {row['width']} | {row['tol']:.0e} | {row['sweeps']} of {row['of']} "
            f"| {_seconds(row['seconds'])} | {row['short_of_last']:.1e} | {row['l2_reduction']:.2f} % |"
        )
    return "\n".join(out) + "\n"
