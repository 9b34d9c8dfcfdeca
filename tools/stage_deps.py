"""The code each stage of dvc.yaml runs, as its ``deps:`` must list it (src/lmclab/pipeline/closure.py):

    python tools/stage_deps.py            # print each stage's code deps and what dvc.yaml misses
    python tools/stage_deps.py --write    # rewrite the code entries of every stage's deps: in dvc.yaml

``--write`` keeps a stage's data deps (anything outside ``src/`` and ``stages/``) in place and
replaces its code entries by the fewest paths covering the stage script's import closure (a package
folder when the stage imports all of it). tests/test_stage_deps.py fails when a stage misses one."""

from __future__ import annotations

from pathlib import Path

import typer
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedSeq

from lmclab.pipeline.closure import code_closure, covered, minimal_cover, stage_script

ROOT = Path(__file__).resolve().parent.parent
CODE = ("src/", "stages/")
app = typer.Typer(add_completion=False)


@app.command()
def main(
    write: bool = typer.Option(False, help="rewrite the code deps in dvc.yaml"), dvc_yaml: Path = ROOT / "dvc.yaml"
) -> None:
    yaml = YAML()
    yaml.width, yaml.preserve_quotes = 120, True
    yaml.indent(mapping=2, sequence=4, offset=2)
    pipeline = yaml.load(dvc_yaml)
    missing_any = False
    for name, stage in pipeline["stages"].items():
        script = stage_script(stage["cmd"])
        if script is None:
            continue
        files = code_closure(dvc_yaml.parent, script)
        deps = [str(d) for d in stage.get("deps") or []]
        missing = sorted(f for f in files if not covered(f, deps))
        missing_any |= bool(missing)
        code = minimal_cover(files, dvc_yaml.parent)
        print(f"{name}: {len(files)} files; deps: {', '.join(code)}")
        if missing:
            print(f"  missing from dvc.yaml: {', '.join(missing)}")
        if write:
            data = [d for d in stage.get("deps") or [] if not str(d).startswith(CODE)]
            stage["deps"] = CommentedSeq([*data, *code])
    if write:
        yaml.dump(pipeline, dvc_yaml)
        text = dvc_yaml.read_text()  # ruamel leaves a space at the end of folded flow lists
        dvc_yaml.write_text("\n".join(line.rstrip() for line in text.splitlines()) + "\n")
    elif missing_any:
        raise SystemExit(1)


if __name__ == "__main__":
    app()
