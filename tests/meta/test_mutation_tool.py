"""`make mutation` (tools/mutation.py): which modules it mutates, how it draws a sample, how a kill rate
is counted (equivalent mutants set apart only while their diff is the one judged), that the committed
page is what the committed results give, and one real mutmut run on a toy project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from dvc_repo import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import mutation  # noqa: E402
import mutation_report as report  # noqa: E402


def test_targets_named_as_package_module_or_file() -> None:
    core = mutation.resolve_targets(["core"], ROOT, "HEAD")
    assert Path("src/lmclab/core/spec.py") in core and all(str(p).startswith("src/lmclab/core/") for p in core)
    assert mutation.resolve_targets(["lmclab.core.spec"], ROOT, "HEAD") == [Path("src/lmclab/core/spec.py")]
    assert mutation.resolve_targets(["core.spec"], ROOT, "HEAD") == [Path("src/lmclab/core/spec.py")]
    assert mutation.resolve_targets(["src/lmclab/core/spec.py"], ROOT, "HEAD") == [Path("src/lmclab/core/spec.py")]
    with pytest.raises(typer.BadParameter, match="'nowhere' is no package, module or file"):
        mutation.resolve_targets(["nowhere"], ROOT, "HEAD")
    with pytest.raises(typer.BadParameter, match="is no package"):  # a file outside the library
        mutation.resolve_targets(["tools/mutation.py"], ROOT, "HEAD")


def _git_project(tmp: Path) -> Path:
    for rel, text in {"src/lmclab/a.py": "x = 1\n", "src/lmclab/b.py": "y = 2\n", "README.md": "r\n"}.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"]):
        subprocess.run(["git", *cmd], cwd=tmp, check=True)
    return tmp


def test_targets_default_to_the_modules_changed_since_a_commit(tmp_path: Path) -> None:
    root = _git_project(tmp_path)
    assert mutation.resolve_targets([], root, "HEAD") == []
    (root / "src/lmclab/b.py").write_text("y = 3\n")
    (root / "README.md").write_text("changed, not a module\n")
    assert mutation.resolve_targets([], root, "HEAD") == [Path("src/lmclab/b.py")]
    with pytest.raises(typer.BadParameter, match="git diff nosuchref"):
        mutation.resolve_targets([], root, "nosuchref")


def test_the_work_copy_follows_the_tree(tmp_path: Path) -> None:
    root = _git_project(tmp_path / "p")
    work = tmp_path / "w"
    mutation.sync_worktree(root, work)
    assert (work / "src/lmclab/a.py").read_text() == "x = 1\n"
    (root / "src/lmclab/a.py").write_text("x = 10\n")  # changed, and a new untracked file
    (root / "src/lmclab/c.py").write_text("z = 0\n")
    (root / "src/lmclab/b.py").unlink()
    (work / "mutants").mkdir()
    (work / "mutants/keep").write_text("mutmut's own")
    mutation.sync_worktree(root, work)
    assert (work / "src/lmclab/a.py").read_text() == "x = 10\n" and (work / "src/lmclab/c.py").is_file()
    assert not (work / "src/lmclab/b.py").exists() and (work / "mutants/keep").is_file()


def test_mutmut_s_record_of_which_test_calls_what_is_dropped_once_the_library_or_the_tests_change(tmp_path):
    work = _git_project(tmp_path / "w")
    (work / "tests").mkdir(exist_ok=True)
    (work / "tests/test_a.py").write_text("def test_a(): pass\n")
    mutation.fresh_stats(work)  # no record yet: the mark of this copy is written
    stats = work / mutation.STATS
    stats.write_text("{}")
    mutation.fresh_stats(work)
    assert stats.is_file()  # the same copy: kept
    for changed in ("src/lmclab/a.py", "tests/test_a.py"):
        (work / changed).write_text((work / changed).read_text() + "# changed\n")
        mutation.fresh_stats(work)
        assert not stats.exists()  # dropped: mutmut records every test again
        stats.write_text("{}")
        mutation.fresh_stats(work)
        assert stats.is_file()


def test_the_draw_is_per_package_and_seeded() -> None:
    mutants = {
        "lmclab.core.a": [f"lmclab.core.a.x_f__mutmut_{i}" for i in range(30)],
        "lmclab.core.b": [f"lmclab.core.b.x_g__mutmut_{i}" for i in range(30)],
        "lmclab.api.c": [f"lmclab.api.c.x_h__mutmut_{i}" for i in range(5)],
    }
    drawn = mutation.draw(mutants, 10, seed=0)
    assert sum(n.startswith("lmclab.core.") for n in drawn) == 10  # 10 of core's 60, not 10 per module
    assert sum(n.startswith("lmclab.api.") for n in drawn) == 5  # a package smaller than the sample: all
    assert drawn == mutation.draw(mutants, 10, seed=0) and drawn != mutation.draw(mutants, 10, seed=1)
    assert len(mutation.draw(mutants, 0, seed=0)) == 65


def _results(survivor_diff: str) -> dict:
    record = {
        "mutants": 40,
        "tested": 10,
        "killed": 6,
        "timeout": 1,
        "crashed": 0,
        "survived": 2,
        "no tests": 1,
        "suspicious": 0,
        "not run": 0,
        "wall_seconds_per_mutant": 9.0,
        "survivors": [
            {"mutant": "lmclab.core.a.x_f__mutmut_1", "status": "survived", "diff": survivor_diff},
            {"mutant": "lmclab.core.a.x_f__mutmut_2", "status": "survived", "diff": "-a\n+b"},
            {"mutant": "lmclab.core.a.x_f__mutmut_3", "status": "no tests", "diff": "-c\n+d"},
        ],
    }
    return {"modules": {"lmclab.core.a": record}, "runs": []}


def test_the_kill_rate_sets_apart_equivalent_mutants_only_while_their_diff_holds() -> None:
    judged = {"lmclab.core.a.x_f__mutmut_1": {"reason": "same value", "diff": "-x = 1\n+x = 1.0"}}
    (row,) = report.package_rows(_results("-x = 1\n+x = 1.0"), judged)
    assert row["equivalent"] == 1 and row["rate"] == pytest.approx(100 * 7 / 9)  # timeouts count as caught
    assert row["full_hours"] == pytest.approx(40 * 9.0 / 3600)  # every mutant of the module at 9 s each
    (row,) = report.package_rows(_results("-x = 1\n+x = 2"), judged)  # the function changed since
    assert row["equivalent"] == 0 and row["rate"] == pytest.approx(100 * 7 / 10)
    (row,) = report.package_rows(_results("-x = 1\n+x = 1.0"), {})
    assert row["rate"] == pytest.approx(70.0)


def test_mutmut_exit_codes_read_as_statuses() -> None:
    meta = {"m": {"exit_code_by_key": {"a": 1, "b": 0, "c": 33, "d": -24, "e": 36, "f": None, "g": 99}}}
    assert [report.status(meta, k) for k in "abcdefg"] == [
        "killed",
        "survived",
        "no tests",
        "timeout",
        "timeout",
        "not run",
        "suspicious",
    ]
    assert report.status(meta, "absent") == "not run"


def test_the_page_is_what_the_committed_results_give() -> None:
    assert (ROOT / report.PAGE).read_text() == report.render(ROOT), "run `python tools/mutation.py --render`"


def test_every_equivalent_mutant_has_a_reason_and_its_diff() -> None:
    for name, entry in report.equivalents(ROOT).items():
        assert name.startswith("lmclab.") and entry["reason"].strip() and entry["diff"].strip(), name


TOY = '''
def clip(x, lo=0, hi=10):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def exit_code(n):
    """Called only in a forked process (tools/mutation_forks.py credits the test with it)."""
    return n + 1
'''
TOY_TESTS = """
import os
from lmclab.toy import clip, exit_code

