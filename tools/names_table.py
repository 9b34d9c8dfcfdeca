"""Write the table of names of docs/api.md (one row per concept: its params.yaml keys, API keyword and command
option) from the registry ``lmclab.cli.names`` — not a DVC stage (~1 s).

    python tools/names_table.py            # rewrite the table in docs/api.md
    python tools/names_table.py --check    # exit 1 if docs/api.md's table differs from the registry

tests/cli/test_names.py checks the same.
"""

from __future__ import annotations

from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
START = "<!-- names table: generated from src/lmclab/cli/names.py by tools/names_table.py -->"
END = "<!-- end of names table -->"
app = typer.Typer(add_completion=False)


def markdown() -> str:
    from lmclab.cli.names import CONCEPTS, rows

    lines = [
        "| concept | params.yaml | API keyword | `lmclab` option | why the names differ | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for name, keys, keyword, flag, reason in rows():
        lines.append(f"| {name} | {keys} | {keyword} | {flag} | {reason} | {CONCEPTS[name].meaning} |")
    return "\n".join([START, *lines, END])


def rendered(page: str) -> str:
    """``page`` with its table (between the markers) replaced by the registry's."""
    if START not in page or END not in page:
        raise SystemExit(f"error: {PAGE}: no table markers ({START} … {END})")
    head, rest = page.split(START, 1)
    return head + markdown() + rest.split(END, 1)[1]


@app.command()
def main(check: bool = typer.Option(False, help="exit 1 if the page's table differs")) -> None:
    page = PAGE.read_text()
    if check:
        if rendered(page) != page:
            raise SystemExit(f"error: {PAGE}: the names table differs from src/lmclab/cli/names.py; run {__file__}")
        return
    PAGE.write_text(rendered(page))


if __name__ == "__main__":
    app()
