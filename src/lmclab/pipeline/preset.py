"""A named preset (``presets/<name>.yaml``: one of the paper's settings) written into params.yaml, for
``lmclab preset``: only values change, every other line, comment and key order of params.yaml is kept,
and each preset key must already exist in params.yaml (a typo is an error, not a new key)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmclab.pipeline.stage import parse_yaml

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
    """A value as one line of YAML flow style, however long (an infinite width never wraps)."""
    import yaml

    return yaml.safe_dump([value], default_flow_style=True, width=math.inf, allow_unicode=True).strip()[1:-1]


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


def preset_names(presets: Path) -> list[str]:
    """The presets in the folder ``presets``, by name."""
    return sorted(p.stem for p in Path(presets).glob("*.yaml"))


def preset_values(name: str, presets: Path) -> dict[str, Any]:
    """The dotted params.yaml keys preset ``name`` sets, with their values."""
    path = Path(presets) / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"preset {name!r}: no {path.name} in {presets}/ (known: {preset_names(presets)})")
    return flatten(parse_yaml(path.read_text(), path) or {})


def apply_preset(name: str, params_text: str, presets: Path) -> str:
    """``params_text`` with preset ``name`` of the folder ``presets`` written in (checked by reading it back)."""
    overrides = preset_values(name, presets)
    new_text = set_values(params_text, overrides)
    new = flatten(parse_yaml(new_text))
    wrong = [k for k, v in overrides.items() if new.get(k) != v]
    if wrong:
        raise ValueError(f"preset {name!r}: could not write {wrong} faithfully")
    return new_text
