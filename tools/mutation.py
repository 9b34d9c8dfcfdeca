"""Mutation testing of the library with mutmut: how many plausible bugs do the tests catch?

    python tools/mutation.py                       # the modules changed on this branch (all their mutants)
    python tools/mutation.py core trace --sample 100 --seed 0    # 100 mutants drawn per package
    python tools/mutation.py src/lmclab/core/assignment.py       # one module, all its mutants
    python tools/mutation.py --render              # only rewrite docs/mutation.md from the results

(`make mutation MODULES="core trace" SAMPLE=100`.) With no MODULES: the library modules changed since the
merge base of HEAD with ``origin/main`` (else ``main``), uncommitted changes included; when none changed,
a first draw of ``FIRST_DRAW`` mutants per package of every package (seeded: the same draw each time).
The working tree is copied into ``.mutation/work``
(kept between runs, so mutmut's record of which test calls which function is collected once), mutmut
writes each mutant into that copy behind a trampoline, and a fork server runs, for each mutant, only the
tests that called the mutated function (stopping at the first failure). The per-module counts and the
surviving diffs go into ``reports/mutation/results.json``; ``docs/mutation.md`` is rendered from it.
Mutants that cannot change behaviour are listed with the reason in ``tools/mutation_equivalent.yaml``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutation_operators  # noqa: E402
import mutation_report as report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = Path("src/lmclab")
# tests/meta reads the repository as files (lint, docs, layers): under mutmut it would lint the trampolines;
# slow tests run the stages in other processes, where mutmut cannot see which function a test reached
TEST_SELECTION = ["tests", "--ignore=tests/meta", "-m", "not slow"]
FIRST_DRAW = 10  # mutants per package when no module changed: a first-draw sample of the whole library
app = typer.Typer(add_completion=False)


def merge_base(root: Path) -> str:
    """The commit this branch left the main line at (``origin/main``, else ``main``); HEAD without either."""
    for ref in ("origin/main", "main"):
        out = subprocess.run(["git", "merge-base", "HEAD", ref], cwd=root, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return "HEAD"


def resolve_targets(names: list[str], root: Path, since: str) -> list[Path]:
    """Library modules (paths relative to ``root``) named as packages (``core``), modules
    (``lmclab.core.spec``) or files; none named: the ``.py`` files under ``src/lmclab`` changed since ``since``."""
    if not names:
        since = merge_base(root) if since == "auto" else since
        out = subprocess.run(
            ["git", "diff", "--name-only", since, "--", str(LIBRARY)], cwd=root, capture_output=True, text=True
        )
        if out.returncode:
            raise typer.BadParameter(f"git diff {since}: {out.stderr.strip()}", param_hint="--since")
        return sorted(Path(p) for p in out.stdout.split() if p.endswith(".py") and (root / p).exists())
    found: list[Path] = []
    for name in names:
        rel = Path(name.removeprefix("lmclab.").replace(".", "/")) if "/" not in name else None
        candidates = [Path(name), LIBRARY / name] + ([LIBRARY / rel, LIBRARY / f"{rel}.py"] if rel else [])
        hit = next((c for c in candidates if (root / c).exists() and str(c).startswith(str(LIBRARY))), None)
        if hit is None:
            raise typer.BadParameter(f"{name!r} is no package, module or file of {LIBRARY}", param_hint="MODULES")
        found += sorted(p.relative_to(root) for p in (root / hit).rglob("*.py")) if (root / hit).is_dir() else [hit]
    return sorted(set(found))


def sync_worktree(root: Path, work: Path) -> None:
    """Copy every tracked and untracked, not ignored file of ``root`` into ``work`` (mtimes kept, so
    mutmut sees which sources changed since its last run), and drop the files that are gone."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    wanted = {p for p in listed if p and (root / p).is_file()}
    for rel in wanted:
        src, dst = root / rel, work / rel
        if not dst.exists() or dst.stat().st_mtime != src.stat().st_mtime or dst.stat().st_size != src.stat().st_size:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    for path in work.rglob("*"):
        rel = path.relative_to(work).as_posix()
        if path.is_file() and not rel.startswith(("mutants/", ".git/")) and rel not in wanted:
            path.unlink()


