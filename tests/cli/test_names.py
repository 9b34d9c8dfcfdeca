"""One name per concept (``lmclab.cli.names``): every keyword of the public API and every option of the
``lmclab`` command is registered under its concept, every registered name is where the registry says (a
function's signature, a command's options, params.yaml's schema), names of one concept agree unless a reason
is written, and docs/api.md's table is the registry's."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import lmclab
from lmclab import cli
from lmclab.cli.names import (
    CONCEPTS,
    FUNCTIONS,
    Concept,
    flag_concepts,
    flag_of,
    keyword_concepts,
    rows,
    same_name,
)
from lmclab.pipeline.keys import key_rows

ROOT = Path(__file__).resolve().parents[2]


def _keywords() -> dict[str, set[str]]:
    """keyword → the public functions taking it (``**config`` as ``config``)."""
    found: dict[str, set[str]] = {}
    for fn in FUNCTIONS:
        for name in inspect.signature(getattr(lmclab, fn)).parameters:
            found.setdefault(name, set()).add(fn)
    return found


def _flags() -> dict[str, set[str]]:
    """``--flag`` or ``ARGUMENT`` → the commands taking it (the app's global options included)."""
    group = typer.main.get_command(cli.app)
    found: dict[str, set[str]] = {}
    commands = [(n, c) for n, c in group.commands.items() if n != "study"]  # a study's options are its own
    for name, command in [("lmclab", group), *commands]:
        for param in command.params:
            for flag in [o for o in param.opts if o.startswith("--")] or [param.name.upper()]:
                if flag != "--help":
                    found.setdefault(flag, set()).add(name)
    return found


def _keys() -> set[str]:
    return {row[0] for row in key_rows()}


def test_every_keyword_of_the_api_is_a_registered_concept() -> None:
    unregistered = sorted(set(_keywords()) - set(keyword_concepts()))
    assert not unregistered, f"API keywords without a concept in lmclab.cli.names: {unregistered}"


def test_every_option_of_the_command_is_a_registered_concept() -> None:
    unregistered = sorted(set(_flags()) - set(flag_concepts()))
    assert not unregistered, f"lmclab options without a concept in lmclab.cli.names: {unregistered}"


def test_every_registered_name_is_where_the_registry_says() -> None:
    keywords, flags, keys = _keywords(), _flags(), _keys()
    for name, concept in CONCEPTS.items():
        assert concept.keyword is None or concept.keyword in keywords, (name, concept.keyword)
        for flag in ([concept.flag] if concept.flag else []) + list(concept.also):
            assert flag in flags, (name, flag)
        for key in concept.keys:
            block = key.split(".<")[0]  # permute.<method>: the block of each method
            assert key in keys or any(k.startswith(f"{block}.") for k in keys), (name, key)


def test_the_names_of_a_concept_agree_unless_a_reason_says_why() -> None:
    differ = [name for name, c in CONCEPTS.items() if not same_name(c) and not c.reason]
    assert not differ, f"concepts named differently without a reason: {differ}"
    needless = [name for name, c in CONCEPTS.items() if same_name(c) and c.reason]
    assert not needless, f"a reason given where the names agree: {needless}"


@pytest.mark.parametrize(
    ("concept", "agree"),
    [
        (Concept(("measure.repair_samples",), "repair_samples", "--repair-samples"), True),
        (Concept(("data.root",), None, "--data-root"), True),
        (Concept(("measure.num_lambdas",), "lams", "--num-lambdas"), False),
        (Concept(("measure.bn_repair_samples",), "repair_samples", None), False),
        (Concept((), "alignment", "--perm"), False),
    ],
)
def test_same_name_reads_a_flag_and_a_key_path_as_the_keyword(concept: Concept, agree: bool) -> None:
    assert same_name(concept) is agree


def test_an_error_names_the_commands_option_or_the_keyword_where_the_command_has_none() -> None:
    assert flag_of("num_lambdas") == "--num-lambdas" and flag_of("repair_samples") == "--repair-samples"
    assert flag_of("lambdas") == "lambdas"  # a keyword of the API the command has no option for
    assert flag_of("max_iter") == "max_iter"  # a method's own option: no concept of the registry


def test_the_table_rows_quote_each_name_and_show_a_dash_where_a_concept_has_none() -> None:
    table = {row[0]: row for row in rows()}
    assert list(table) == list(CONCEPTS)
    assert table["device"] == ("device", "`device`", "`device`", "`--device`", "")
    assert table["threads"][2] == "—" and table["lambdas"][1::2] == ("—", "—")  # no keyword; no key, no flag


def test_the_docs_table_is_the_registrys() -> None:
    done = subprocess.run([sys.executable, "tools/names_table.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
