"""Stage-side plumbing shared by the thin stage scripts in ``stages/`` (run by DVC in the directory of
``dvc.yaml``): reading params.yaml as DVC does (YAML 1.2)
and only through the keys the stage declares under ``params:`` in dvc.yaml, turning library errors
into one-line messages, and running a stage in a warm-started process (``lmclab.runtime.warmstart``) that
dies with whatever started it (``lmclab.runtime.lifetime``)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

STARTED_BY = os.getppid()  # read first: if this starter (dvc) is gone by run_warm, the stage must not run

# after STARTED_BY on purpose; standard library only: no heavy import here
from lmclab.runtime.lifetime import die_with_parent  # noqa: E402 (STARTED_BY is read first, see above)
from lmclab.runtime.warmstart import enabled, run_script  # noqa: E402

DVC_YAML = "dvc.yaml"  # named in errors; each stage script passes its own repository's file
PLACEHOLDER = re.compile(r"\$\{\s*([\w.]+)\s*\}")


def parse_yaml(text: str, where: object = "<text>") -> Any:
    """YAML 1.2, as DVC reads and writes params.yaml (ruamel.yaml): ``tol: 1e-06`` (what
    ``dvc exp run -S tol=1e-6`` writes) is a float, not the string PyYAML's YAML 1.1 makes of it."""
    from ruamel.yaml import YAML, YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise SystemExit(f"error: {where}: not valid YAML ({' '.join(str(exc).split())})") from None


