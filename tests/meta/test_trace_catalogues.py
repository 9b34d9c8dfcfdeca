"""The tracer's catalogues cover its source: every reason a rule of ``src/lmclab/trace`` refuses with has a case
in ``tests/trace/test_trace_refusal_catalogue.py``, and every reason the proof of kinds gives (why a group takes
no orthogonal map) one in ``tests/trace/test_trace_kind_reasons.py``; no case names a reason the source no longer
gives. The reasons are read from the library's own source (a mutated copy would not be it: tests/meta is not
run under mutation testing)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import lmclab.trace

SOURCE = Path(lmclab.trace.__file__).parent
TESTS = Path(__file__).resolve().parents[1] / "trace"
REASON_FUNCTIONS = ("heads_reason", "packed_reason", "unknown")  # functions returning a refusal's reason
REFUSING = ("refuse", "refuse_packed")


def _catalogue(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"catalogue_{name}", TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pattern(text: ast.expr) -> str | None:
    """A reason's text as a regular expression (an f-string's fields match anything), None for a name."""
    if isinstance(text, ast.Constant) and isinstance(text.value, str):
        return re.escape(text.value)
    if isinstance(text, ast.JoinedStr):
        return "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in text.values)
    return None


def _branches(text: ast.expr) -> list[ast.expr]:
    """The values a conditional expression or an ``or`` may take (``a if c else "reason"``)."""
    if isinstance(text, ast.IfExp):
        return _branches(text.body) + _branches(text.orelse)
    if isinstance(text, ast.BoolOp):
        return [t for v in text.values for t in _branches(v)]
    return [text]


def refusal_reasons() -> dict[str, str]:
    """Every literal reason the tracer's rules refuse with: ``file:line`` → its regular expression."""
    found = {}
    for path in sorted(SOURCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            texts: list[ast.expr] = []
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in REFUSING and len(node.args) > 1:
                texts = [node.args[1]]
            elif isinstance(node, ast.FunctionDef) and node.name in REASON_FUNCTIONS:
                texts = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
            for text in texts:
                if (pattern := _pattern(text)) is not None:
                    found[f"{path.name}:{text.lineno}"] = pattern
    return found


def kind_reasons() -> dict[str, str]:
    """The reasons of the proof of kinds (``rotations.py``, ``kinds.py``, ``planes.py``) as regular expressions:
    strings of two words or more that a function returns, that follow ``CENTRED +``, that ``bend`` or
    ``setdefault`` take, or that are assigned to a name (but the prefix ``CENTRED``) or an entry."""
    found = {}
    for path in (SOURCE / "rotations.py", SOURCE / "kinds.py", SOURCE / "planes.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            texts: list[ast.expr] = []
            if isinstance(node, ast.Return) and node.value is not None:
                texts = [node.value]
            elif isinstance(node, ast.BinOp) and getattr(node.left, "id", None) == "CENTRED":
                texts = [node.right]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("bend", "setdefault"):
                texts = node.args[1:]
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript | ast.Name):
                texts = [] if getattr(node.targets[0], "id", None) == "CENTRED" else [node.value]  # a prefix
            for text in (t for x in texts for t in _branches(x)):
                if (pattern := _pattern(text)) is not None and " " in pattern:
                    found[f"{path.name}:{text.lineno}"] = pattern
    return found


def test_every_reason_the_tracer_refuses_with_has_a_case() -> None:
    cases = _catalogue("test_trace_refusal_catalogue").CASES
    reasons = refusal_reasons()
    assert len(reasons) > 40  # the walk finds the rules' reasons
    missing = [
        at for at, pattern in reasons.items() if not any(re.fullmatch(pattern, c.reason) for c in cases.values())
    ]
    assert not missing, f"reasons with no case: {missing}"
    stale = [key for key, c in cases.items() if not any(re.fullmatch(p, c.reason) for p in reasons.values())]
    assert not stale, f"cases whose reason the tracer no longer gives: {stale}"


def test_every_reason_the_proof_of_kinds_gives_has_a_case() -> None:
    module = _catalogue("test_trace_kind_reasons")
    patterns = kind_reasons()
    assert len(patterns) >= 15  # the walk finds the proof's reasons
    reasons = [c.reason for c in module.CASES.values()] + list(module.UNREACHED)
    prefixed = {at: f"(node '[^']+': )?{p}" for at, p in patterns.items()}
    missing = [at for at, p in prefixed.items() if not any(re.fullmatch(p, r) for r in reasons)]
    assert not missing, f"reasons with no case: {missing}"
    stale = [r for r in reasons if not any(re.fullmatch(p, r) for p in prefixed.values())]
    assert not stale, f"reasons the proof no longer gives: {stale}"
