"""The results of `tools/mutation.py`: mutmut's per-module records read back, merged into the committed
``reports/mutation/results.json`` and rendered as ``docs/mutation.md`` (never typed by hand;
tests/meta/test_mutation_tool.py checks that the page is what the results give).

A module's kill rate is (killed + timed out) / (mutants tested − equivalent): a mutant that makes a test
hang or crash is caught as surely as one that fails an assertion; one that no test calls is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ruamel.yaml import YAML

RESULTS = Path("reports/mutation/results.json")
EQUIVALENT = Path("tools/mutation_equivalent.yaml")
PAGE = Path("docs/mutation.md")
# mutmut's exit codes (mutmut.stats.status_by_exit_code) in the words of the report
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -9: "timeout",
    -11: "crashed",
    None: "not run",
}
DETECTED = {"killed", "timeout", "crashed"}
COUNTS = ("killed", "timeout", "crashed", "survived", "no tests", "suspicious", "not run")
GOAL = 90.0  # per cent of the non-equivalent mutants killed, per package


def read_meta(work: Path) -> dict[str, dict]:
    """mutmut's record of each mutated module under ``work/mutants``: module name → its ``.meta`` JSON."""
    out = {}
    for meta in sorted((work / "mutants/src").rglob("*.py.meta")):
        rel = meta.relative_to(work / "mutants/src").with_suffix("").with_suffix("")
        out[".".join(rel.parts)] = json.loads(meta.read_text())
    return out


def module_path(module: str) -> str:
    return "src/" + module.replace(".", "/") + ".py"


def status(meta: dict[str, dict], name: str) -> str:
    for record in meta.values():
        if name in record["exit_code_by_key"]:
            return STATUS.get(record["exit_code_by_key"][name], "suspicious")
    return "not run"


def equivalents(root: Path) -> dict[str, dict]:
    """Mutant name → {reason, diff}: the diff recorded when the mutant was judged equivalent. An entry whose
    mutant now has another diff (its function changed, the numbering moved) no longer counts."""
    path = root / EQUIVALENT
    entries = YAML(typ="safe").load(path.read_text()) if path.is_file() else None
    return {e["mutant"]: e for e in entries or []}


def is_equivalent(survivor: dict, equivalent: dict[str, dict]) -> bool:
    """Whether ``survivor`` was judged equivalent on the diff it has now."""
    judged = equivalent.get(survivor["mutant"])
    return judged is not None and judged["diff"].strip() == survivor["diff"].strip()


def machine() -> str:
    from lmclab.core.device import describe_machine

    m = describe_machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['os']}"


def commit(root: Path) -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "src", "tests"], cwd=root, capture_output=True, text=True)
    return sha.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def module_record(names: list[str], chosen: set[str], meta: dict, diffs: dict[str, str]) -> dict:
    """Counts over the module's tested mutants and each survivor's diff."""
    tested = [n for n in names if n in chosen]
    record: dict = {"mutants": len(names), "tested": len(tested)} | {c: 0 for c in COUNTS}
    for name in tested:
        record[status(meta, name)] += 1
    record["survivors"] = [{"mutant": n, "status": status(meta, n), "diff": diffs[n]} for n in tested if n in diffs]
    record["first_draw"] = {c: record[c] for c in COUNTS}  # kept as drawn: retests move the counts above only
    return record


def update(root: Path, run: dict, mutants: dict[str, list[str]], chosen: list[str], meta: dict, diffs: dict) -> None:
    """Merge this run's modules into the committed results (a module's record is replaced whole)."""
    path = root / RESULTS
    results = json.loads(path.read_text()) if path.is_file() else {"modules": {}, "runs": []}
    stamp = {"commit": commit(root), "date": time.strftime("%Y-%m-%d"), "machine": machine()}
    per_mutant = run["seconds"] / max(run["mutants_run"], 1)  # wall seconds, all workers together
    for module, names in mutants.items():
        results["modules"][module] = (
            module_record(names, set(chosen), meta, diffs)
            | stamp
            | {"wall_seconds_per_mutant": round(per_mutant, 2), "source": blob(root, module_path(module))}
        )
    mark_stale(root, results)
    this = {"modules": {m: results["modules"][m] for m in mutants}}
    rates = {r["package"]: round(r["rate"], 1) for r in package_rows(this, equivalents(root))}
    results["runs"].append(run | stamp | {"killed_pct": rates})
    _write(path, results)