def load_yaml(path: Path) -> Any:
    """The YAML 1.2 file at ``path`` (see :func:`parse_yaml`)."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"error: {path}: file not found")
    return parse_yaml(path.read_text(), path)


def declared_keys(dvc_yaml: Mapping, stage: str, tree: Mapping, item: Mapping[str, Any]) -> list[str]:
    """The params.yaml keys ``stage`` lists under ``params:`` in ``dvc_yaml``, with ``${item.X}``
    taken from ``item`` (a matrix stage's own values) and ``${a.b}`` from params.yaml; ``""`` stands
    for the whole file (``- params.yaml:`` with no keys)."""
    if stage not in dvc_yaml.get("stages", {}):
        raise SystemExit(f"error: {DVC_YAML}: no stage {stage!r}")

    def resolve(match: re.Match) -> str:
        name = match[1]
        value = item.get(name[5:]) if name.startswith("item.") else _lookup(tree, name)
        if value is None or value is ABSENT:
            raise SystemExit(f"error: {DVC_YAML}: stage {stage}: cannot resolve ${{{name}}}")
        return str(value)

    keys = []
    for entry in dvc_yaml["stages"][stage].get("params") or []:
        if isinstance(entry, str):
            keys.append(entry)
        elif isinstance(entry, Mapping) and "params.yaml" in entry:
            keys += entry["params.yaml"] or [""]
    return [PLACEHOLDER.sub(resolve, k) for k in keys]


ABSENT = object()


def _lookup(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` of ``tree``, or ``ABSENT``."""
    for part in key.split(".") if key else []:
        if not isinstance(tree, Mapping) or part not in tree:
            return ABSENT
        tree = tree[part]
    return tree


class StageParams:
    """params.yaml as one stage of dvc.yaml may read it. Reading a key (or a key inside a block
    read whole) that the stage's ``params:`` do not cover is refused: DVC would not rerun the stage
    when that key changes, and would serve a stale result."""

    def __init__(self, stage: str, path: Path, *, dvc_yaml: Path, **item: Any) -> None:
        self.stage, self.path = stage, Path(path)
        self.tree = load_yaml(self.path) or {}
        self.declared = declared_keys(load_yaml(dvc_yaml) or {}, stage, self.tree, item)

    def covers(self, key: str) -> bool:
        return any(d in ("", key) or key.startswith(d + ".") for d in self.declared)

    def read(self, key: str) -> Any:
        """The value at dotted ``key`` (``""``: the whole file); a block of which only some keys
        are declared comes back as a read-only mapping that checks each look-up."""
        partly = any(d.startswith(key + ".") for d in self.declared)
        if not (self.covers(key) or partly):
            raise SystemExit(
                f"error: stage {self.stage} reads params key {key}, which its params: "
                f"in {DVC_YAML} do not declare (DVC would not rerun it when {key} changes)"
            )
        value = _lookup(self.tree, key)
        if value is ABSENT:
            raise SystemExit(f"error: {self.path}: missing key {key}")
        return value if self.covers(key) or not isinstance(value, Mapping) else DeclaredBlock(self, key, value)


class DeclaredBlock(Mapping):
    """A block of params.yaml whose look-ups go through :meth:`StageParams.read`."""

    def __init__(self, params: StageParams, key: str, value: Mapping) -> None:
        self._params, self._key, self._value = params, key, value

    def __getitem__(self, name: str) -> Any:
        key = f"{self._key}.{name}"
        if name not in self._value and self._params.covers(key):
            raise KeyError(name)  # declared but absent: ``.get(name, default)`` works
        return self._params.read(key)  # refuses an undeclared key

    def __iter__(self) -> Iterator[str]:
        return iter(self._value)

    def __len__(self) -> int:
        return len(self._value)


def stage_params(stage: str, path: Path, *, dvc_yaml: Path, **item: Any) -> Callable[[str], Any]:
    """``read(key)`` for stage ``stage`` (matrix stages pass their ``item`` values, e.g. ``method``), after
    setting this process's threads (:func:`stage_threads`)."""
    params = StageParams(stage, path, dvc_yaml=dvc_yaml, **item)
    stage_threads(params)
    return params.read


def stage_threads(params: StageParams) -> int:
    """The thread policy (:mod:`lmclab.core.threads`) for this stage process: ``LMCLAB_THREADS`` when set,
    else params.yaml's ``threads`` where the stage declares it (the computing stages: their results
    depend on it in the last bits), else ``auto``."""
    from lmclab.core.threads import ENVIRONMENT, use_threads

    if os.environ.get(ENVIRONMENT):
        try:
            return use_threads(os.environ[ENVIRONMENT])
        except ValueError as exc:  # "threads: …", named as the variable
            raise SystemExit(f"error: {ENVIRONMENT}{str(exc).removeprefix('threads')}") from None
    return use_threads(params.read("threads") if params.covers("threads") else "auto")


def show_progress() -> bool:
    """Progress bars (on stderr) only when stdout is a terminal: quiet in CI, pipes and logs."""
    return sys.stdout.isatty()


def one_line_errors(fn: Callable) -> Callable:
    """Print bad-input errors (ValueError, FileNotFoundError, ...) as ``error: …`` and exit 1."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise SystemExit(f"error: {str(exc).splitlines()[0]}") from None

    return wrapper


Key = Mapping[str, str] | Callable[[str], str]  # an argument's name -> its params.yaml key


def under(block: str, *names: str) -> dict[str, str]:
    """The params.yaml keys of arguments named as their keys in ``block`` (``under("three", "margin")``:
    ``margin`` is ``three.margin``): the library's arguments carry params.yaml's names (lmclab.cli.names)."""
    return {name: f"{block}.{name}" for name in names}


class LazyKeys(Mapping):
    """The params.yaml keys ``make()`` returns, computed at the first look-up: a stage script whose keys
    come from an options model in a module that imports torch stays light to import, so that its warm
    start (:func:`run_warm`) saves those imports instead of paying them before handing over."""

    def __init__(self, make: Callable[[], Mapping[str, str]]) -> None:
        self._make, self._keys = make, None

    def _known(self) -> Mapping[str, str]:
        if self._keys is None:
            self._keys = dict(self._make())
        return self._keys

    def __getitem__(self, name: str) -> str:
        return self._known()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._known())

    def __len__(self) -> int:
        return len(self._known())


def params_key(*keys: Key) -> Callable[[str], str]:
    """The key of an argument by the first of ``keys`` that knows it: a mapping that lists it, or a
    function (it knows every name); an argument none of them knows keeps its name."""

    def key(name: str) -> str:
        for known in keys:
            if callable(known):
                return known(name)
            if name in known:
                return known[name]
        return name

    return key


@contextmanager
def params_errors(*keys: Key) -> Iterator[None]:
    """Report the library's one-line errors, which name the function's arguments
    (:class:`lmclab.core.options.OptionError`), under params.yaml's keys: ``num_lambdas must be …``
    becomes ``measure.num_lambdas must be …`` (:func:`params_key`). A ``with`` block or a decorator."""
    from lmclab.core.options import OptionError

    try:
        yield
    except OptionError as err:
        raise ValueError(err.keyed(params_key(*keys))) from None


def choice_key(block: str, choice: str, chooser: str, chosen: str, among: str) -> Callable[[str], str]:
    """The params.yaml key of each argument the library's errors name about ``choice``, one of ``block``'s
    choices with a block of its own: the ``chooser`` argument (``method``, ``arch``) is ``block.<among>``, the
    ``chosen`` one (``options``, ``config``) the block ``block.<choice>``, any other a field of that block."""
    own = f"{block}.{choice}"
    return lambda name: {chooser: f"{block}.{among}", chosen: own}.get(name, f"{own}.{name}")


def method_key(block: str, method: str) -> Callable[[str], str]:
    """A method's keys (``permute``, ``merge_many``): ``method`` is ``<block>.methods``, ``options`` the block
    ``<block>.<method>``, an option ``<block>.<method>.<option>``."""
    return choice_key(block, method, "method", "options", "methods")


def search_errors(method: str) -> AbstractContextManager[None]:
    """:func:`params_errors` of the search library: ``max_iter must be …`` becomes
    ``permute.wm.max_iter must be …`` (:func:`method_key`)."""
    return params_errors(method_key("permute", method))


def model_key(arch: str) -> Callable[[str], str]:
    """The architectures' keys: ``arch`` is ``model.arch``, a ``config`` the block ``model.<arch>``, one of its
    fields ``model.<arch>.<field>``."""
    return choice_key("model", arch, "arch", "config", "arch")


def run_warm(app: Any) -> None:
    """Run the stage's typer ``app`` in a warm worker (``lmclab.runtime.warmstart``; ~3 s of imports saved),
    or here when warm start is off (``LMCLAB_WARM=0``), unavailable, this is the worker, or the command
    line asks for ``--help`` or is refused (no server is started for those). Either
    way the stage is SIGKILLed when the process that started it (``dvc``) dies, so no stage outlives
    its ``dvc`` and writes outputs behind a rerun's back."""
    die_with_parent(STARTED_BY)
    code = run_script(sys.argv[0], sys.argv[1:]) if enabled() and accepts(app, sys.argv[1:]) else None
    if code is None:
        app()
    else:
        raise SystemExit(code)


def accepts(app: Any, argv: list[str]) -> bool:
    """Whether the typer ``app`` would run its command on ``argv``: ``--help`` or a command line it refuses
    is answered in this process by ``app()``, never by a warm-start server started for it (parsed
    silently here: ``app()`` prints the help or the error)."""
    import typer

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            typer.main.get_command(app).make_context(Path(sys.argv[0]).name, list(argv))
        except (typer.Exit, typer.Abort, typer.TyperException):  # --help; a usage error
            return False
    return True
