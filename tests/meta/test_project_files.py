"""The files a user cites and redistributes by agree with the package: CITATION.cff's version and
license are pyproject's, it cites the paper the default run reproduces, and LICENSE is that license."""

from __future__ import annotations

import tomllib

from dvc_repo import ROOT
from ruamel.yaml import YAML

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CITATION = YAML(typ="safe").load((ROOT / "CITATION.cff").read_text())


def test_the_citation_names_this_version_and_license() -> None:
    assert CITATION["cff-version"] == "1.2.0"
    assert str(CITATION["version"]) == PROJECT["version"], "bump CITATION.cff's version with pyproject's"
    assert CITATION["license"] == PROJECT["license"]["text"]
    assert (ROOT / "LICENSE").read_text().startswith(f"{PROJECT['license']['text']} License")


def test_the_citation_cites_the_paper_the_default_run_reproduces() -> None:
    (paper,) = [ref for ref in CITATION["references"] if ref["type"] == "conference-paper"]
    assert paper["title"].startswith("Analysis of Linear Mode Connectivity via Permutation-Based Weight Matching")
    assert [a["family-names"] for a in paper["authors"]] == ["Ito", "Yamada", "Kumagai"]
    assert paper["year"] == 2025 and "2402.04051" in paper["url"]
    assert paper["url"] in (ROOT / "README.md").read_text()  # the README links the same paper
