"""Every number about the default run in the README and on the docs' results page is what the
committed metrics give (tools/results.py regenerates both and must change nothing), and the README's
prose outside the generated block states no measured number of its own."""

from __future__ import annotations

import json
import re
import sys

import pytest
from dvc_repo import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import results  # noqa: E402

# decimals and percentages the README may state outside the generated block, each with its reason
SOURCES = (
    "params.yaml",
    "reports/detail/summary.json",
    "reports/detail/environment.json",
    "metrics/headline.json",
    "metrics/findings.json",
    "benchmarks/results/default_run.json",
)
NOT_MEASUREMENTS = {"3.11": "the Python version", "2402.04051": "the paper's arXiv id"}


def test_the_generated_parts_are_what_the_committed_metrics_give() -> None:
    for path, text in results.render(ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `python tools/results.py`"


def test_a_number_changed_by_hand_in_the_readme_table_is_caught(tmp_path) -> None:
    for rel in (*SOURCES, "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    headline = (tmp_path / "metrics/headline.json").read_text()
    acc = re.search(r'"acc": ([0-9.]+)', headline).group(1)
    (tmp_path / "metrics/headline.json").write_text(headline.replace(acc, str(float(acc) - 1.0), 1))
    readme = results.render(tmp_path)[tmp_path / "README.md"]
    assert readme != (ROOT / "README.md").read_text()
    assert f"{float(acc) - 1.0:.2f} %" in readme


def _prose(text: str) -> str:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(re.escape(results.START) + ".*?" + re.escape(results.END), "", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", text)  # link targets


def test_the_readme_prose_states_no_measurement_outside_the_generated_block() -> None:
    found = re.findall(r"\d+\.\d+|\d+(?:\.\d+)?\s?%", _prose((ROOT / "README.md").read_text()))
    typed = [n for n in found if n not in NOT_MEASUREMENTS]
    assert not typed, f"README.md: numbers typed outside the generated results block: {typed}"


@pytest.mark.parametrize("line", ["The merge keeps 91.5 % of the accuracy.", "B½ falls to -0.027."])
def test_a_typed_measurement_is_found(line: str) -> None:
    assert re.findall(r"\d+\.\d+|\d+(?:\.\d+)?\s?%", _prose(line))


def test_the_performance_page_is_what_the_committed_benchmarks_give(tmp_path) -> None:
    import performance_page

    assert performance_page.with_generated(performance_page.PAGE.read_text()) == performance_page.PAGE.read_text(), (
        "docs/performance.md is stale: run `python tools/performance_page.py`"
    )
    record = (ROOT / "benchmarks/results/contention.json").read_text()
    first = re.search(r'"lmclab": ([0-9.]+)', record).group(1)
    changed = tmp_path / "contention.json"
    changed.write_text(record.replace(first, str(float(first) + 1.0), 1))
    assert performance_page.generated(changed) != performance_page.generated()
    sizes = (ROOT / "benchmarks/results/wm_sizes.json").read_text()
    first = re.search(r'"lmclab": ([0-9.]+)', sizes).group(1)
    changed = tmp_path / "wm_sizes.json"
    changed.write_text(sizes.replace(first, str(float(first) + 1.0), 1))
    assert performance_page.generated(sizes=changed) != performance_page.generated()
    sinkhorn = (ROOT / "benchmarks/results/sinkhorn_time_to_target.json").read_text()
    first = re.search(r'"time_to_target_s": ([0-9.]+)', sinkhorn).group(1)
    changed = tmp_path / "sinkhorn.json"
    changed.write_text(sinkhorn.replace(first, str(float(first) + 1.0), 1))
    assert performance_page.generated(sinkhorn=changed) != performance_page.generated()
    soft_sizes = json.loads((ROOT / "benchmarks/results/sinkhorn_sizes.json").read_text())
    row = soft_sizes["rows"][-1]["searches"][-1]
    section = performance_page.sinkhorn_sizes(soft_sizes)
    assert f"| {row['method']} |" in section and f"{row['objective']:.2f}" in section
    row["objective"] += 1.0
    changed = tmp_path / "sinkhorn_sizes.json"
    changed.write_text(json.dumps(soft_sizes))
    assert performance_page.generated(soft_sizes=changed) != performance_page.generated()


def test_the_performance_page_shows_the_default_run_against_the_earlier_commit(tmp_path) -> None:
    import performance_page

    record = json.loads((ROOT / "benchmarks/results/default_run.json").read_text())
    versus: dict[str, list[dict]] = {}
    for row in record["rows"]:
        if row["mode"] == "versus":
            versus.setdefault(row["clone"], []).append(row)
    if not versus:  # a run without --versus: no section
        assert "against an earlier commit" not in performance_page.generated()
        return
    (head, runs), (earlier, _) = versus.items()
    section = performance_page.default_run(record)
    assert f"`{earlier[:7]}`" in section and f"`{head[:7]}` (this code)" in section
    assert " / ".join(f"{r['total_sec']:.1f}" for r in runs) in section
    runs[-1]["total_sec"] += 1.0
    changed = tmp_path / "default_run.json"
    changed.write_text(json.dumps(record))
    assert performance_page.generated(run=changed) != performance_page.generated()
    record["rows"] = [r for r in record["rows"] if r["mode"] != "versus"]
    changed.write_text(json.dumps(record))
    assert "against an earlier commit" not in performance_page.generated(run=changed)


def test_the_language_model_figures_of_the_performance_page_come_from_their_records(tmp_path) -> None:
    import performance_page

    for name, field, keyword in (("lm_epoch", '"seconds_per_epoch": ', "lm"), ("lm_run", '"total_sec": ', "lm_run")):
        record = (ROOT / f"benchmarks/results/{name}.json").read_text()
        value = re.search(re.escape(field) + r"([0-9.]+)", record).group(1)
        changed = tmp_path / f"{name}.json"
        changed.write_text(record.replace(field + value, field + str(float(value) + 7.0), 1))
        assert performance_page.generated(**{keyword: changed}) != performance_page.generated()
