"""The metric gate: is a headline metric of this run within tolerance of a baseline's?

Input is what ``dvc metrics diff --all --json`` prints (``{file: {metric: {old, new, diff}}}``) and
a tolerance file (``metrics/tolerances.yaml``): rules ``pattern: {abs, rel}`` matched against the
metric's name (``wm.B_loss``) with shell-style wildcards, first match wins. A metric passes when
``|new − old| ≤ abs + rel·|old|``. A headline metric that no rule covers, or that one side lacks,
fails: a gate that silently skips a number gates nothing. Pure functions; the CLI that runs DVC
and writes the Markdown is ``tools/metrics_diff.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, NamedTuple


class Tolerance(NamedTuple):
    abs: float = 0.0
    rel: float = 0.0

    def allowed(self, old: float) -> float:
        return self.abs + self.rel * abs(old)


class Verdict(NamedTuple):
    name: str
    old: float | None
    new: float | None
    tolerance: Tolerance | None
    ok: bool
    reason: str  # "within", "beyond", "missing in baseline", "missing in this run", "no tolerance"

    @property
    def delta(self) -> float | None:
        return None if self.old is None or self.new is None else self.new - self.old


def parse_tolerances(doc: Mapping[str, Any]) -> list[tuple[str, Tolerance]]:
    """``{"rules": {pattern: {abs, rel}}}`` → ordered ``(pattern, Tolerance)``; one-line errors."""
    rules = doc.get("rules") if isinstance(doc, Mapping) else None
    if not isinstance(rules, Mapping) or not rules:
        raise ValueError("tolerance file: expected a non-empty mapping under 'rules'")
    out = []
    for pattern, spec in rules.items():
        if not isinstance(spec, Mapping) or not set(spec) <= {"abs", "rel"} or not spec:
            raise ValueError(f"tolerance file: rule {pattern!r} must map to abs and/or rel, got {spec!r}")
        values = {k: float(v) for k, v in spec.items()}
        if any(v < 0 or not math.isfinite(v) for v in values.values()):
            raise ValueError(f"tolerance file: rule {pattern!r} needs finite non-negative values, got {spec!r}")
        out.append((str(pattern), Tolerance(**values)))
    return out


def tolerance_for(name: str, rules: Sequence[tuple[str, Tolerance]]) -> Tolerance | None:
    return next((tol for pattern, tol in rules if fnmatchcase(name, pattern)), None)


def flatten_diff(diff: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, tuple[Any, Any]]:
    """``dvc metrics diff --json`` → ``{metric: (old, new)}`` over all metric files."""
    return {
        name: (entry.get("old"), entry.get("new")) for per_file in diff.values() for name, entry in per_file.items()
    }


def judge(name: str, old: Any, new: Any, rules: Sequence[tuple[str, Tolerance]]) -> Verdict:
    tol = tolerance_for(name, rules)
    old = float(old) if isinstance(old, (int, float)) else None
    new = float(new) if isinstance(new, (int, float)) else None
    if tol is None:
        return Verdict(name, old, new, None, False, "no tolerance")
    if old is None or new is None:
        return Verdict(name, old, new, tol, False, "missing in baseline" if old is None else "missing in this run")
    ok = abs(new - old) <= tol.allowed(old) + 1e-12
    return Verdict(name, old, new, tol, ok, "within" if ok else "beyond")


def judge_all(diff: Mapping, rules: Sequence[tuple[str, Tolerance]]) -> list[Verdict]:
    """One verdict per headline metric of either side, sorted by name."""
    return [judge(name, old, new, rules) for name, (old, new) in sorted(flatten_diff(diff).items())]


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"


def _tol(tol: Tolerance | None) -> str:
    if tol is None:
        return "—"
    parts = ([f"±{tol.abs:g}"] if tol.abs else []) + ([f"±{100 * tol.rel:g} %"] if tol.rel else [])
    return " + ".join(parts) or "0"


def verdict_table(verdicts: Sequence[Verdict], *, only_changed: bool = False) -> str:
    """Markdown table: metric, baseline, this run, Δ, tolerance, verdict (failures first)."""
    rows = sorted(verdicts, key=lambda v: v.ok)
    if only_changed:
        rows = [v for v in rows if not v.ok or v.delta != 0]
    lines = ["| metric | baseline | this run | Δ | tolerance | verdict |", "|---|---:|---:|---:|---|---|"]
    lines += [
        f"| `{v.name}` | {_num(v.old)} | {_num(v.new)} | {_num(v.delta)} | {_tol(v.tolerance)} | "
        f"{'✅ ' if v.ok else '❌ '}{v.reason} |"
        for v in rows
    ]
    return "\n".join(lines)


def summary_line(verdicts: Sequence[Verdict]) -> str:
    failed = [v for v in verdicts if not v.ok]
    if not failed:
        return f"PASS: all {len(verdicts)} headline metrics within tolerance"
    names = ", ".join(f"{v.name} ({v.reason})" for v in failed)
    return f"FAIL: {len(failed)} of {len(verdicts)} headline metrics: {names}"
