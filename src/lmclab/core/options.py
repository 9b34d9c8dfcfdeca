"""Typed keyword options of the library's functions: one pydantic model per function holds each
option's type, range, default and one-line meaning — the only definition (the pipeline's schema of
params.yaml embeds the models; ``lmclab.pipeline.schema``).

:func:`takes` gives a function its model's fields as keyword arguments: its signature lists them
with their defaults, and every call validates them in one place. A bad value is one
:class:`OptionError` line naming the argument (``max_iter must be a positive integer, got 0``); a
caller names the arguments as its own user knows them with :func:`keyed_errors` (the pipeline:
``permute.wm.max_iter must be a positive integer, got 0``; the API: ``options['max_iter'] must be …``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import wraps
from types import UnionType
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

Count = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # in [0, 1): a momentum, a fraction that may be 0
Factor = Annotated[float, Field(gt=0, le=1)]  # in (0, 1]: a shrinking factor that may be 1, never 0
HalfWidth = Annotated[float, Field(ge=0, le=0.5)]  # in [0, ½]: the half-width of a range of λ centred on ½


def one_of(names: Any) -> Any:
    """``Literal[...]`` of a registry's names, in its order."""
    return Literal[tuple(names)]  # type: ignore[valid-type]


def option(
    default: Any,
    meaning: str,
    *,
    expected: str | None = None,
    per_step: bool = False,
    held_out: bool = False,
    **field: Any,
) -> Any:
    """A field with its library default (the paper's, where it has one) and its one-line meaning; ``expected``
    words what it takes where the type alone would not say it well (the docs' parameter table). A caller
    that knows the training data checks the marked options against it: ``per_step``, training samples drawn
    per optimisation step (at most those available); ``held_out``, the fraction of them held out."""
    marks = {"expected": expected, "per_step": per_step, "held_out": held_out}
    extra = {k: v for k, v in marks.items() if v} or None
    return Field(default, description=meaning, json_schema_extra=extra, **field)


def marked(options: type[BaseModel], mark: str) -> str | None:
    """The name of the field of ``options`` that :func:`option` marked ``mark`` (``per_step``, ``held_out``)."""
    names = [n for n, f in options.model_fields.items() if (f.json_schema_extra or {}).get(mark)]
    return names[0] if names else None


class OptionError(ValueError):
    """A bad option, one line whose ``template`` writes each argument it names in braces
    (``{max_iter} must be …``): ``str(err)`` names them as the function does."""

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.keyed(str))

    def keyed(self, key: Callable[[str], str]) -> str:
        """The line with each argument ``name`` written as ``key(name)``."""
        return self.template.format_map(_Names(key))


@contextmanager
def keyed_errors(key: Callable[[str], str]) -> Iterator[None]:
    """An :class:`OptionError` raised inside as a ``ValueError`` line with each argument ``name`` written
    ``key(name)``: the one way a caller names the library's arguments as its own user knows them (the API's
    ``options['max_iter']``, the pipeline's ``permute.wm.max_iter``, the command's ``--option max_iter``)."""
    try:
        yield
    except OptionError as err:
        raise ValueError(err.keyed(key)) from None


class _Names(dict):
    def __init__(self, key: Callable[[str], str]) -> None:
        super().__init__()
        self.key = key

    def __missing__(self, name: str) -> str:
        return self.key(name)


def got(value: Any) -> str:
    """``repr(value)`` for an :class:`OptionError` template (braces escaped)."""
    return escaped(repr(value))


def escaped(text: Any) -> str:
    """``str(text)`` for an :class:`OptionError` template (braces escaped): a path, another error's line."""
    return str(text).replace("{", "{{").replace("}", "}}")


class Options(BaseModel):
    """A function's keyword options: strict types (an integer is fine where a number belongs),
    finite numbers, no unknown names."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    def __init__(self, **values: Any) -> None:
        """Built directly (``Config(width=0, …)``), a bad value is the same one-line :class:`OptionError`."""
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise _one_line(type(self), err, values) from None

    @classmethod
    def check(cls, values: Mapping[str, Any]) -> Self:
        """``values`` validated, or the :class:`OptionError` of the first bad one."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as err:
            raise _one_line(cls, err, values) from None


