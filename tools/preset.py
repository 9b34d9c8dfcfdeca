"""Apply a named paper preset (``presets/<name>.yaml``) to params.yaml — not a DVC stage.

    python tools/preset.py cifar10_resnet20            # rewrite params.yaml in place
    python tools/preset.py cifar10_resnet20 --set-params  # print `dvc exp run -S` flags instead

Only values change: every other line, comment and key order of params.yaml is kept. Each preset
key must already exist in params.yaml (a typo is an error, not a new key); the result is
validated like the validate stage before it is written (atomically); a local corpus or tokenizer folder it
names that is not there yet (``data.root``, ``data.tokenizer``) is a note, not an error.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
import yaml

from lmclab.pipeline.stage import one_line_errors, parse_yaml

ROOT = Path(__file__).resolve().parent.parent
app = typer.Typer(add_completion=False)
PRESETS = ROOT / "presets"
# the keys of local files the user provides (a corpus, a tokenizer): a preset may name them before they exist
LOCAL_FILES = ("data.root:", "data.tokenizer:")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are leaves."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def flow(value: Any) -> str:
    """A value as one line of YAML flow style."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6, allow_unicode=True).strip()[1:-1]


def _split_comment(rest: str) -> tuple[str, str]:
    """``' value  # note'`` -> (``' value'``, ``'  # note'``); a ``#`` inside quotes is kept."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1].isspace()):
            j = len(rest[:i].rstrip())
            return rest[:j], rest[j:]
    return rest.rstrip(), ""


def set_values(text: str, overrides: Mapping[str, Any]) -> str:
    """``text`` (a block-style YAML file) with the leaf value of every dotted key replaced."""
    lines, stack, done = text.splitlines(keepends=True), [], set()
    for n, line in enumerate(lines):
        match = KEY_LINE.match(line.rstrip("\n"))
        if not match:
            continue
        indent = len(match["indent"])
        stack = [(i, k) for i, k in stack if i < indent] + [(indent, match["key"])]
        dotted = ".".join(k for _, k in stack)
        if dotted in overrides:
            value, comment = _split_comment(match["rest"])
            if not value.strip():
                raise ValueError(f"{dotted}: is a block in params.yaml; the preset must set its leaves")
            head = f"{match['indent']}{match['key']}: {flow(overrides[dotted])}"
            column = len(line.rstrip("\n")) - len(comment.lstrip())  # keep the comment's column
            lines[n] = (head.ljust(column - 1) + " " + comment.lstrip() if comment else head) + "\n"
            done.add(dotted)
    missing = sorted(set(overrides) - done)
    if missing:
        raise ValueError(f"params.yaml has no key(s) {missing} (a preset only changes existing values)")
    return "".join(lines)


def apply_preset(name: str, params_text: str) -> str:
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS.glob("*.yaml"))
        raise FileNotFoundError(f"preset {name!r}: no {path.name} in presets/ (known: {known})")
    overrides = flatten(parse_yaml(path.read_text(), path) or {})
    new_text = set_values(params_text, overrides)
    new = flatten(parse_yaml(new_text))
    wrong = [k for k, v in overrides.items() if new.get(k) != v]
    if wrong:
        raise ValueError(f"preset {name!r}: could not write {wrong} faithfully")
    return new_text


@app.command()
@one_line_errors
def main(
    name: str,
    params: Path = Path("params.yaml"),
    set_params: bool = typer.Option(False, help="print `dvc exp run -S` flags, change nothing"),
) -> None:
    from lmclab.core.atomic import write_text
    from lmclab.pipeline.validate import ParamsError, check_params

    new_text = apply_preset(name, params.read_text())
    try:
        check_params(parse_yaml(new_text, params))
    except ParamsError as err:
        wrong = [line for line in err.lines if not line.startswith(LOCAL_FILES)]
        if wrong:
            raise SystemExit("\n".join(f"error: preset {name}: {line}" for line in wrong)) from None
        for line in err.lines:  # a corpus or tokenizer the user places before running: said, not refused
            typer.echo(f"note: preset {name}: {line} (place it there before dvc repro)", err=True)
    if set_params:
        overrides = flatten(parse_yaml((PRESETS / f"{name}.yaml").read_text()))
        typer.echo("dvc exp run " + " ".join(f"-S {shlex.quote(f'{k}={flow(v)}')}" for k, v in overrides.items()))
        return
    write_text(params, new_text)
    typer.echo(f"{params}: applied preset {name}")


if __name__ == "__main__":
    app()
