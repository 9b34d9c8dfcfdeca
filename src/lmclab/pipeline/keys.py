"""What each key of params.yaml expects, in words (the validation's error lines and the docs' table,
``tools/params_table.py``), and the tree of defaults — read from the schema (``lmclab.pipeline.schema``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from lmclab.pipeline.block import Block
from lmclab.pipeline.schema import PIPELINE_DEFAULTS, params_model


def expected(tp: Any, metadata: Sequence[Any] = (), *, plural: bool = False) -> str:
    """``Annotated[int, Field(ge=1)]`` -> "an integer ≥ 1" (``plural``: "integers ≥ 1")."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        extra = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return expected(args[0], [*metadata, *extra], plural=plural)
    if origin in (Union, UnionType):
        text = " or ".join(expected(a, plural=plural) for a in args if a is not type(None))
        return text + " or null" if type(None) in args else text
    if origin is Literal:
        names = ", ".join(str(a) for a in args)
        return names if len(args) == 1 else (f"values among {names}" if plural else f"one of {names}")
    bounds = _bounds(metadata)
    if origin in (list, tuple):
        size = {type(m).__name__: m for m in metadata}
        lo = getattr(size.get("MinLen"), "min_length", 0)
        hi = getattr(size.get("MaxLen"), "max_length", None)
        count = f"{lo} " if lo == hi else (f"at least {lo} " if lo > 1 else "")
        items = expected(args[0], plural=True)
        if plural:
            return f"lists of {count}{items}"
        return f"a {'non-empty ' if lo == 1 and hi is None else ''}list of {count}{items}"
    if isinstance(tp, type) and issubclass(tp, Block):
        keys = ", ".join(tp.model_fields)
        return "blocks" if plural else (f"a block with the keys {keys}" if keys else "an empty block {}")
    words = {
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        bool: ("true or false", "booleans"),
        str: ("a string", "strings"),
    }[tp]
    return words[plural] + bounds


def _bounds(metadata: Sequence[Any]) -> str:
    lower = {type(m).__name__: m for m in metadata if type(m).__name__ in ("Ge", "Gt")}
    upper = {type(m).__name__: m for m in metadata if type(m).__name__ in ("Le", "Lt")}
    lo = ("[", lower["Ge"].ge) if "Ge" in lower else (("(", lower["Gt"].gt) if "Gt" in lower else None)
    hi = ("]", upper["Le"].le) if "Le" in upper else ((")", upper["Lt"].lt) if "Lt" in upper else None)
    if lo and hi:
        return f" in {lo[0]}{lo[1]}, {hi[1]}{hi[0]}"
    if lo:
        return f" {'≥' if lo[0] == '[' else '>'} {lo[1]}"
    return f" {'≤' if hi[0] == ']' else '<'} {hi[1]}" if hi else ""


def field_expected(field: FieldInfo) -> str:
    """What ``field`` expects, in words (a field may state it itself: ``json_schema_extra``)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("expected") or expected(field.annotation, field.metadata))


def key_rows(block: type[Block] | None = None, prefix: str = "") -> list[tuple[str, Any, str, str]]:
    """``(dotted key, default, expected, meaning)`` of every leaf key of ``block`` (default: the whole
    params.yaml), in params.yaml order."""
    block = block or params_model()
    rows = []
    for name, field in block.model_fields.items():
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, Block) and tp.model_fields:
            rows += key_rows(tp, f"{prefix}{name}.")
        else:
            empty = isinstance(tp, type) and issubclass(tp, Block)  # a block without keys: its docstring says why
            meaning = (tp.__doc__ if empty else field.description) or ""
            rows.append(
                (
                    f"{prefix}{name}",
                    {} if empty else field.default,
                    field_expected(field),
                    meaning + _override_note(f"{prefix}{name}", field),
                )
            )
    return rows


def _override_note(key: str, field: FieldInfo) -> str:
    """For a key of PIPELINE_DEFAULTS: its library default and why params.yaml's differs."""
    if key not in PIPELINE_DEFAULTS:
        return ""
    library = field.json_schema_extra["library_default"]
    return f" — differs from the library default ({library}): {PIPELINE_DEFAULTS[key].reason}"


def defaults(block: type[Block] | None = None) -> dict[str, Any]:
    """The default of every key of ``block`` (default: the whole params.yaml), as the tree params.yaml holds."""
    block = block or params_model()
    out: dict[str, Any] = {}
    for name, field in block.model_fields.items():
        tp = field.annotation
        out[name] = defaults(tp) if isinstance(tp, type) and issubclass(tp, Block) else field.default
    return out