def _one_line(model: type[Options], err: ValidationError, values: Mapping[str, Any]) -> OptionError:
    errors = err.errors()
    unknown = sorted(e["loc"][0] for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return OptionError(
            f"{{options}}: unknown option(s) {got(unknown)}; expected some of {got(list(model.model_fields))}"
        )
    if not errors[0]["loc"]:  # a check across options (a model validator) words its own line
        return errors[0]["ctx"]["error"]
    name = errors[0]["loc"][0]
    field = model.model_fields[name]
    # what the field takes: its own wording where the type alone would not say it well (option's expected)
    words = (field.json_schema_extra or {}).get("expected") or in_words(field.annotation, field.metadata, error=True)
    if name not in values:
        return OptionError(f"{{{name}}} is required: {words}")
    return OptionError(f"{{{name}}} must be {words}, got {got(values[name])}")


def in_words(annotation: Any, metadata: Sequence[Any] = (), *, plural: bool = False, error: bool = False) -> str:
    """What a value of ``annotation`` (constrained by ``metadata``) must be, in English: as the docs'
    parameter table says it (``an integer ≥ 1``, ``one of adam, sgd``, ``integers`` when ``plural``), or,
    with ``error``, as an error line does (``a positive integer``, ``one of ['adam', 'sgd']``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        extra = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return in_words(args[0], [*metadata, *extra], plural=plural, error=error)
    if origin in (Union, UnionType):
        inner = [in_words(a, metadata, plural=plural, error=error) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or null" if type(None) in args else "")
    if origin is Literal:
        names = ", ".join(str(a) for a in args)
        if error:
            return f"one of {list(args)}"
        return names if len(args) == 1 else (f"values among {names}" if plural else f"one of {names}")
    if origin in (list, tuple):  # a tuple of a frozen config is a list in params.yaml
        return _list_in_words(args[0], metadata, plural=plural, error=error)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        keys = ", ".join(annotation.model_fields)
        return "blocks" if plural else (f"a block with the keys {keys}" if keys else "an empty block {}")
    words = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans")}
    words[str] = ("a string", "strings")
    low, high = _limits(metadata)
    noun = "integer" if annotation is int else "number"
    if error and not (low and high) and (low == ("(", 0) or (noun == "integer" and low == ("[", 1))):
        return f"a positive {noun}"
    if error and not high and low == ("[", 0):
        return f"a non-negative {noun}"
    if low and high:
        return f"{words[annotation][plural]} in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low or high:
        sign = {"[": "≥", "(": ">", "]": "≤", ")": "<"}[(low or high)[0]]
        return f"{words[annotation][plural]} {sign} {(low or high)[1]}"
    return words[annotation][plural]


def _limits(metadata: Sequence[Any]) -> tuple[tuple[str, Any] | None, tuple[str, Any] | None]:
    """The lower and upper bound among ``metadata``, each ``(bracket, value)`` or None."""
    bound = {name: getattr(m, name) for m in metadata for name in ("ge", "gt", "le", "lt") if hasattr(m, name)}
    low = ("[", bound["ge"]) if "ge" in bound else (("(", bound["gt"]) if "gt" in bound else None)
    high = ("]", bound["le"]) if "le" in bound else ((")", bound["lt"]) if "lt" in bound else None)
    return low, high


def _list_in_words(item: Any, metadata: Sequence[Any], *, plural: bool, error: bool) -> str:
    """:func:`in_words` of a list of ``item`` (its length constrained by ``metadata``)."""
    lo = max([m.min_length for m in metadata if hasattr(m, "min_length")], default=0)
    hi = min([m.max_length for m in metadata if hasattr(m, "max_length")], default=None)
    count = f"{lo} " if lo == hi else (f"at least {lo} " if lo > 1 else "")
    items = in_words(item, plural=True, error=error)
    if plural:
        return f"lists of {count}{items}"
    return f"a {'non-empty ' if lo == 1 and hi is None else ''}list of {count}{items}"


def takes(model: type[Options]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Let ``fn(…, *, options: model, …)`` be called with ``model``'s fields as keyword arguments
    instead: its signature lists them (type, default), a call validates them (:meth:`Options.check`)
    and ``fn`` receives the validated ``options``. The decorated function's ``options`` is ``model``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(fn).parameters.values())
        at = [p.name for p in own].index("options")
        fields = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=_plain(f.annotation))
            for name, f in model.model_fields.items()
        ]
        public = inspect.signature(fn).replace(parameters=[*own[:at], *fields, *own[at + 1 :]])

        @wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = public.bind(*args, **kwargs)  # an unknown keyword is Python's own TypeError
            given = {name: bound.arguments.pop(name) for name in model.model_fields if name in bound.arguments}
            return fn(*bound.args, **bound.kwargs, options=model.check(given))

        call.__signature__ = public  # type: ignore[attr-defined]
        call.options = model  # type: ignore[attr-defined]
        return call

    return wrap


def _plain(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated`` constraints (for a readable signature)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _plain(args[0])
    return Union[*(_plain(a) for a in args)] if origin in (Union, UnionType) else annotation
