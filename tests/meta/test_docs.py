"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor between pages, a
missing figure, a page left out of the navigation or an API object that no longer resolves fails the
build (and so this test); the Python API page documents every public name of ``lmclab``; docs/scripts.md
says in one line what every script of ``tools/`` and ``benchmarks/`` is for (a script without its line fails)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dvc_repo import ROOT

import lmclab

DOCS = ROOT / "docs"


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)


def _copy(tmp: Path) -> tuple[Path, Path]:
    """mkdocs.yml and docs/ copied to ``tmp`` (figures and sources still read from the repository)."""
    shutil.copytree(DOCS, tmp / "docs", symlinks=True)
    (tmp / "docs" / "reports").unlink()
    (tmp / "docs" / "reports").symlink_to(ROOT / "reports")
    config = (ROOT / "mkdocs.yml").read_text()
    assert "docs_dir: docs\n" in config and "paths: [src]" in config
    config = config.replace("docs_dir: docs\n", f"docs_dir: {tmp / 'docs'}\n")
    (tmp / "mkdocs.yml").write_text(config.replace("paths: [src]", f"paths: [{ROOT / 'src'}]"))
    return tmp / "mkdocs.yml", tmp / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = _build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_its_pages_and_figures(site) -> None:
    for page in ("index", "getting-started", "parameters", "api", "cli", "results"):
        assert (site / f"{page}.html").is_file(), page  # use_directory_urls: false, opens from the file system
    assert (site / "reports" / "figures" / "interpolation.png").is_file()  # through the docs/reports symlink
    home = (site / "index.html").read_text()
    assert "reports/figures/interpolation.png" in home
    assert "fonts.googleapis.com" not in home  # theme font: false, the site works offline


def test_the_api_page_documents_every_public_name(site) -> None:
    documented = set(re.findall(r"^::: lmclab\.api\.(\w+)$", (DOCS / "api.md").read_text(), flags=re.M))
    assert set(lmclab.API) <= documented, sorted(set(lmclab.API) - documented)
    html = (site / "api.html").read_text()
    for name in lmclab.API:
        assert f'id="lmclab.api.{name}"' in html, name


def test_no_page_points_outside_the_repository() -> None:
    for page in DOCS.glob("*.md"):
        assert "../shared" not in page.read_text(), page.name


@pytest.mark.slow
def test_a_broken_link_or_api_name_fails_the_build(tmp_path) -> None:
    config, docs = _copy(tmp_path / "link")
    page = docs / "methods.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    proc = _build(config, tmp_path / "site-link")
    assert proc.returncode != 0 and "no-such-page.md" in proc.stderr, proc.stderr[-2000:]

    config, docs = _copy(tmp_path / "api")
    page = docs / "api.md"
    page.write_text(page.read_text().replace("::: lmclab.api.merge\n", "::: lmclab.api.merge_models\n"))
    proc = _build(config, tmp_path / "site-api")
    assert proc.returncode != 0 and "lmclab.api.merge_models" in proc.stderr, proc.stderr[-2000:]


SCRIPTS_PAGE = DOCS / "scripts.md"
FOLDERS = ("tools", "benchmarks")
SUFFIXES = (".py", ".sh")


def scripts() -> set[str]:
    """Every script of the two folders (their own files, not what a tool installs beside it)."""
    return {f"{folder}/{p.name}" for folder in FOLDERS for p in (ROOT / folder).iterdir() if p.suffix in SUFFIXES}


def indexed(page: str) -> dict[str, str]:
    """The page's table rows: script -> its line."""
    rows = re.findall(r"^\| `((?:tools|benchmarks)/[^`]+)` \| (.+) \|$", page, flags=re.M)
    return dict(rows)


def test_every_script_has_one_line_and_every_line_a_script() -> None:
    found = indexed(SCRIPTS_PAGE.read_text())
    assert scripts() - set(found) == set(), f"docs/scripts.md: no line for {sorted(scripts() - set(found))}"
    assert set(found) - scripts() == set(), (
        f"docs/scripts.md: lines for missing scripts {sorted(set(found) - scripts())}"
    )
    assert all(line.strip() for line in found.values())


def test_a_script_missing_from_the_index_is_named() -> None:
    page = SCRIPTS_PAGE.read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `tools/results.py` |"))
    assert "tools/results.py" not in indexed(page.replace(row + "\n", ""))
    assert "tools/results.py" in scripts()