def test_in_a_fork():
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = exit_code(2)
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3

def test_inside_and_below():
    assert clip(5) == 5
    assert clip(-3) == 0
"""


@pytest.mark.slow
def test_a_real_run_on_a_toy_project_finds_the_untested_side(tmp_path: Path) -> None:
    """clip's upper side is never tested: its mutants survive, the lower side's are killed."""
    root = tmp_path / "toy"
    for rel, text in {
        "src/lmclab/__init__.py": "",
        "src/lmclab/toy.py": TOY,
        "tests/test_toy.py": TOY_TESTS,
        "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n',
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "docs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/mutation.py"),
            "lmclab.toy",
            "--root",
            str(root),
            "--tests",
            "tests",
            "--jobs",
            "1",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = json.loads((root / report.RESULTS).read_text())["modules"]["lmclab.toy"]
    assert rec["tested"] == rec["mutants"] > 0 and rec["killed"] > 0 and rec["survived"] > 0
    survived = "\n".join(s["diff"] for s in rec["survivors"])
    assert "-    if x > hi:" in survived and "hi=11" in survived  # the untested upper side
    assert "-        return lo" not in survived  # clip(-3) == 0 catches every change of the value returned below
    assert "exit_code" not in survived  # the fork's call is credited to its test, which kills every mutant
    assert "| `toy` |" in (root / report.PAGE).read_text()


def test_retesting_survivors_moves_only_the_ones_now_caught(tmp_path: Path) -> None:
    results = _results("-x = 1\n+x = 2")
    (tmp_path / report.RESULTS).parent.mkdir(parents=True)
    (tmp_path / report.RESULTS).write_text(json.dumps(results))
    names = [s["mutant"] for s in results["modules"]["lmclab.core.a"]["survivors"]]
    meta = {"lmclab.core.a": {"exit_code_by_key": {names[0]: 1, names[1]: 0, names[2]: 1}}}  # 2 of 3 now caught
    run = {"command": "c", "seconds": 1.0, "jobs": 1, "sample": 0, "seed": 0, "mutants_run": 3}
    report.retest(tmp_path, run, meta, {names[1]: "-a\n+b"}, names)
    rec = json.loads((tmp_path / report.RESULTS).read_text())["modules"]["lmclab.core.a"]
    assert (rec["killed"], rec["survived"], rec["no tests"], rec["tested"]) == (8, 1, 0, 10)
    assert [s["mutant"] for s in rec["survivors"]] == [names[1]]
    (last,) = json.loads((tmp_path / report.RESULTS).read_text())["runs"]
    assert last["killed_pct"] == {"core": 90.0}  # (8 killed + 1 timed out) / 10


def test_a_survivor_no_longer_made_counts_as_not_run_outside_the_rate(tmp_path: Path) -> None:
    """Its function changed (e.g. the line was dead and is gone): mutmut makes no mutant of that name."""
    results = _results("-x = 1\n+x = 2")
    (tmp_path / report.RESULTS).parent.mkdir(parents=True)
    (tmp_path / report.RESULTS).write_text(json.dumps(results))
    names = [s["mutant"] for s in results["modules"]["lmclab.core.a"]["survivors"]]
    meta = {"lmclab.core.a": {"exit_code_by_key": {names[0]: 0, names[1]: 1}}}  # one survives, one caught
    run = {"command": "c", "seconds": 1.0, "jobs": 1, "sample": 0, "seed": 0, "mutants_run": 2}
    report.retest(tmp_path, run, meta, {names[0]: "-x = 1\n+x = 2"}, names[:2], gone=[names[2]])
    rec = json.loads((tmp_path / report.RESULTS).read_text())["modules"]["lmclab.core.a"]
    assert (rec["killed"], rec["survived"], rec["no tests"], rec["not run"]) == (7, 1, 0, 1)
    assert [s["mutant"] for s in rec["survivors"]] == [names[0]]
    (last,) = json.loads((tmp_path / report.RESULTS).read_text())["runs"]
    assert last["killed_pct"] == {"core": round(100 * 8 / 9, 1)}  # (7 killed + 1 timed out) / (10 − 1 not run)


# ---- the default targets, the operators mutmut lacks, stale records and stale equivalents -------------------


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def test_targets_default_to_the_modules_changed_since_the_branch_left_main(tmp_path: Path) -> None:
    root = _git_project(tmp_path)
    _git(root, "branch", "-M", "main")
    _git(root, "checkout", "-qb", "topic")
    (root / "src/lmclab/a.py").write_text("x = 2\n")
    _git(root, "commit", "-qam", "two")
    (root / "src/lmclab/b.py").write_text("y = 3\n")  # uncommitted: counted too
    _git(root, "commit", "-qam", "three")
    (root / "src/lmclab/b.py").write_text("y = 4\n")
    assert mutation.merge_base(root) == _git(root, "rev-parse", "main")
    assert mutation.resolve_targets([], root, "auto") == [Path("src/lmclab/a.py"), Path("src/lmclab/b.py")]
    assert mutation.resolve_targets([], root, "HEAD~1") == [Path("src/lmclab/b.py")]  # HEAD~1 misses a.py


def test_with_nothing_changed_the_default_is_a_first_draw_of_every_package(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    root = _git_project(tmp_path)
    _git(root, "branch", "-M", "main")
    seen = {}
    monkeypatch.setattr(
        mutation,
        "run",
        lambda root, targets, tests, work, sample, seed, *a, **k: seen.update(
            targets=targets, sample=sample, seed=seed
        ),
    )
    result = CliRunner().invoke(mutation.app, ["--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "no library module changed since" in result.output
    assert seen == {
        "targets": [Path("src/lmclab/a.py"), Path("src/lmclab/b.py")],
        "sample": mutation.FIRST_DRAW,
        "seed": 0,
    }
    CliRunner().invoke(mutation.app, ["--root", str(root), "--sample", "3", "--seed", "2"])
    assert (seen["sample"], seen["seed"]) == (3, 2)


OPERATED = '''
def f(x, logging, spec, axis, step, size):
    """The operators' cases, one each."""
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    y = x[..., ::2]
    m = x.triu(1)
    whole = size == 3 and step == 1
    return all(e for e in spec if e != axis), level, y, m, whole