def retest(
    root: Path, run: dict, meta: dict, diffs: dict[str, str], retested: list[str], gone: Sequence[str] = ()
) -> None:
    """Update the committed records after the survivors ``retested`` ran again (new tests since): each
    one's count moves to its new status; one that is ``gone`` (its function changed, so mutmut no longer
    makes it) counts as not run, outside the rate; the run records its packages' kill rates."""
    path = root / RESULTS
    results = json.loads(path.read_text())
    stamp = {"commit": commit(root), "date": time.strftime("%Y-%m-%d"), "machine": machine()}
    again, vanished, packages = set(retested), set(gone), set()
    for module, rec in results["modules"].items():
        if not (again | vanished) & {s["mutant"] for s in rec["survivors"]}:
            continue
        packages.add(module.split(".")[1])
        kept = []
        for s in rec["survivors"]:
            new = "not run" if s["mutant"] in vanished else s["status"]
            new = status(meta, s["mutant"]) if s["mutant"] in again else new
            if new != s["status"]:
                rec[s["status"]] -= 1
                rec[new] += 1
            if new not in DETECTED and s["mutant"] not in vanished:
                kept.append(s | {"status": new, "diff": diffs.get(s["mutant"], s["diff"])})
        rec["survivors"], rec["retested"] = kept, stamp["commit"]
    this = {"modules": {m: r for m, r in results["modules"].items() if m.split(".")[1] in packages}}
    rates = {r["package"]: round(r["rate"], 1) for r in package_rows(this, equivalents(root))}
    results["runs"].append(run | stamp | {"killed_pct": rates, "retest": True})
    mark_stale(root, results)
    _write(path, results)


