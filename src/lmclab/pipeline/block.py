"""The base of the params.yaml schema (``lmclab.pipeline.schema``): a block is a mapping of params.yaml with
no unknown keys, no missing keys, strict types and finite numbers; ``key`` declares one key's default and
meaning; seed types shared by the blocks."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

Seed = Annotated[int, Field(ge=0)]
Seeds = Annotated[list[Seed], Field(min_length=1)]


def group(size: int) -> Any:
    """A non-empty list of seed groups of ``size`` seeds each (pairs, triples)."""
    return Annotated[list[Annotated[list[Seed], Field(min_length=size, max_length=size)]], Field(min_length=1)]


def key(default: Any, meaning: str, **constraints: Any) -> Any:
    return Field(default, description=meaning, **constraints)


class Missing:
    """Stands for a key absent from params.yaml: it fails every type, so the error is reported
    at the key's own place (``lmclab.pipeline.validate`` names it with its default)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()


class Block(BaseModel):
    """A mapping of params.yaml: no unknown keys, no missing keys, strict types, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _every_key_written(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {**{name: MISSING for name in cls.model_fields}, **data}
        return data
