"""tools/trace_coverage.py: a sample of its rows measured again, and the coverage table of docs/architectures.md
equal to the one its committed JSON generates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def coverage():
    """tools/trace_coverage.py (tools/ is on the tests' import path)."""
    import trace_coverage

    return trace_coverage


def test_the_docs_table_is_generated_from_the_committed_json(coverage, tmp_path):
    data = json.loads(coverage.OUT.read_text())
    assert [row["model"] for row in data["models"]] == list(coverage.MODELS)
    assert data["commit"] and data["command"].startswith("python tools/trace_coverage.py")
    page = tmp_path / "architectures.md"
    page.write_text(coverage.DOCS.read_text())
    coverage.write_docs(page, data)
    assert page.read_text() == coverage.DOCS.read_text(), "run `python tools/trace_coverage.py --docs`"


@pytest.mark.parametrize(
    "name,library",
    [
        ("torchvision:mobilenet_v3_small", "torchvision"),
        pytest.param("timm:mobilenetv3_small_100", "timm", marks=pytest.mark.extras),
    ],
)
def test_a_traced_row_is_invariant_and_recovered(coverage, name, library):
    pytest.importorskip(library)
    row = coverage.measure(name)
    assert row["result"] == "traced" and row["groups"] == 27
    assert row["invariance"] <= 1e-10 < 1e-3 < row["spread"] and row["wm_exact"]
    assert row["pinned_units"] == row["pinned_streams"] == row["pinned_share"] == 0  # every channel permuted
    assert row["kinds"] == {} and row["widest_kind"] == "permutation" and "kind_invariance" not in row
    assert "does not commute with rotations" in row["widest_reason"]  # BatchNorm and the activations
    assert coverage.row_line(row).startswith(f"| {name.split(':')[0]} `{name.split(':')[1]}` | 3×32×32 | traced |")


def test_the_left_unpermuted_column_says_units_streams_and_share(coverage):
    row = {"pinned_units": 0, "pinned_streams": 0, "pinned_share": 0.0}
    assert coverage.left_unpermuted(row) == "none"
    row = {"pinned_units": 96, "pinned_streams": 1, "pinned_share": 0.27}
    assert coverage.left_unpermuted(row) == "96 units, 1 stream (27% of the parameters)"
    row = {"pinned_units": 4, "pinned_streams": 0, "pinned_share": 0.004}
    assert coverage.left_unpermuted(row) == "4 units (0% of the parameters)"


@pytest.mark.extras
def test_a_refused_row_has_its_one_line_reason(coverage):
    pytest.importorskip("transformers")
    row = coverage.measure("transformers:BloomForCausalLM")
    assert row["result"] == "refused" and "\n" not in row["reason"]
    assert row["reason"].startswith("trace_spec: node 'select'") and "packed head by head" in row["reason"]
    assert "refused: node " in coverage.row_line(row)


def test_the_kinds_column_says_the_wider_groups_their_invariance_or_why_the_widest_is_none(coverage):
    row = {"kinds": {}, "widest_kind": "permutation", "widest_reason": "node 'gelu': GELU | a"}
    assert coverage.kinds_cell(row) == "none: node 'gelu': GELU \\| a"
    row = {"kinds": {"centred": 1}, "widest_kind": "centred", "kind_invariance": 3.2e-16}
    assert coverage.kinds_cell(row) == "1 centred; 3e-16"
    row = {"kinds": {"centred": 2, "orthogonal": 1}, "widest_kind": "permutation", "widest_reason": "node 'x': y"}
    row["kind_invariance"] = 1.1e-15
    assert coverage.kinds_cell(row) == "2 centred, 1 orthogonal, not the widest group (node 'x': y); 1e-15"


@pytest.mark.extras
def test_a_vit_row_has_a_centred_stream_that_keeps_the_outputs(coverage):
    pytest.importorskip("transformers")
    row = coverage.measure("transformers:ViTForImageClassification")
    heads = row["kinds"].get("orthogonal inside heads", 0)
    assert row["kinds"] == {"centred": 1, "orthogonal inside heads": heads} and heads >= 2  # q/k and v/o per layer
    assert row["widest_kind"] == "centred" and row["kind_invariance"] <= 1e-10
    cell = f"| 1 centred, {heads} orthogonal inside heads; {row['kind_invariance']:.0e} | {row['trace_s']:.2f} |"
    assert coverage.row_line(row).endswith(cell)
