"""Write the parameter table of the docs (``docs/parameters.md``) from the schema of params.yaml
(``lmclab.pipeline.schema``): one row per key with its default, what it expects and its meaning — not a DVC
stage (~2 s).

    python tools/params_table.py             # rewrite the table in docs/parameters.md
    python tools/params_table.py --check     # exit 1 if docs/parameters.md's table differs from the schema

tests/pipeline/test_validate.py checks the same, so the table and the schema cannot drift apart.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from lmclab.pipeline.preset import flow
from lmclab.pipeline.stage import one_line_errors

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "parameters.md"
app = typer.Typer(add_completion=False)
START = "<!-- parameter table: generated from src/lmclab/pipeline/schema.py by tools/params_table.py -->"
END = "<!-- end of parameter table -->"


def markdown() -> str:
    from lmclab.pipeline.keys import key_rows

    lines = ["| key | default | expected | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{key}` | {flow(default)} | {expected} | {meaning.replace('<', '&lt;')} |"
        for key, default, expected, meaning in key_rows()
    ]
    return "\n".join(lines) + "\n"


def with_table(page: str) -> str:
    """``page`` with the text between the START and END markers replaced by the table."""
    if START not in page or END not in page:
        raise ValueError(f"{PAGE.relative_to(ROOT)}: no parameter table markers ({START} … {END})")
    head, rest = page.split(START, 1)
    return f"{head}{START}\n{markdown()}{END}{rest.split(END, 1)[1]}"


@app.command()
@one_line_errors
def main(page: Path = PAGE, check: bool = typer.Option(False)) -> None:
    text = page.read_text()
    new = with_table(text)
    if check:
        raise SystemExit(0 if new == text else f"error: {page}: the parameter table differs from the schema")
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(new)
    os.replace(tmp, page)
    typer.echo(f"{page}: parameter table written ({markdown().count(chr(10)) - 2} keys)")


if __name__ == "__main__":
    app()
