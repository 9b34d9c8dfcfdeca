"""Report tables read the saved Parquet layout and present it in a fixed order."""

from __future__ import annotations

import json
import math

import pandas as pd
from test_analysis_stages import ONE_TWO_THREE, three_pairs

from lmclab.report.document import alignment_table, barrier_table, endpoint_table, table1
from lmclab.report.language import family_section, is_language_model, perplexity_section
from lmclab.report.plots import mean_std
from lmclab.report.summary import THREE_KEYS, collect_pairs
from lmclab.report.summary import table1 as summary_table1
from lmclab.report.three_models import table3


def test_endpoint_table_lists_each_seed_once_in_seed_order_with_its_last_epoch() -> None:
    rows = [
        {"seed": s, "epoch": e, "train_loss": 1.0 / e, "test_loss": 2.0 / e, "test_acc": 0.5 + e / 100}
        for s in (2, 0, 3, 1)
        for e in (3, 1, 2)
    ]
    lines = endpoint_table(pd.DataFrame(rows)).splitlines()[2:]
    assert [line.split("|")[1].strip() for line in lines] == ["0", "1", "2", "3"]
    assert all(line.split("|")[2].strip() == "3" for line in lines)
    assert lines[0].split("|")[5].strip() == "53.00"


def test_report_tables_give_mean_and_sample_std_over_pairs_and_triples() -> None:
    """Each summarised column is [1, 2, 3] over three pairs: every cell reads 2 ± 1 (the
    population std would print 0.816)."""
    pairs = three_pairs()
    row = table1(pairs, ["wm"], t1=summary_table1(pairs, ["wm"])).splitlines()[2]
    assert row.split(" | ")[1:] == [
        "2.000 ± 1.000",
        "4.000 ± 2.000",
        "2.000 ± 1.000",
        "0.0742",
        "2.000 ± 1.000",
        "2.000 ± 1.000",
        "2.00 ± 1.00 |",
    ]
    cells = alignment_table(pairs, ["wm"]).splitlines()[2].split(" | ")[1:]
    assert cells == ["2.000 ± 1.000"] * 3 + ["2.000 ± 1.000 |"]
    cells = barrier_table(pairs, ["wm"]).splitlines()[2].split(" | ")[1:]
    assert cells == ["2.000 ± 1.000", "2.000 ± 1.000", "2.00 ± 1.00", "2.00 ± 1.00"] * 2 + ["2.00 ± 1.00 |"]
    edges = pd.DataFrame(
        {
            "triple": [f"t{i}" for i in range(3)] * 3,
            "method": "wm",
            "edge": ["a-b"] * 3 + ["a-c"] * 3 + ["b-c"] * 3,
            **{k: ONE_TWO_THREE * 3 for k in (*THREE_KEYS, "R_0.3")},
        }
    )
    cells = table3(edges).splitlines()[2].split(" | ")[1:]
    loss_acc, l2, r = ["2.000 ± 1.000", "2.00 ± 1.00"], "2.00 ± 1.00", "2.000 ± 1.000"
    assert cells == [loss_acc[0]] + loss_acc * 3 + [l2, r, r, r + " |"]  # loss b–c max and ½, acc b–c, …
    with_paper = table3(edges, "MLP on MNIST").splitlines()
    assert with_paper[-2].split(" | ")[:4] == ["| *paper, MLP on MNIST* (WM)", "—", "-0.031 ± 0.003", "0.475 ± 0.069"]
    assert all(line.count("|") == with_paper[0].count("|") for line in with_paper)


def test_figure_bands_are_the_sample_std_of_the_tables() -> None:
    frame = pd.DataFrame({"method": ["wm"] * 3 + ["ste"], "R_0": ONE_TWO_THREE + [5.0]})
    mean, std = mean_std(frame.groupby("method", sort=False)["R_0"])
    assert mean.to_dict() == {"wm": 2.0, "ste": 5.0} and std.to_dict() == {"wm": 1.0, "ste": 0.0}


def test_a_language_models_endpoints_show_perplexity_and_token_accuracy() -> None:
    history = pd.DataFrame([{"seed": 0, "epoch": 2, "train_loss": 1.0, "test_loss": math.log(4.0), "test_acc": 0.5}])
    head, _, row = endpoint_table(history, language=True).splitlines()
    assert head == "| seed | epochs | train loss | test loss | test token acc % | test ppl |"
    assert row.endswith("| 50.00 | 4.000 |")
    assert "ppl" not in endpoint_table(history)


