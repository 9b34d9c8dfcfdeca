"""The paper's findings checked on a run (lmclab.studies.findings), the paper's rows in the report."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from lmclab.report.paper_numbers import TABLE1, paper_row
from lmclab.report.paper_tables import findings_section, marked, table2, table3_paper_lines
from lmclab.studies.findings import (
    by_pair,
    energy_concentrates,
    p_greater,
    paper_findings,
    roles,
    spectra_coincide,
    taylor_misses,
    three_models,
    wm_aligns,
    wm_small_l2,
)

PAIRS = ["seed0-seed1", "seed2-seed3", "seed4-seed5"]


def pairs_table(**per_method: dict[str, list[float]]) -> pd.DataFrame:
    """One row per pair and method with the given columns (the shape of data/tables/pairs.parquet)."""
    rows = []
    for method, columns in per_method.items():
        for i, pair in enumerate(PAIRS):
            rows.append({"pair": pair, "method": method, **{k: v[i] for k, v in columns.items()}})
    return pd.DataFrame(rows)


def method(b, red, r0=(0.05, 0.06, 0.07), r3=(0.08, 0.09, 0.1), taylor=(0.05, 0.06, 0.07)):
    return {
        "test_loss_barrier_mid": list(b),
        "l2_reduction_pct": list(red),
        "R_0": list(r0),
        "R_0.3": list(r3),
        "test_taylor_barrier_mid": list(taylor),
        "l2_before": [35.0] * 3,
        "l2_after": [32.0] * 3,
    }


NAIVE = method((0.9, 1.0, 0.8), (0, 0, 0), r0=(0.001, -0.002, 0.0), r3=(0.002, 0.001, 0.0), taylor=(0.3, 0.4, 0.3))
WM = method((-0.03, -0.02, -0.025), (8.3, 8.2, 8.4))
STE = method((-0.03, -0.035, -0.032), (5.8, 5.7, 5.9), r0=(0.03, 0.035, 0.04), r3=(0.05, 0.048, 0.052))
AM = method((-0.02, -0.015, -0.019), (5.9, 5.8, 6.0), r3=(0.05, 0.047, 0.049))


def test_roles_prefer_the_papers_sinkhorn_methods():
    assert roles(["identity", "wm", "wm_sinkhorn", "ste", "ste_sinkhorn"]) == {
        "naive": "identity",
        "WM": "wm_sinkhorn",
        "STE": "ste_sinkhorn",
    }
    assert roles(["identity", "wm", "am", "ste"]) == {"naive": "identity", "WM": "wm", "STE": "ste", "AM": "am"}


def test_wm_small_l2_needs_a_small_reduction_and_a_removed_barrier():
    r = {"WM": "wm_sinkhorn", "naive": "identity"}
    assert wm_small_l2(pairs_table(identity=NAIVE, wm_sinkhorn=WM), r, 0.05).holds
    far = method((-0.03, -0.02, -0.025), (30.0, 31.0, 29.0))  # 30 % is not "only ~6–20 %"
    assert not wm_small_l2(pairs_table(identity=NAIVE, wm_sinkhorn=far), r, 0.05).holds
    high = method((0.2, 0.1, 0.15), (8.3, 8.2, 8.4))  # a barrier of 15 % of the naive one remains
    assert not wm_small_l2(pairs_table(identity=NAIVE, wm_sinkhorn=high), r, 0.05).holds


def test_taylor_misses_is_a_paired_t_test_over_pairs():
    r = {"WM": "wm"}
    off = method((-0.03, -0.02, -0.025), (8, 8, 8), taylor=(0.07, 0.075, 0.08))  # Taylor consistently above
    found = taylor_misses(pairs_table(wm=off), r, 0.05)
    assert found.holds and found.numbers["diff"] == pytest.approx(0.1)
    close = method((-0.03, -0.02, -0.025), (8, 8, 8), taylor=(-0.02, -0.03, -0.024))  # Taylor on both sides
    assert not taylor_misses(pairs_table(wm=close), r, 0.05).holds


def test_a_column_no_pair_recorded_reads_as_nan_and_leaves_the_finding_untested():
    buffer = io.BytesIO()  # as data/tables/pairs.parquet stores it: a column of nulls comes back as None objects
    pairs_table(wm=WM).assign(test_taylor_barrier_mid=None).to_parquet(buffer)
    pairs = pd.read_parquet(io.BytesIO(buffer.getvalue()))
    assert np.isnan(by_pair(pairs, "wm", "test_taylor_barrier_mid")).all()
    assert taylor_misses(pairs, {"WM": "wm"}, 0.05).holds is None


def test_wm_aligns_needs_the_naive_r_near_zero_in_magnitude():
    """R ≈ 0 without permutation: a clearly negative naive R (anti-aligned) is not near zero."""
    r = {"WM": "wm", "naive": "identity"}
    assert wm_aligns(pairs_table(identity=NAIVE, wm=WM), r, 0.05).holds
    opposed = method((0.9, 1.0, 0.8), (0, 0, 0), r0=(-0.05, -0.06, -0.04), r3=(-0.08, -0.07, -0.09))
    found = wm_aligns(pairs_table(identity=opposed, wm=WM), r, 0.05)
    assert found.numbers["naive_R_0"] == pytest.approx(-0.05)  # the t-tests pass: only |naive R| decides
    assert found.holds is False


def test_p_greater_is_one_sided_and_paired():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.4, 2.6])
    assert p_greater(x, y) < 0.05 < p_greater(y, x)
    assert p_greater(x, x - 0.1) == 0.0 and p_greater(x, x + 0.1) == 1.0  # no spread: the sign decides
    assert p_greater(x, x) == 1.0  # equal in every pair: x is not greater


def spectrum_table(scale_seed1: float = 1.0, scale_output: float = 1.0) -> pd.DataFrame:
    s = np.linspace(5, 1, 8)
    rows = [
        {
            "seed": seed,
            "layer": layer,
            "output": layer == "out.weight",
            "index": i,
            "singular_value": v
            * (scale_seed1 if seed == 1 and layer != "out.weight" else 1.0)
            * (scale_output if seed == 1 and layer == "out.weight" else 1.0),
        }
        for seed in (0, 1, 2)
        for layer in ("layers.0.weight", "out.weight")
        for i, v in enumerate(s)
    ]
    return pd.DataFrame(rows)


def test_spectra_coincide_when_seeds_share_their_spectrum():
    assert spectra_coincide(spectrum_table()).holds
    assert spectra_coincide(spectrum_table(scale_output=1.5)).holds  # the output layer differs by a scale (Fig. 8)
    assert not spectra_coincide(spectrum_table(scale_seed1=1.5)).holds


def test_energy_concentrates_on_large_singular_values_except_the_first_layer():
    def table(rising: bool) -> pd.DataFrame:
        s = np.linspace(5, 0.5, 40)
        rows = []
        for seed in (0, 1):
            for layer in ("layers.0.weight", "layers.1.weight", "out.weight"):
                # the first layer's input is the image, not a hidden layer: it never counts
                energy = s[::-1] if layer == "layers.0.weight" or not rising else s
                rows += [
                    {"seed": seed, "layer": layer, "index": i, "singular_value": v, "energy": e}
                    for i, (v, e) in enumerate(zip(s, energy, strict=True))
                ]
        return pd.DataFrame(rows)

    assert energy_concentrates(table(rising=True), 0.05).holds
    assert not energy_concentrates(table(rising=False), 0.05).holds


def edges_table(wm_bc: list[float], ste_bc: list[float]) -> pd.DataFrame:
    rows = []
    for m, values in (("wm_sinkhorn", wm_bc), ("ste_sinkhorn", ste_bc)):
        for t, v in zip(("seed0-seed2-seed4", "seed1-seed3-seed5"), values, strict=True):
            rows.append(
                {"triple": t, "method": m, "edge": "b-c", "test_loss_barrier_max": v, "test_acc_barrier_max": 10 * v}
            )
    return pd.DataFrame(rows)


def test_three_models_needs_wm_below_ste_in_every_triple():
    r = {"WM": "wm_sinkhorn", "STE": "ste_sinkhorn"}
    assert three_models(edges_table([0.01, 0.02], [0.1, 0.2]), r).holds
    assert not three_models(edges_table([0.01, 0.3], [0.1, 0.2]), r).holds
    assert three_models(edges_table([0.01, 0.02], [0.1, 0.2]), r).note == ""  # no study given


def test_paper_findings_of_a_run_that_shows_them_and_one_that_cannot_test_all():
    pairs = pairs_table(identity=NAIVE, wm_sinkhorn=WM, ste_sinkhorn=STE, am=AM)
    energy = pd.DataFrame(
        [
            {"seed": 0, "layer": layer, "index": i, "singular_value": 5 - i, "energy": 5 - i}
            for layer in ("a", "b")
            for i in range(5)
        ]
    )
    found = paper_findings(
        pairs,
        spectrum_table(),
        energy,
        edges_table([0.01, 0.02], [0.1, 0.2]),
        ["identity", "am", "wm_sinkhorn", "ste_sinkhorn"],
        ["wm_sinkhorn", "ste_sinkhorn"],
    )
    verdicts = {f.key: f.holds for f in found}
    assert verdicts == {
        "wm_small_l2": True,
        "taylor_misses": True,
        "wm_aligns_singular_vectors": True,
        "spectra_coincide": True,
        "energy_concentrates": True,
        "am_like_wm": True,
        "ste_barrier_without_alignment": True,
        "three_models": True,
        "easier_when_wider_or_regularised": None,
    }
    fewer = paper_findings(
        pairs[pairs["method"] != "am"],
        spectrum_table(),
        energy,
        edges_table([0.01, 0.02], [0.1, 0.2]),
        ["identity", "wm_sinkhorn"],
        ["wm_sinkhorn"],
    )
    untested = {f.key for f in fewer if f.holds is None}
    assert untested == {
        "am_like_wm",
        "ste_barrier_without_alignment",
        "three_models",
        "easier_when_wider_or_regularised",
    }
    assert by_pair(pairs, "wm_sinkhorn", "l2_reduction_pct").tolist() == [8.3, 8.2, 8.4]
    one_pair = pairs[pairs["pair"] == PAIRS[0]]  # no test over pairs: those findings cannot be decided
    single = {
        f.key: f.holds
        for f in paper_findings(
            one_pair,
            spectrum_table(),
            energy,
            edges_table([0.01, 0.02], [0.1, 0.2]),
            ["identity", "am", "wm_sinkhorn", "ste_sinkhorn"],
            ["wm_sinkhorn", "ste_sinkhorn"],
        )
    }
    assert [k for k, v in single.items() if v is None] == [
        "taylor_misses",
        "wm_aligns_singular_vectors",
        "am_like_wm",
        "ste_barrier_without_alignment",
        "easier_when_wider_or_regularised",
    ]
    assert single["wm_small_l2"] is True


def test_report_marks_the_papers_methods_and_shows_its_rows():
    assert paper_row("mnist5k", "mlp") == paper_row("mnist", "mlp") == "MLP on MNIST"
    assert paper_row("imagenet", "resnet50") is None
    assert "the paper's WM" in marked("wm_sinkhorn") and "paper" not in marked("wm")
    pairs = pairs_table(identity=NAIVE, wm_sinkhorn=WM, ste_sinkhorn=STE)
    text = table2(pairs, ["identity", "wm_sinkhorn", "ste_sinkhorn"], "MLP on MNIST")
    assert "*paper, MLP on MNIST* (ste_sinkhorn) | -0.037 ± 0.008 |" in text
    assert "the paper's STE" in text.splitlines()[4]
    assert table3_paper_lines("MLP on MNIST", 9).count("|") == 2 * 10
    assert str(TABLE1["MLP on MNIST"][0]) == "-0.033 ± 0.006"
    section = findings_section(
        {
            "held": 1,
            "tested": 2,
            "findings": [
                {"claim": "c1", "criterion": "k1", "holds": True, "numbers": {"x": 1.0}},
                {"claim": "c2", "criterion": "k2", "holds": False, "numbers": {}, "note": "a study says n2"},
                {"claim": "c3", "criterion": "k3", "holds": None, "numbers": {}, "note": ""},
            ],
        }
    )
    assert section.rstrip().endswith("\n\n- **c2**: a study says n2")  # notes follow the table, empty ones left out
    assert "(1 of 2 tested hold)" in section
    assert "| c2 | — | k2 | **does not hold** |" in section and "| c3 | — | k3 | not tested |" in section


def test_a_run_of_the_naive_method_alone_names_what_each_untested_finding_needs():
    energy = pd.DataFrame(
        [
            {"seed": 0, "layer": layer, "index": i, "singular_value": 5 - i, "energy": 5 - i}
            for layer in ("a", "b")
            for i in range(5)
        ]
    )
    naive = pairs_table(identity=NAIVE)
    found = paper_findings(naive, spectrum_table(), energy, edges_table([0.01, 0.02], [0.1, 0.2]), ["identity"], [])
    assert [(f.key, f.claim, f.criterion) for f in found if f.holds is None] == [
        ("wm_small_l2", "WM reduces L2 by only ~6–20 %", "not tested by this run: needs WM+naive in permute.methods"),
        ("taylor_misses", "the Taylor estimate misses", "not tested by this run: needs WM in permute.methods"),
        ("wm_aligns_singular_vectors", "R > 0 with WM", "not tested by this run: needs WM+naive in permute.methods"),
        ("am_like_wm", "AM behaves like WM", "not tested by this run: needs am, a WM and identity in permute.methods"),
        (
            "ste_barrier_without_alignment",
            "STE: small barrier, low R",
            "not tested by this run: needs an STE, a WM and identity",
        ),
        (
            "three_models",
            "WM keeps b–c small, STE does not",
            "not tested by this run: needs a WM and an STE in three.methods",
        ),
        (
            "easier_when_wider_or_regularised",
            "wider models, stronger weight decay and a larger learning rate make alignment and LMC easier "
            "(Appendix H.4, H.5)",
            "not tested by this run: needs the width, weight-decay and learning-rate sweeps (docs: Analyses and "
            "studies); their reports, reports/sweeps/*/sweep.md, say which trends hold",
        ),
    ]
    assert [f.key for f in found if f.holds] == ["spectra_coincide", "energy_concentrates"]
