"""Compare this run's headline metrics with a baseline and write a Markdown report.

    python tools/metrics_diff.py [--baseline HEAD] [--new REV] [--out metrics_diff.md]

After ``dvc repro`` (or ``dvc exp run``): runs ``dvc params diff`` and ``dvc metrics diff --all``
of ``metrics/headline.json`` between ``--baseline`` (any git rev or experiment name; default HEAD, i.e. the
committed metrics) and ``--new`` (default: the workspace), judges every headline metric against the committed
tolerance file (``lmclab.report.metric_gate``), lists the report figures that changed, writes the Markdown
(CI posts it as a pull-request comment) and exits 1 when a metric is beyond its tolerance, naming
it. ``make metrics-diff`` runs it with the defaults.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer

from lmclab.pipeline.stage import load_yaml  # YAML 1.2, as DVC reads: 1e-3 is a float
from lmclab.report.metric_gate import judge_all, parse_tolerances, summary_line, verdict_table

ROOT = Path(__file__).resolve().parent.parent
# the gate's file (written by summarize); the other DVC metrics (each seed's DVCLive training metrics,
# dvclive/seed<n>/metrics.json) are no headline numbers and are not judged
HEADLINE = "metrics/headline.json"

app = typer.Typer(add_completion=False)


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: `{' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.stdout


def _changed_figures(baseline: str, new: str | None, folder: str = "reports/figures") -> list[str] | None:
    """Report figures whose bytes differ from the baseline's (None: the baseline is no git rev)."""
    if (
        subprocess.run(["git", "rev-parse", "--verify", "-q", f"{baseline}^{{commit}}"], capture_output=True).returncode
        != 0
    ):
        return None
    out = _run("git", "diff", "--name-only", baseline, *([new] if new else []), "--", folder)
    untracked = [] if new else _run("git", "ls-files", "--others", "--exclude-standard", "--", folder).split()
    return sorted({*out.split(), *untracked})


@app.command()
def main(
    baseline: str = typer.Option("HEAD", help="git rev or experiment to compare against"),
    new: str = typer.Option(None, help="git rev or experiment to judge (default: the workspace)"),
    tolerances: Path = typer.Option(ROOT / "metrics" / "tolerances.yaml"),
    out: Path = typer.Option(Path("metrics_diff.md"), help="Markdown report to write"),
) -> None:
    try:
        rules = parse_tolerances(load_yaml(tolerances) or {})
    except ValueError as exc:
        raise SystemExit(f"error: {tolerances}: {exc}") from None
    revs = [baseline, *([new] if new else [])]
    verdicts = judge_all(
        json.loads(_run("dvc", "metrics", "diff", *revs, "--all", "--json", "--targets", HEADLINE) or "{}"), rules
    )
    if not verdicts:
        raise SystemExit(
            f"error: no headline metrics found in {baseline} or {new or 'the workspace'} (run `dvc repro` first)"
        )
    params = _run("dvc", "params", "diff", *revs, "--md").strip() or "No parameter changed."
    figures = _changed_figures(baseline, new)
    unchanged = sum(v.ok and v.delta == 0 for v in verdicts)
    lines = [
        f"## Headline metrics: {new or 'workspace'} vs {baseline}",
        "",
        f"**{summary_line(verdicts)}**",
        "",
        verdict_table(verdicts, only_changed=True),
        "",
        f"<details><summary>all {len(verdicts)} headline metrics ({unchanged} unchanged)</summary>",
        "",
        verdict_table(verdicts),
        "",
        "</details>",
        "",
        "### Parameters",
        "",
        params,
        "",
        "### Figures that changed",
        "",
    ]
    if figures is None:
        lines.append(f"(not listed: {baseline} is not a git revision)")
    lines += [f"![{Path(f).stem}]({f})" for f in figures or []] or (["none"] if figures == [] else [])
    out.write_text("\n".join(lines) + "\n")
    typer.echo(summary_line(verdicts))
    typer.echo(f"report: {out}")
    raise SystemExit(0 if all(v.ok for v in verdicts) else 1)


if __name__ == "__main__":
    app()