def _write(path: Path, results: dict) -> None:
    """All of ``results`` or nothing: an interrupted write leaves the committed file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)


def blob(root: Path, path: str, rev: str | None = None) -> str | None:
    """git's object name of ``path``'s text: as it is now, or at commit ``rev`` (None when git has none)."""
    cmd = ["git", "hash-object", path] if rev is None else ["git", "rev-parse", f"{rev}:{path}"]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def mark_stale(root: Path, results: dict) -> None:
    """``stale`` on each module record whose source differs from the one its sample was drawn on (the
    ``source`` recorded with it; a record without one: the module at the record's commit)."""
    for module, rec in results["modules"].items():
        path = module_path(module)
        drawn = rec.get("source") or blob(root, path, rec.get("commit", "").removesuffix("+changes") or None)
        now = blob(root, path)
        rec["stale"] = drawn is None or now is None or drawn != now


def stale_equivalents(equivalent: dict[str, dict], made: dict[str, str], modules: set[str]) -> dict[str, str]:
    """The entries of ``tools/mutation_equivalent.yaml`` of ``modules`` whose mutant the current code no
    longer makes as judged: name → why (``made``: every current mutant's diff by name)."""
    out = {}
    for name, entry in sorted(equivalent.items()):
        if not any(name.startswith(m + ".") for m in modules):
            continue
        if name not in made:
            out[name] = "no such mutant in the current code"
        elif made[name].strip() != entry["diff"].strip():
            out[name] = "the mutant of that name now has another diff"
    return out


def _first_draw(rec: dict) -> dict | None:
    """The counts of the module's sample as drawn (before any retest); None when a retest overwrote them."""
    return rec.get("first_draw") or (None if "retested" in rec else {c: rec[c] for c in COUNTS})


def package_rows(results: dict, equivalent: dict[str, dict]) -> list[dict]:
    """One row per package: its modules' counts added up, equivalent mutants set apart, the kill rate now
    (``rate``: after the retests of survivors that new tests caught), the *first-draw* rate (``first_rate``:
    the sample as drawn on the code it was drawn on; nan when a retest overwrote a module's first counts),
    and the modules whose source changed since their sample (``stale``)."""
    rows: dict[str, dict] = {}
    for module, rec in sorted(results["modules"].items()):
        row = rows.setdefault(
            module.split(".")[1],
            {"mutants": 0, "tested": 0, "equivalent": 0, "full_hours": 0.0, "stale": [], "first": {}}
            | {c: 0 for c in COUNTS},
        )
        for key in ("mutants", "tested", *COUNTS):
            row[key] += rec[key]
        row["full_hours"] += rec["mutants"] * rec["wall_seconds_per_mutant"] / 3600
        row["equivalent"] += sum(is_equivalent(s, equivalent) for s in rec["survivors"])
        row["stale"] += [module] if rec.get("stale") else []
        first = _first_draw(rec)
        row["first"] = (
            None if first is None or row["first"] is None else {c: row["first"].get(c, 0) + first[c] for c in COUNTS}
        )
    for row in rows.values():
        row["rate"] = _rate(row, row["tested"], row["equivalent"])
        first = row.pop("first")
        row["first_rate"] = _rate(first, row["tested"], row["equivalent"]) if first is not None else float("nan")
    return [{"package": p} | r for p, r in sorted(rows.items())]


def _rate(counts: dict, tested: int, equivalent: int) -> float:
    """(killed + timed out + crashed) / (tested − equivalent − not run), in per cent."""
    judged = tested - equivalent - counts["not run"]
    return 100.0 * (counts["killed"] + counts["timeout"] + counts["crashed"]) / judged if judged else float("nan")


def _pct(rate: float) -> str:
    if rate != rate:  # nan: not known
        return "—"
    return f"**{rate:.1f}**" if rate >= GOAL else f"{rate:.1f}"


def render(root: Path) -> str:
    results = json.loads((root / RESULTS).read_text())
    equivalent = equivalents(root)
    head = (
        "| package | mutants | tested | killed | timed out | survived | no test | equivalent | first draw, killed % "
        "| after retests, killed % | every mutant, h | changed since the sample |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| `{r['package']}` | {r['mutants']} | {r['tested']} | {r['killed']} | {r['timeout'] + r['crashed']} "
        f"| {r['survived'] + r['suspicious']} | {r['no tests']} | {r['equivalent']} | {_pct(r['first_rate'])} "
        f"| {_pct(r['rate'])} | {r['full_hours']:.1f} | "
        + (", ".join(f"`{m.split('.', 2)[2]}`" for m in r["stale"]) or "none")
        + " |"
        for r in package_rows(results, equivalent)
    ]
    runs = [
        f"- `{r['command']}`: {r['mutants_run']} mutants in {r['seconds']:.0f} s with {r['jobs']} workers, "
        f"at {r['commit']} on {r['date']} ({r['machine']}){', a retest of survivors' if r.get('retest') else ''}"
        + "".join(f"; `{p}` {pct:.1f} % killed" for p, pct in sorted(r.get("killed_pct", {}).items()))
        for r in results["runs"]
    ]
    survivors = []
    for module, rec in sorted(results["modules"].items()):
        live = [s for s in rec["survivors"] if not is_equivalent(s, equivalent)]
        if live:
            survivors.append(f"\n### `{module}`\n")
            survivors += [f"`{s['mutant']}` ({s['status']}):\n\n```diff\n{s['diff'].strip()}\n```\n" for s in live]
    equiv = [f"- `{name}`: {e['reason']}" for name, e in sorted(equivalent.items())]
    text = (
        ROOT_PAGE_HEAD
        + head
        + "\n"
        + "\n".join(rows)
        + "\n\n## Runs\n\n"
        + "\n".join(runs)
        + "\n\n## Equivalent mutants\n\n"
        + ("\n".join(equiv) or "None listed.")
        + "\n\n## Surviving mutants\n"
        + ("\n".join(survivors) or "\nNone.\n")
    )
    return text.rstrip() + "\n"


def write_page(root: Path) -> None:
    (root / PAGE).write_text(render(root))


ROOT_PAGE_HEAD = """# Mutation testing

<!-- generated by `python tools/mutation.py --render` from reports/mutation/results.json; do not edit -->

How many plausible bugs does the suite catch? `make mutation` plants one small change at a time in the
library (an operator, a constant, a comparison, a dropped argument: [mutmut](https://mutmut.readthedocs.io)'s
mutants) and runs the tests that call the changed function; a mutant is *killed* when one of them fails.
[Testing and benchmarks](testing.md#mutation-testing) says how to run it and why mutmut.
The table is per package, over the mutants tested (every mutant, or a seeded sample where a package has
thousands); killed % = (killed + timed out) / (tested − equivalent), the goal is {goal:.0f} %. The
*first draw* is the sample as drawn on the code it was drawn on: the suite's rate on fresh mutants. *After
retests* counts the survivors that tests written since caught (`--survivors`), so it flatters the suite;
— where a retest overwrote a module's first counts. "Every mutant, h" is what testing every mutant of the
package would take at the sample's wall seconds per mutant; the last column names the modules whose
source changed since their sample (as of the last run or `--render`): their records are stale.

""".replace("{goal:.0f}", f"{GOAL:.0f}")