def test_the_perplexity_section_lists_repaired_and_plain_barriers_per_method() -> None:
    """Pairs with [1, 2, 3] in every column read 2 ± 1; the plain barriers sit beside REPAIR's."""
    cols = ("test_ppl_barrier_mid", "test_ppl_barrier_max")
    pairs = pd.DataFrame(
        [{"method": "wm", **{c: v for c in cols}, **{f"norepair_{c}": 10 * v for c in cols}} for v in (1.0, 2.0, 3.0)]
    )
    assert is_language_model(pairs) and not is_language_model(pairs.drop(columns=["test_ppl_barrier_mid"]))
    lines = perplexity_section(pairs, ["wm"]).strip().split("\n")
    assert lines[-3:] == [
        "| method | ppl B½ REPAIR | ppl B max REPAIR | ppl B½ | ppl B max |",
        "|---|---|---|---|---|",
        "| WM (re-basin) | 2.000 ± 1.000 | 2.000 ± 1.000 | 20.000 ± 10.000 | 20.000 ± 10.000 |",
    ]
    plain = perplexity_section(pairs[list(cols) + ["method"]].assign(test_ppl_barrier_max=1.23456), ["wm"])
    assert plain.strip().splitlines()[-3:] == [
        "| method | ppl B½ | ppl B max |",
        "|---|---|---|",
        "| WM (re-basin) | 2.000 ± 1.000 | 1.235 ± 0.000 |",
    ]


def test_the_family_section_pools_each_family_per_method_at_gamma_03_or_the_largest() -> None:
    """WM: queries (3 + 1) / 8 = 0.5 in both pairs, the head keeps nothing (—); AM: queries 2 / 8 = 0.25 and
    0.75 (mean 0.5, std 0.354), head 1 / 2. A run measured at γ = 0 and 0.5 only is pooled at 0.5."""
    rows = []
    for pair, am_q in (("p", 2.0), ("q", 6.0)):
        for method, shares in (
            ("wm", {"blocks.0.attn.q.weight": (3.0, 4), "blocks.1.attn.q.weight": (1.0, 4), "head.weight": (0.0, 0)}),
            ("am", {"blocks.0.attn.q.weight": (am_q, 4), "blocks.1.attn.q.weight": (0.0, 4), "head.weight": (1.0, 2)}),
        ):
            for gamma in (0.0, 0.3):
                for layer, (n, k) in shares.items():
                    scale = 1.0 if gamma == 0.3 else 0.0  # the γ = 0 rows say R = 0: picking them shows
                    rows.append(
                        {
                            "pair": pair,
                            "method": method,
                            "layer": layer,
                            "gamma": gamma,
                            "numerator": n * scale,
                            "kept": k,
                        }
                    )
    frame = pd.DataFrame(rows)
    lines = family_section(frame, ["wm", "am"]).strip().split("\n")
    assert lines[0] == "### R_0.3 by layer family"
    assert lines[-4:] == [
        "| layers | WM (re-basin) | AM |",
        "|---|---|---|",
        "| `blocks.*.attn.q.weight` | 0.500 ± 0.000 | 0.500 ± 0.354 |",
        "| `head.weight` | — | 0.500 ± 0.000 |",
    ]
    other = frame.assign(gamma=frame["gamma"].map({0.0: 0.0, 0.3: 0.5}))
    assert family_section(other, ["wm", "am"]).strip().splitlines()[0] == "### R_0.5 by layer family"
    larger = frame.assign(gamma=frame["gamma"].map({0.0: 0.9, 0.3: 0.3}))  # 0.3 is measured, beside a larger γ
    assert family_section(larger, ["wm", "am"]).strip().splitlines()[-2:] == lines[-2:]
    one_pair = family_section(frame[frame["pair"] == "p"], ["am"]).strip().splitlines()
    assert one_pair[-2:] == ["| `blocks.*.attn.q.weight` | 0.250 ± 0.000 |", "| `head.weight` | 0.500 ± 0.000 |"]


def test_each_pair_and_method_is_read_from_its_own_folders(tmp_path) -> None:
    measure, perms = tmp_path / "measure", tmp_path / "perms"
    for seed_a, seed_b in ((0, 1), (3, 2)):
        for method in ("identity", "wm"):
            where = f"seed{seed_a}-seed{seed_b}/{method}"
            (measure / where).mkdir(parents=True)
            (perms / where).mkdir(parents=True)
            summary = {"seed_a": seed_a, "seed_b": seed_b, "method": method, "barrier": 10 * seed_a + seed_b}
            (measure / where / "summary.json").write_text(json.dumps(summary))
            (perms / where / "stats.json").write_text(json.dumps({"seconds": seed_b}))
            for name in ("curve", "taylor", "theorem42", "alignment", "cka"):
                pd.DataFrame({"table": [name], "where": [where]}).to_parquet(measure / where / f"{name}.parquet")
    records = collect_pairs(measure, perms, [(0, 1), (3, 2)], ["identity", "wm"])
    assert [(r["seed_a"], r["seed_b"], r["method"]) for r in records] == [
        (0, 1, "identity"),
        (0, 1, "wm"),
        (3, 2, "identity"),
        (3, 2, "wm"),
    ]
    last = records[-1]
    assert last["summary"] == {"barrier": 32} and last["search"] == {"seconds": 2}
    assert all(last[name] == [{"table": name, "where": "seed3-seed2/wm"}] for name in ("curve", "taylor", "cka"))