'''


def _made(code: str) -> dict[str, str]:
    from mutmut.mutation import file_mutation
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    made = file_mutation.mutate_file_contents("toy.py", code)
    return {n: get_diff_for_mutant(n, source=made.code, path="toy.py") for n in made.mutant_names}


def test_the_added_operators_plant_the_bugs_that_survived_and_keep_mutmuts_numbering(monkeypatch) -> None:
    import mutation_operators
    from mutmut.mutation import file_mutation

    monkeypatch.setattr(file_mutation, "create_mutations", file_mutation.create_mutations)  # undone after
    own = _made(OPERATED)
    mutation_operators.install()
    both = _made(OPERATED)
    assert list(both)[: len(own)] == list(own) and all(both[n] == own[n] for n in own)  # the same names
    added = [d for n, d in both.items() if n not in own]
    changes = sorted("\n".join(line for line in d.splitlines()[3:] if line[:1] in "+-") for d in added)
    assert changes == sorted(
        [
            "+    logging.set_verbosity_error()\n-    logging.set_verbosity_error()",  # saved after it is silenced
            "+    y = x[..., ::2]\n-    y = x[..., ::2]",
            "-    y = x[..., ::2]\n+    y = x[..., :]",
            "-    m = x.triu(1)\n+    m = x.tril(1)",
            "-    whole = size == 3 and step == 1\n+    whole = size == 3",
            "-    whole = size == 3 and step == 1\n+    whole = step == 1",
            "-    return all(e for e in spec if e != axis), level, y, m, whole\n"
            "+    return any(e for e in spec if e != axis), level, y, m, whole",
        ]
    ), changes


def test_an_equivalent_entry_is_stale_when_its_mutant_is_gone_or_has_another_diff() -> None:
    judged = {
        "lmclab.core.a.x_f__mutmut_1": {"reason": "r", "diff": "-x = 1\n+x = 1.0"},
        "lmclab.core.a.x_f__mutmut_2": {"reason": "r", "diff": "-y = 1\n+y = 1.0"},
        "lmclab.core.a.x_f__mutmut_3": {"reason": "r", "diff": "-z\n+w"},
        "lmclab.api.b.x_g__mutmut_1": {"reason": "r", "diff": "-a\n+b"},  # a module not mutated now: not judged
    }
    made = {"lmclab.core.a.x_f__mutmut_1": "-x = 1\n+x = 1.0\n", "lmclab.core.a.x_f__mutmut_2": "-y = 1\n+y = 2"}
    assert report.stale_equivalents(judged, made, {"lmclab.core.a"}) == {
        "lmclab.core.a.x_f__mutmut_2": "the mutant of that name now has another diff",
        "lmclab.core.a.x_f__mutmut_3": "no such mutant in the current code",
    }


def test_the_first_draw_rate_stays_as_drawn_while_retests_move_the_rate_after_them(tmp_path: Path) -> None:
    results = _results("-x = 1\n+x = 2")
    results["modules"]["lmclab.core.a"]["first_draw"] = {
        c: results["modules"]["lmclab.core.a"][c] for c in report.COUNTS
    }
    (tmp_path / report.RESULTS).parent.mkdir(parents=True)
    (tmp_path / report.RESULTS).write_text(json.dumps(results))
    names = [s["mutant"] for s in results["modules"]["lmclab.core.a"]["survivors"]]
    meta = {"lmclab.core.a": {"exit_code_by_key": {names[0]: 1, names[1]: 1, names[2]: 1}}}  # all caught now
    run = {"command": "c", "seconds": 1.0, "jobs": 1, "sample": 0, "seed": 0, "mutants_run": 3}
    report.retest(tmp_path, run, meta, {}, names)
    after = json.loads((tmp_path / report.RESULTS).read_text())
    (row,) = report.package_rows(after, {})
    assert row["first_rate"] == pytest.approx(70.0) and row["rate"] == pytest.approx(100.0)
    del after["modules"]["lmclab.core.a"]["first_draw"]  # a record from before first draws were kept
    (row,) = report.package_rows(after, {})
    assert row["first_rate"] != row["first_rate"] and row["rate"] == pytest.approx(100.0)  # nan: not known
    page_row = next(line for line in report.render(tmp_path).splitlines() if line.startswith("| `core`"))
    assert "| 70.0 | **100.0** |" in page_row
    (tmp_path / report.RESULTS).write_text(json.dumps(after))
    page_row = next(line for line in report.render(tmp_path).splitlines() if line.startswith("| `core`"))
    assert "| — | **100.0** |" in page_row


def test_a_record_is_stale_once_its_module_changed_since_its_sample(tmp_path: Path) -> None:
    root = _git_project(tmp_path)
    results = {"modules": {"lmclab.a": {"source": report.blob(root, "src/lmclab/a.py")}, "lmclab.b": {}}}
    results["modules"]["lmclab.b"]["commit"] = _git(root, "rev-parse", "--short", "HEAD") + "+changes"
    report.mark_stale(root, results)
    assert not results["modules"]["lmclab.a"]["stale"] and not results["modules"]["lmclab.b"]["stale"]
    (root / "src/lmclab/a.py").write_text("x = 5\n")
    (root / "src/lmclab/b.py").write_text("y = 5\n")
    report.mark_stale(root, results)
    assert results["modules"]["lmclab.a"]["stale"] and results["modules"]["lmclab.b"]["stale"]