def write_config(root: Path, work: Path, tests: list[str]) -> None:
    """The project's pyproject.toml with mutmut's section: mutate the whole library (so that one stats run
    records which test calls which function for every later choice of modules), run the tests by fork
    server (torch is not fork-safe once its threads run), credit a test with the calls of the processes it
    forks too (``tools/mutation_forks.py``), and copy what the tests read beside ``tests/``."""
    tops = sorted({p.parts[0] for p in map(Path, os.listdir(work))} - {"src", "tests", "mutants", "pyproject.toml"})
    section = {
        "source_paths": ["src"],
        "only_mutate": [f"{LIBRARY}/*"],
        "also_copy": tops,
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", "mutation_forks"],  # calls in forks too
        "process_isolation": "forkserver",
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    (work / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "\n".join(lines) + "\n")


@contextlib.contextmanager
def inside(work: Path):
    """mutmut reads its configuration and writes ``mutants/`` relative to the working directory."""
    here = Path.cwd()
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(here)


def generate(work: Path) -> dict[str, list[str]]:
    """Write the mutants of the library (files unchanged since the last run are kept); module → mutant names."""
    from mutmut.__main__ import create_mutants, set_mutant_under_test
    from mutmut.utils.file_utils import copy_src_dir

    mutation_operators.install()  # the operators mutmut lacks (tools/mutation_operators.py)
    with inside(work):
        set_mutant_under_test("mutant_generation")
        copy_src_dir()
        create_mutants(os.cpu_count() or 1)
    return {module: sorted(meta["exit_code_by_key"]) for module, meta in report.read_meta(work).items()}


def draw(mutants: dict[str, list[str]], sample: int, seed: int) -> list[str]:
    """Every mutant, or ``sample`` of them per package drawn with ``random.Random(f"{seed}:{package}")``."""
    by_package: dict[str, list[str]] = {}
    for module, names in sorted(mutants.items()):
        by_package.setdefault(module.split(".")[1], []).extend(names)
    chosen: list[str] = []
    for package, names in sorted(by_package.items()):
        chosen += random.Random(f"{seed}:{package}").sample(names, min(sample, len(names))) if sample else names
    return sorted(chosen)


# `mutmut run` with this project's operators installed (were it to write a module's mutants again, they
# are the same mutants under the same names). mutmut first runs every test that calls a chosen mutant's
# function, unmutated, and stops if one fails; for a sample spread over a package that is most of the
# suite (15 min here). --trust-tests skips it when the suite has just passed (`make test`); mutmut's
# forced-fail check still runs.
RUNNER = "import mutation_operators; mutation_operators.install()\nfrom mutmut.__main__ import cli\n"
TRUSTING = (
    "import mutmut.workers.isolation as w\n"
    "for runner in (w.ForkServerRunner, w.ForkRunner): runner.run_clean_tests = lambda self, tests: 0\n"
)


def run_mutmut(work: Path, names: list[str], jobs: int, trust_tests: bool) -> None:
    """``mutmut run`` on the chosen mutants, one torch thread per worker (the workers share the cores)."""
    here = str(Path(__file__).resolve().parent)  # mutation_forks, the plugin, whatever project is mutated
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": path}
    script = RUNNER + (TRUSTING if trust_tests else "") + "cli()"
    cmd = [sys.executable, "-c", script, "run", "--max-children", str(jobs), *names]
    proc = subprocess.run(cmd, cwd=work, env=env)
    if proc.returncode:
        raise SystemExit(f"mutmut run exited {proc.returncode} (its output is above)")


def diffs(work: Path, names: list[str]) -> dict[str, str]:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    mutation_operators.install()
    with inside(work):
        return {name: get_diff_for_mutant(name) for name in names}


def prepare(root: Path, work: Path, tests: list[str]) -> dict[str, list[str]]:
    """The tree copied into ``work``, mutmut's configuration and the mutants written; module → mutant names."""
    work.mkdir(parents=True, exist_ok=True)
    sync_worktree(root, work)
    write_config(root, work, tests)
    fresh_stats(work)
    return generate(work)


STATS, STATS_SOURCE = Path("mutants/mutmut-stats.json"), Path("mutants/stats-source.sha256")


def fresh_stats(work: Path) -> None:
    """mutmut records once which test calls which function, then runs only the tests it has not met: a function
    added or moved since, or a test changed to call another, is missing from the record, and the mutants of such
    a function would count as untested. The record is dropped (mutmut then records every test again) whenever
    the library or the tests differ from the copy it was made on."""
    files = sorted(p for top in (LIBRARY, Path("tests")) for p in (work / top).rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(work).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    mark = work / STATS_SOURCE
    if not mark.is_file() or mark.read_text() != digest.hexdigest():
        (work / STATS).unlink(missing_ok=True)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(digest.hexdigest())


def tested(work: Path, names: list[str], jobs: int, trust_tests: bool, **run) -> tuple[dict, dict]:
    """mutmut's records after testing ``names``, and the run (command, seconds, workers, count, ``run``)."""
    start = time.monotonic()
    run_mutmut(work, names, jobs, trust_tests)
    seconds = round(time.monotonic() - start, 1)
    command = "python tools/mutation.py " + " ".join(sys.argv[1:])
    return report.read_meta(work), {
        "command": command,
        "seconds": seconds,
        "jobs": jobs,
        "mutants_run": len(names),
    } | run


def run(
    root: Path,
    targets: list[Path],
    tests: list[str],
    work: Path,
    sample: int,
    seed: int,
    jobs: int,
    trust_tests: bool = False,
) -> None:
    """Mutate ``targets`` in a copy of ``root``, test the drawn mutants, merge the results and render the page."""
    wanted = {str(t) for t in targets}
    mutants = {m: n for m, n in prepare(root, work, tests).items() if report.module_path(m) in wanted}
    check_equivalents(root, work, mutants)
    chosen = draw(mutants, sample, seed)
    print(f"mutation: {len(chosen)} of {sum(map(len, mutants.values()))} mutants in {len(targets)} modules")
    meta, run = tested(work, chosen, jobs, trust_tests, sample=sample, seed=seed)
    survivors = [n for n in chosen if report.status(meta, n) not in report.DETECTED]
    report.update(root, run, mutants, chosen, meta, diffs(work, survivors))
    report.write_page(root)


def retest_survivors(root: Path, targets: list[Path], tests: list[str], work: Path, jobs: int) -> None:
    """Run the committed survivors of ``targets`` again (after new tests) and update their records."""
    results = json.loads((root / report.RESULTS).read_text())
    wanted = {str(t) for t in targets}
    judged = report.equivalents(root)
    chosen = sorted(
        s["mutant"]
        for module, rec in results["modules"].items()
        if report.module_path(module) in wanted
        for s in rec["survivors"]
        if not report.is_equivalent(s, judged)
    )
    if not chosen:
        raise typer.BadParameter("no surviving mutant of these modules is on record", param_hint="MODULES")
    prepared = prepare(root, work, tests)
    check_equivalents(root, work, {m: n for m, n in prepared.items() if report.module_path(m) in wanted})
    made = {n for names in prepared.values() for n in names}
    gone = [n for n in chosen if n not in made]  # its function changed: mutmut no longer makes that mutant
    chosen = [n for n in chosen if n in made]
    print(f"mutation: {len(chosen)} surviving mutants tested again, {len(gone)} no longer made")
    meta, run = tested(work, chosen, jobs, True, sample=0, seed=0)
    still = [n for n in chosen if report.status(meta, n) not in report.DETECTED]
    report.retest(root, run, meta, diffs(work, still), chosen, gone)
    report.write_page(root)


def render(root: Path) -> None:
    """The committed results' ``stale`` marks brought up to date with the tree, then the page rendered."""
    path = root / report.RESULTS
    results = json.loads(path.read_text())
    report.mark_stale(root, results)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    report.write_page(root)


def check_equivalents(root: Path, work: Path, mutants: dict[str, list[str]]) -> dict[str, str]:
    """Print the entries of tools/mutation_equivalent.yaml whose mutant the code of the modules just
    mutated no longer makes as judged (remove or judge them again); name → why."""
    judged = report.equivalents(root)
    names = [n for n in judged if n in {m for ms in mutants.values() for m in ms}]
    stale = report.stale_equivalents(judged, diffs(work, names), set(mutants))
    for name, why in stale.items():
        print(f"mutation: stale entry in {report.EQUIVALENT}: {name}: {why}")
    return stale


@app.command()
def main(
    modules: list[str] = typer.Argument(None, help="packages (core), modules (lmclab.core.spec) or files"),
    since: str = typer.Option(
        "auto", help="with no MODULES: the library modules changed since this commit (auto: the merge base)"
    ),
    sample: int = typer.Option(
        0, min=0, help=f"mutants drawn per package (0: every mutant; {FIRST_DRAW} when no module changed)"
    ),
    seed: int = typer.Option(0, help="seed of the draw"),
    jobs: int = typer.Option(os.cpu_count() or 1, min=1, help="mutants tested at once"),
    tests: list[str] = typer.Option(TEST_SELECTION, help="pytest arguments choosing the tests mutmut may run"),
    work: Path = typer.Option(None, help="the copy mutmut works in, kept between runs [ROOT/.mutation/work]"),
    root: Path = typer.Option(ROOT, help="the project (a git checkout with src/lmclab and tests)"),
    trust_tests: bool = typer.Option(False, help="skip mutmut's unmutated run of the chosen mutants' tests"),
    survivors: bool = typer.Option(False, help="test the committed survivors of MODULES again (after new tests)"),
    render_only: bool = typer.Option(False, "--render", help="only rewrite docs/mutation.md from the results"),
    equivalents_only: bool = typer.Option(
        False, "--check-equivalents", help="only list the stale entries of tools/mutation_equivalent.yaml"
    ),
) -> None:
    root = root.resolve()
    if render_only:
        render(root)
        return
    if equivalents_only:
        work = (work or root / ".mutation/work").resolve()
        raise SystemExit(1 if check_equivalents(root, work, prepare(root, work, tests)) else 0)
    targets = resolve_targets(modules or [], root, since)
    if not targets and not survivors:  # nothing changed: a first draw over the whole library
        print(f"mutation: no library module changed since {since}; a first draw of every package")
        targets, sample = resolve_targets([str(LIBRARY)], root, since), sample or FIRST_DRAW
    if not targets:
        raise typer.BadParameter(f"no library module changed since {since}", param_hint="MODULES")
    work = (work or root / ".mutation/work").resolve()
    if survivors:
        retest_survivors(root, targets, tests, work, jobs)
    else:
        run(root, targets, tests, work, sample, seed, jobs, trust_tests)


if __name__ == "__main__":
    app()
