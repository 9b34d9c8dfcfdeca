"""Keep the code dependencies of dvc.yaml in the form tests/pipeline/test_stage_deps.py checks:

    python tools/stage_deps.py            # print what each stage's code file covers and what is out of place
    python tools/stage_deps.py --write    # rewrite the code stage and every stage's code dep in dvc.yaml

Each stage that runs ``stages/<name>.py`` depends on ``data/code/<name>.txt``, the list of the files
its script imports with their MD5 (``stages/code.py``, :func:`lmclab.pipeline.closure.code_fingerprint`);
the ``code`` stage writes one such file per stage script and depends on all of ``src/lmclab`` and
``stages/``. ``--write`` keeps every data dependency in place, drops any other source path, adds the
stage's code file, and rewrites the code stage's ``--stages`` list and ``outs`` to cover every script."""

from __future__ import annotations

from pathlib import Path

import typer
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedSeq

from lmclab.pipeline.closure import CODE_STAGE, code_closure, code_file, stage_script

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("src/", "stages/")  # what a stage's code file stands for
CODE_DEPS = ["src/lmclab", "stages"]
app = typer.Typer(add_completion=False)


def code_command(names: list[str]) -> str:
    return f"python stages/{CODE_STAGE}.py --out data/code --stages {','.join(names)}"


@app.command()
def main(
    write: bool = typer.Option(False, help="rewrite the code deps in dvc.yaml"), dvc_yaml: Path = ROOT / "dvc.yaml"
) -> None:
    yaml = YAML()
    yaml.width, yaml.preserve_quotes = 120, True
    yaml.indent(mapping=2, sequence=4, offset=2)
    pipeline = yaml.load(dvc_yaml)
    stages = pipeline["stages"]
    names, problems = [], []  # stage scripts in dvc.yaml order, each once
    for name, stage in stages.items():
        script = stage_script(stage["cmd"])
        stem = Path(script).stem if script else None
        if stem is None or name == CODE_STAGE:
            continue
        names += [stem] if stem not in names else []
        deps = [str(d) for d in stage.get("deps") or []]
        wanted = [d for d in deps if not d.startswith(SOURCES) and not d.startswith("data/code/")]
        wanted.append(code_file(stem))
        print(f"{name}: {code_file(stem)} covers {len(code_closure(dvc_yaml.parent, script))} files")
        if deps != wanted:
            problems.append(f"{name}: deps {deps} should be {wanted}")
        if write:
            stage["deps"] = CommentedSeq([d for d in stage.get("deps") or [] if str(d) in wanted[:-1]] + wanted[-1:])
    code = stages.get(CODE_STAGE)
    if code is None or code["cmd"] != code_command(names) or [str(d) for d in code.get("deps") or []] != CODE_DEPS:
        problems.append(f"{CODE_STAGE}: should run `{code_command(names)}` with deps {CODE_DEPS}")
    print("\n".join(problems))
    if problems and not write:
        raise SystemExit(1)
    if write:
        if code is None:
            raise SystemExit(f"error: dvc.yaml: no {CODE_STAGE!r} stage to rewrite (add one before validate)")
        code["cmd"], code["deps"] = code_command(names), CommentedSeq(CODE_DEPS)
        code["outs"] = CommentedSeq(code_file(n) for n in names)
        yaml.dump(pipeline, dvc_yaml)
        text = dvc_yaml.read_text()  # ruamel leaves a space at the end of folded flow lists
        dvc_yaml.write_text("\n".join(line.rstrip() for line in text.splitlines()) + "\n")


if __name__ == "__main__":
    app()
