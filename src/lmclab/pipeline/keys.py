"""What each key of params.yaml expects, in words (the validation's error lines and the docs' table,
``tools/params_table.py``), and the tree of defaults — read from the schema (``lmclab.pipeline.schema``)."""

from __future__ import annotations

from typing import Any

from pydantic.fields import FieldInfo

from lmclab.core.options import in_words
from lmclab.pipeline.block import Block
from lmclab.pipeline.defaults import PIPELINE_DEFAULTS
from lmclab.pipeline.schema import params_model


def field_expected(field: FieldInfo) -> str:
    """What ``field`` expects, in words (a field may state it itself: ``json_schema_extra``)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("expected") or in_words(field.annotation, field.metadata))


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
