"""Stage code: each stage's code as one small file. ``<out>/<stage>.txt`` lists every file of this
repository that ``stages/<stage>.py`` imports, directly or through any chain of imports (its import
closure, :mod:`lmclab.pipeline.closure`), one ``<md5>  <path>`` line each, sorted.

Every other stage depends on its own file instead of listing its ~40 source files: it still reruns
exactly when code it runs changes (this stage depends on all of ``src/lmclab`` and ``stages/``, reruns
on any edit in under a second, and rewrites only the files whose content changed), while dvc.lock,
which DVC parses and rewrites whole after every stage, is half as long (docs/internals.md, "A cache
you can trust"). Imports no third-party module."""

from __future__ import annotations

import argparse
import sys

from _repo_src import REPO  # first: this repository's src/ on sys.path

from lmclab.core.atomic import write_text
from lmclab.pipeline.closure import code_fingerprint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", required=True, help="comma-separated stage names (stages/<name>.py)")
    parser.add_argument("--out", required=True, help="folder of the <stage>.txt files")
    args = parser.parse_args(argv)
    names = [n for n in args.stages.split(",") if n]
    missing = [n for n in names if not (REPO / "stages" / f"{n}.py").is_file()]
    if not names or missing:
        raise SystemExit(f"error: --stages: expected names of scripts in stages/, got {missing or args.stages!r}")
    for name in names:
        text = code_fingerprint(REPO, f"stages/{name}.py")
        target = REPO / args.out / f"{name}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, text)


if __name__ == "__main__":
    main(sys.argv[1:])
