"""The analyses composed (lmclab.analysis.compose), their tables (summary.py) and the spectra/measure stages."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from lmclab.analysis.alignment import alignment_r, layer_names, model_factors
from lmclab.analysis.compose import (
    Analysis,
    Endpoints,
    analyze_model,
    analyze_pair,
    endpoint_factors,
    measure_and_analyze,
    r_key,
)
from lmclab.analysis.energy import theorem42
from lmclab.analysis.families import family_barriers, parameter_families
from lmclab.analysis.pair import MeasureSettings, measure_method, prepare_pair
from lmclab.archs import build_model, get_arch, make_config
from lmclab.archs.checkpoint import Checkpoint, save_checkpoint
from lmclab.core.data import Split, load_split, prepare
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import lambda_grid
from lmclab.core.options import OptionError
from lmclab.core.spec import random_permutation
from lmclab.report.summary import (
    SUMMARY_KEYS,
    THREE_KEYS,
    metrics_summary,
    output_scales,
    table1,
    tables,
    three_summary,
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    prepare("mnist5k", out / "raw", out, max_train=120, max_test=60)
    return out


def tiny(seed):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=16)
    return config, dict(build_model("mlp", config, seed=seed).state_dict())


def test_analyze_pair_of_a_permuted_copy_is_perfectly_aligned(prepared):
    config, params_a = tiny(0)
    spec = get_arch("mlp").permutation_spec(config)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    params_b = {k: v.clone() for k, v in aligned_midpoint(spec, params_a, params_a, perm)[0].items()}  # θb = π(θa)
    inverse = {g: torch.argsort(p) for g, p in perm.items()}
    permuted_b, midpoint = aligned_midpoint(spec, params_a, params_b, inverse)  # aligning recovers θa exactly
    splits = {"test": load_split(prepared, "test")}
    pair = Endpoints(spec, build_model("mlp", config), params_a, params_b, splits)
    how = Analysis(lams=lambda_grid(5), gammas=[0.0, 0.3], input_shape=config.input_shape)
    summary, found = analyze_pair(pair, permuted_b, midpoint, how)
    taylor, bounds, layers = found["taylor"], found["theorem42"], found["alignment"]
    for gamma in (0.0, 0.3):
        assert summary[r_key(gamma)] == pytest.approx(1.0)
        assert summary[r_key(gamma, "a_mid")] == pytest.approx(1.0)
        assert abs(summary[r_key(gamma, "naive")]) < 0.5
    assert summary["test_taylor_barrier_mid"] == 0 and all(r["taylor"] == 0 for r in taylor)
    assert [r["layer"] for r in bounds] == ["layers.0.weight", "layers.1.weight", "out.weight"]
    assert all(r["bound"] < 1e-4 and r["measured"] == 0 for r in bounds)
    assert all(r["R"] == pytest.approx(1.0) for r in layers) and len(layers) == 2 * 3  # every layer of a copy


def test_shared_endpoint_factors_change_nothing(prepared):
    """The measure stage computes θa's and θb's SVDs once for every method: the analyses must be
    bit-identical to computing them per method (Theorem 4.2 shares π(θb)'s, not θb's)."""
    config, params_a = tiny(0)
    params_b = tiny(1)[1]
    spec = get_arch("mlp").permutation_spec(config)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(2))
    permuted_b, midpoint = aligned_midpoint(spec, params_a, params_b, perm)
    model, splits = build_model("mlp", config), {"test": load_split(prepared, "test")}
    how = Analysis(lams=lambda_grid(5), gammas=[0.0, 0.3], input_shape=config.input_shape)
    shared = [endpoint_factors(spec, model, p, input_shape=config.input_shape) for p in (params_a, params_b)]
    alone = analyze_pair(Endpoints(spec, model, params_a, params_b, splits), permuted_b, midpoint, how)
    reused = analyze_pair(Endpoints(spec, model, params_a, params_b, splits, *shared), permuted_b, midpoint, how)
    assert {k: v for k, v in reused[0].items() if k != "analysis_seconds"} == {
        k: v for k, v in alone[0].items() if k != "analysis_seconds"
    }
    assert reused[1] == alone[1]
    # and both equal the primitives computed from scratch on the right models
    layers = layer_names(spec, params_a)
    fa, fb, fp, fm = (model_factors(p, layers) for p in (params_a, params_b, permuted_b, midpoint))
    for gamma in (0.0, 0.3):
        for which, (x, y) in {"": (fa, fp), "naive": (fa, fb), "a_mid": (fa, fm), "b_mid": (fp, fm)}.items():
            assert reused[0][r_key(gamma, which)] == alignment_r(x, y, gamma)
    assert reused[1]["theorem42"] == theorem42(model, params_a, permuted_b, splits["test"], layers)


def test_the_train_curves_read_a_fixed_subset_and_repair_its_own(prepared):
    """``train_samples``: the endpoints' train split is a fixed random subset (the same one each time, the
    test split whole); REPAIR's statistics still come from ``repair_samples`` of the whole training split."""
    config, params_a = tiny(0)
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    ckpts = (Checkpoint("mlp", config, 0, params_a), Checkpoint("mlp", config, 1, tiny(1)[1]))
    settings = MeasureSettings(num_lambdas=3, repair="repair", repair_samples=100, train_samples=30)
    pair, again = (prepare_pair(*ckpts, splits, settings) for _ in range(2))
    train = pair.endpoints.splits["train"]
    assert len(train) == 30 and torch.equal(train.x, again.endpoints.splits["train"].x)
    rows = [next(i for i in range(len(splits["train"])) if torch.equal(splits["train"].x[i], x)) for x in train.x]
    assert len(set(rows)) == 30 and rows != list(range(30))  # drawn from the whole split, not its head
    assert torch.equal(pair.endpoints.splits["test"].x, splits["test"].x)
    assert len(pair.repair_at.data) == 100
    whole = prepare_pair(*ckpts, splits, MeasureSettings(num_lambdas=3, train_samples=None))
    assert whole.endpoints.splits["train"] is splits["train"]


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"num_lambdas": 1}, "num_lambdas must be at least 2 (both endpoints), got 1"),
        ({"conv_spectrum": "exact"}, "conv_spectrum must be one of ['reshape', 'fft'], got 'exact'"),
        (
            {"repair": "repair", "repair_samples": 0},
            "repair_samples must be a positive number of images or null, got 0",
        ),
        ({"train_samples": 0}, "train_samples must be a positive number of images or null, got 0"),
    ],
)
def test_prepare_pair_errors_name_the_settings_fields(prepared, changes, line):
    config, params = tiny(0)
    ckpt = Checkpoint("mlp", config, 0, params)
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    with pytest.raises(OptionError) as err:
        prepare_pair(ckpt, ckpt, splits, MeasureSettings(**changes))
    assert str(err.value) == line and err.value.keyed(lambda n: f"measure.{n}") == f"measure.{line}"


def test_measure_method_is_measure_and_analyze_with_the_endpoints_svds_shared(prepared):
    (config, params_a), params_b = tiny(0), tiny(1)[1]
    spec = get_arch("mlp").permutation_spec(config)
    permuted_b, midpoint = aligned_midpoint(
        spec, params_a, params_b, random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3))
    )
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    settings = MeasureSettings(num_lambdas=3)
    pair = prepare_pair(
        Checkpoint("mlp", config, 0, params_a), Checkpoint("mlp", config, 1, params_b), splits, settings
    )
    tables, summary = measure_method(
        pair, Checkpoint("mlp", config, 1, permuted_b), Checkpoint("mlp", config, 1, midpoint)
    )
    how = Analysis(lams=lambda_grid(3), gammas=[0.0, 0.3], input_shape=config.input_shape, taylor_splits=["test"])
    model = build_model("mlp", config)
    alone, found = measure_and_analyze(Endpoints(spec, model, params_a, params_b, splits), permuted_b, midpoint, how)
    assert sorted(tables) == ["alignment", "cka", "curve", "taylor", "theorem42"]
    assert all(tables[t] == found[t] for t in ("curve", "taylor", "theorem42", "alignment"))
    timing = {"analysis_seconds"}
    assert {k: v for k, v in summary.items() if k not in timing} == {k: v for k, v in alone.items() if k not in timing}


def test_a_calibrated_temperature_recovers_the_scale_the_labels_were_drawn_at() -> None:
    from lmclab.analysis.temperature import calibrated_temperature

    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(20000, 5, generator=g)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)  # labels drawn from softmax(z)
    for scale in (0.25, 3.0):  # logits scale · z: the likeliest temperature is the scale
        assert calibrated_temperature(scale * z, y) == pytest.approx(scale, rel=0.03)


def test_the_calibrated_barrier_of_one_function_at_three_scales_is_zero_and_the_plain_one_is_not(prepared):
    """θb = 3θa (a bias-free linear classifier) predicts as θa with logits 3 times larger and θ(½) = 2θa twice:
    each model's temperature absorbs its scale (T_b = 3 T_a, T_mid = 2 T_a), so the calibrated losses are equal
    and the barrier is 0, while the plain losses differ; the caller's train mode is kept."""
    from lmclab.analysis.temperature import calibrated_barrier, calibrated_loss

    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10, bias=False)).train()
    train = splits["train"]
    means = torch.stack([train.x[train.y == c].flatten(1).mean(0) for c in range(10)])
    a = {"1.weight": means / means.norm()}  # class templates: informative logits of a moderate scale
    b = {"1.weight": 3 * a["1.weight"]}
    found = calibrated_barrier(model, a, b, train, splits["test"])
    assert 0.01 < found["temperature_a"] < 100
    assert found["temperature_b"] == pytest.approx(3 * found["temperature_a"], rel=1e-3)
    assert found["temperature_mid"] == pytest.approx(2 * found["temperature_a"], rel=1e-3)
    assert found["test_loss_barrier_mid_calibrated"] == pytest.approx(0.0, abs=1e-4)  # float32 logits
    plain = [evaluate(model, p, splits["test"]).loss for p in (a, b)]
    assert abs(plain[0] - plain[1]) > 0.1 and model.training  # uncalibrated, the scales differ; mode kept
    mid = calibrated_loss(model, {"1.weight": 2 * a["1.weight"]}, splits["train"], splits["test"])
    assert mid[0] == pytest.approx(found["temperature_mid"], rel=1e-6)


def test_measure_method_adds_the_calibrated_barrier_when_asked(prepared):
    (config, params_a), params_b = tiny(0), tiny(1)[1]
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    ckpts = (Checkpoint("mlp", config, 0, params_a), Checkpoint("mlp", config, 1, params_b))
    midpoint = {k: (params_a[k] + params_b[k]) / 2 for k in params_a}
    summaries = [
        measure_method(
            prepare_pair(*ckpts, splits, MeasureSettings(num_lambdas=3, calibrate_temperature=t)),
            ckpts[1],
            Checkpoint("mlp", config, None, midpoint),
        )[1]
        for t in (False, True)
    ]
    assert "test_loss_barrier_mid_calibrated" not in summaries[0]
    calibrated = summaries[1]["test_loss_barrier_mid_calibrated"]
    assert math.isfinite(calibrated) and calibrated != summaries[1]["test_loss_barrier_mid"]
    assert all(summaries[1][f"temperature_{k}"] > 0 for k in ("a", "b", "mid"))


@pytest.mark.parametrize("arch", ["resnet20", "mlp"])
def test_measure_method_repairs_every_lambda_of_a_batchnorm_net_and_of_one_without(prepared, arch):
    """BatchNorm statistics re-estimated (ResNet20) or REPAIR (the MLP, ``repair: true``) at every λ: the curve
    holds repaired and unrepaired rows and the summary says which repair it is; the repaired midpoint differs
    from the unrepaired one on a pair that is not a permuted copy."""
    options = {"width_multiplier": 1} if arch == "resnet20" else {"hidden": 2, "width": 16}
    config = make_config(arch, input_shape=(1, 28, 28), num_classes=10, **options)
    params_a, params_b = (dict(build_model(arch, config, seed=s).state_dict()) for s in (0, 1))
    spec = get_arch(arch).permutation_spec(config)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(4))
    permuted_b, midpoint = aligned_midpoint(spec, params_a, params_b, perm)
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    settings = MeasureSettings(num_lambdas=3, repair="auto", repair_samples=64)  # bn for resnet20, REPAIR for mlp
    pair = prepare_pair(Checkpoint(arch, config, 0, params_a), Checkpoint(arch, config, 1, params_b), splits, settings)
    aligned, merged = (Checkpoint(arch, config, 1, p) for p in (permuted_b, midpoint))
    tables, summary = measure_method(pair, aligned, merged)
    assert (summary["bn_repair"], summary["ln_repair"]) == (arch == "resnet20", arch == "mlp")
    mid = {r["repair"]: r["loss"] for r in tables["curve"] if r["lam"] == 0.5 and r["split"] == "test"}
    assert set(mid) == {False, True} and mid[True] != mid[False]
    assert summary["test_loss_barrier_mid"] != summary["norepair_test_loss_barrier_mid"]


def test_analyze_model_rows(prepared):
    config, params = tiny(3)
    spec = get_arch("mlp").permutation_spec(config)
    spectrum, energy = analyze_model(
        spec, build_model("mlp", config), params, load_split(prepared, "test"), input_shape=config.input_shape
    )
    frame = pd.DataFrame(spectrum)
    assert frame.groupby("layer").size().to_dict() == {"layers.0.weight": 16, "layers.1.weight": 16, "out.weight": 10}
    assert frame[frame["output"]]["layer"].unique().tolist() == ["out.weight"]
    assert len(energy) == len(spectrum) and all(r["energy"] >= 0 for r in energy)


def test_table1_runs_a_paired_t_test_and_output_scales_fit_alpha():
    pairs = pd.DataFrame(
        {
            "method": ["wm"] * 3,
            "test_loss_barrier_mid": [0.1, 0.2, 0.15],
            "test_taylor_barrier_mid": [1.0, 1.3, 1.1],
            "l2_before": [10.0] * 3,
            "l2_after": [8.0] * 3,
            "l2_reduction_pct": [20.0] * 3,
        }
    )
    row = table1(pairs, ["wm"]).iloc[0]
    assert row["diff_mean"] == pytest.approx((0.9 + 1.1 + 0.95) / 3)
    assert row["p_value"] < 0.05 and row["significant"]
    spectrum = pd.DataFrame(
        {
            "seed": [0, 0, 1, 1],
            "layer": "out.weight",
            "output": True,
            "index": [0, 1] * 2,
            "singular_value": [4.0, 2.0, 2.0, 1.0],
        }
    )
    scales = output_scales(spectrum)
    assert scales.groupby("seed")["alpha"].first().tolist() == pytest.approx([1.0, 2.0])
    assert scales["adjusted"].tolist() == pytest.approx([4.0, 2.0, 4.0, 2.0])


def test_taylor_table_holds_the_real_gap_read_off_the_curve():
    """Loss 1 at θb (λ = 0), 3 at θa (λ = 1), 2 at λ = ¼: real gap 2 − (¼·3 + ¾·1) = 0.5."""
    curve = [{"split": "test", "lam": lam, "loss": loss} for lam, loss in ((0.0, 1.0), (0.25, 2.0), (1.0, 3.0))]
    record = {
        "seed_a": 0,
        "seed_b": 1,
        "method": "wm",
        "curve": curve,
        "summary": {},
        "search": {},
        "taylor": [{"split": "test", "lam": 0.25, "taylor": 0.4}, {"split": "test", "lam": 0.5, "taylor": 0.6}],
        "theorem42": [],
    }
    gaps = tables([record])["taylor"]["barrier"].tolist()
    assert gaps[0] == pytest.approx(0.5) and math.isnan(gaps[1])  # λ = ½ was not measured
    assert "alignment" not in tables([record])  # a record without per-layer R rows adds no table
    share = {"layer": "fc.weight", "gamma": 0.3, "numerator": 2.0, "kept": 4, "R": 0.5}
    layers = tables([{**record, "alignment": [share]}])["alignment"]
    assert layers.to_dict("records") == [{"pair": "seed0-seed1", "seed_a": 0, "seed_b": 1, "method": "wm", **share}]


@pytest.mark.slow
def test_spectra_and_measure_stages_write_their_outputs(prepared, tmp_path):
    import measure
    import spectra

    config, params_a = tiny(0)
    _, params_b = tiny(1)
    spec = get_arch("mlp").permutation_spec(config)
    for seed, params in ((0, params_a), (1, params_b)):
        save_checkpoint(tmp_path / f"seed{seed}.pt", Checkpoint("mlp", config, seed, params))
    permuted_b, midpoint = aligned_midpoint(
        spec, params_a, params_b, random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(0))
    )
    save_checkpoint(tmp_path / "merged" / "wm" / "permuted_b.pt", Checkpoint("mlp", config, 1, permuted_b))
    save_checkpoint(tmp_path / "merged" / "wm" / "midpoint.pt", Checkpoint("mlp", config, None, midpoint))
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "device": "cpu",
                "threads": 1,
                "train": {"seeds": [0, 1]},
                "permute": {"methods": ["wm"], "symmetry": "permutation"},
                "measure": {
                    "taylor_splits": ["train", "test"],
                    "num_lambdas": 3,
                    "gammas": [0, 0.5],
                    "conv_spectrum": "reshape",
                    "repair": "none",
                    "repair_samples": 500,
                    "train_samples": None,
                    "nproc_per_node": 1,
                    "calibrate_temperature": False,
                    "circuits": False,
                    "family_barriers": True,
                },
            }
        )
    )
    runner = CliRunner()
    res = runner.invoke(
        spectra.app,
        [
            "--models",
            str(tmp_path),
            "--data",
            str(prepared),
            "--out",
            str(tmp_path / "spectra"),
            "--params",
            str(params),
        ],
    )
    assert res.exit_code == 0, res.output
    assert set(pd.read_parquet(tmp_path / "spectra" / "seed1" / "energy.parquet")["seed"]) == {1}
    args = [
        "--seed-a",
        "0",
        "--seed-b",
        "1",
        "--model-a",
        str(tmp_path / "seed0.pt"),
        "--model-b",
        str(tmp_path / "seed1.pt"),
        "--merged",
        str(tmp_path / "merged"),
        "--data",
        str(prepared),
        "--out",
        str(tmp_path / "analysis"),
        "--params",
        str(params),
    ]
    res = runner.invoke(measure.app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "analysis" / "wm" / "summary.json").read_text())
    assert {"R_0", "R_0.5", "R_0.5_naive", "train_taylor_barrier_mid", "test_taylor_barrier_max"} <= set(summary)
    assert {"cka_a_b", "cka_a_pi_b", "cka_a_mid", "cka_pi_b_mid"} <= set(summary)
    assert len(pd.read_parquet(tmp_path / "analysis" / "wm" / "cka.parquet")) == 4 * config.hidden
    assert len(pd.read_parquet(tmp_path / "analysis" / "wm" / "taylor.parquet")) == 2 * 3
    assert {"test_loss_barrier_mid", "l2_reduction_pct"} <= set(summary)
    assert len(pd.read_parquet(tmp_path / "analysis" / "wm" / "curve.parquet")) == 2 * 3
    families = pd.read_parquet(tmp_path / "analysis" / "wm" / "families.parquet")
    assert families["family"].tolist() == ["(all)", "layers.0", "layers.1", "out"]
    assert families["alone"][0] == pytest.approx(summary["test_loss_barrier_mid"], abs=1e-6)
    params.write_text(params.read_text().replace("reshape", "exact"))
    res = runner.invoke(measure.app, args)
    assert res.exit_code == 1 and "measure.conv_spectrum" in res.output


def test_width_tables_combine_runs_by_width():
    from lmclab.studies.width import alignment_markdown, width_tables

    def run(width, r):
        idx = list(range(width))
        spectrum = pd.DataFrame(
            {"seed": 0, "layer": "l0", "output": False, "index": idx, "singular_value": [float(width - i) for i in idx]}
        )
        energy = spectrum.drop(columns="output").assign(energy=1.0)
        pairs = pd.DataFrame(
            {
                "method": ["identity", "wm", "wm"],
                "test_loss_barrier_mid": [1.0, 0.2, 0.4],
                "R_0": [0.0, r, r + 0.1],
                "R_0_naive": [0.0, 0.0, 0.0],
            }
        )
        return {"spectrum": spectrum, "energy": energy, "pairs": pairs}

    out = width_tables({8: run(8, 0.1), 4: run(4, 0.3)})
    assert out["spectrum"].groupby("width")["normalised_value"].max().tolist() == [1.0, 1.0]
    assert out["spectrum"].groupby("width")["relative_index"].max().tolist() == [1.0, 1.0]
    assert out["energy"].groupby("width")["relative_index"].agg(["min", "max"]).values.tolist() == [[0, 1], [0, 1]]
    wm = out["alignment"][out["alignment"]["method"] == "wm"]
    assert wm["width"].tolist() == [4, 8] and wm["R_0_mean"].tolist() == pytest.approx([0.35, 0.15])
    assert "R_0_naive_mean" not in out["alignment"]  # only R_γ of (θa, π(θb)) per method
    assert "| 8 | wm | 0.300 | 0.150 ± 0.071 |" in alignment_markdown(out["alignment"])


# values [1, 2, 3] over three pairs (or triples): sample std (ddof = 1) 1.0, population std 0.816
ONE_TWO_THREE = [1.0, 2.0, 3.0]


def three_pairs() -> pd.DataFrame:
    """Three pairs of one method; every summarised column is [1, 2, 3], the Taylor estimate [2, 4, 6]."""
    columns = {k: ONE_TWO_THREE for k in (*SUMMARY_KEYS, "R_0.3", "R_0.3_naive", "R_0.3_a_mid", "R_0.3_b_mid")}
    return pd.DataFrame(
        {
            "pair": ["seed0-seed1", "seed0-seed2", "seed1-seed2"],
            "method": "wm",
            **columns,
            "test_taylor_barrier_mid": [2.0, 4.0, 6.0],
        }
    )


def test_every_summary_over_pairs_reports_the_sample_std():
    from lmclab.studies.width import width_tables

    summary = metrics_summary(three_pairs(), ["wm"])["wm"]
    assert summary["n_pairs"] == 3
    assert {k: v["std"] for k, v in summary.items() if k != "n_pairs"} == {
        **dict.fromkeys((*SUMMARY_KEYS, "R_0.3", "R_0.3_naive", "R_0.3_a_mid", "R_0.3_b_mid"), 1.0),
        "test_taylor_barrier_mid": 2.0,
    }
    row = table1(three_pairs(), ["wm"]).iloc[0]
    assert {k: row[f"{k}_std"] for k in ("barrier", "taylor", "diff", "l2_before", "l2_after", "reduction_pct")} == {
        "barrier": 1.0,
        "taylor": 2.0,
        "diff": 1.0,
        "l2_before": 1.0,
        "l2_after": 1.0,
        "reduction_pct": 1.0,
    }
    edges = pd.DataFrame(
        {
            "triple": ["t0", "t1", "t2"],
            "method": "wm",
            "edge": "b-c",
            **{k: ONE_TWO_THREE for k in (*THREE_KEYS, "R_0.3")},
        }
    )
    assert three_summary(edges, ["wm"])["wm"]["b-c"] == dict.fromkeys((*THREE_KEYS, "R_0.3"), {"mean": 2.0, "std": 1.0})
    runs = {
        8: {
            "spectrum": pd.DataFrame({"seed": [0], "layer": "l0", "index": [0], "singular_value": [1.0]}),
            "energy": pd.DataFrame({"seed": [0], "layer": "l0", "index": [0], "energy": [1.0]}),
            "pairs": three_pairs(),
        }
    }
    alignment = width_tables(runs, methods=["wm"])["alignment"].iloc[0]
    assert (alignment["R_0.3_mean"], alignment["R_0.3_std"]) == (2.0, 1.0)


def moved(params, families, seed):
    """``params`` with the entries of ``families`` (module names) redrawn from another seed's model."""
    other = tiny(seed)[1]
    return {k: other[k] if k.rsplit(".", 1)[0] in families else v for k, v in params.items()}


def test_a_family_that_moves_alone_carries_the_whole_barrier_and_the_rest_none(prepared):
    (config, a), test = tiny(0), load_split(prepared, "test")
    b = moved(a, {"layers.1"}, seed=1)
    rows = {r["family"]: r for r in family_barriers(build_model("mlp", config), a, b, test, lam=0.3)}
    assert list(rows) == ["(all)", "layers.1"]  # the others are θa's in θb: they move nowhere
    model = build_model("mlp", config)
    losses = [evaluate(model, p, test).loss for p in (a, b, {k: 0.3 * a[k] + 0.7 * b[k] for k in a})]
    whole = losses[2] - (0.3 * losses[0] + 0.7 * losses[1])
    assert abs(whole) > 1e-3
    assert rows["(all)"]["alone"] == rows["(all)"]["all_but"] == pytest.approx(whole, abs=1e-6)
    assert rows["layers.1"]["alone"] == pytest.approx(whole, abs=1e-6)  # the path itself
    held = losses[0] - (0.3 * losses[0] + 0.7 * losses[1])  # held: θa all the way, against the pair's ends
    assert rows["layers.1"]["all_but"] == pytest.approx(held, abs=1e-6)


def test_family_barriers_hold_the_other_families_at_theta_a_or_move_them_on_the_path(prepared):
    """Two families move, at λ = 0.3: each row against the losses of the paths built by hand."""
    (config, a), test = tiny(0), load_split(prepared, "test")
    b, model = moved(a, {"layers.0", "out"}, seed=2), build_model("mlp", config)
    rows = {r["family"]: r for r in family_barriers(model, a, b, test, lam=0.3)}
    assert list(rows) == ["(all)", "layers.0", "out"]

    def barrier(names, against_b=False):  # the path moving the entries of ``names`` only
        mid = {k: 0.3 * a[k] + 0.7 * b[k] if k.rsplit(".", 1)[0] in names else a[k] for k in a}
        end = b if against_b else {k: b[k] if k.rsplit(".", 1)[0] in names else a[k] for k in a}
        loss = [evaluate(model, p, test).loss for p in (a, end, mid)]
        return loss[2] - (0.3 * loss[0] + 0.7 * loss[1])

    for family, other in (("layers.0", "out"), ("out", "layers.0")):
        assert rows[family]["alone"] == pytest.approx(barrier({family}), abs=1e-6)
        assert rows[family]["all_but"] == pytest.approx(barrier({other}, against_b=True), abs=1e-6)
        assert rows[family]["all_but"] != pytest.approx(barrier({other}), abs=1e-4)  # not the hybrid's own end
    assert rows["layers.0"]["alone"] != pytest.approx(rows["out"]["alone"], abs=1e-4)


def test_parameter_families_join_blocks_and_tied_names():
    params = {
        "embed.weight": torch.zeros(4, 2),
        "blocks.0.fc1.weight": torch.zeros(2, 2),
        "blocks.0.fc1.bias": torch.zeros(2),
        "blocks.1.fc1.weight": torch.zeros(2, 2),
        "blocks.0.attn.q.weight": torch.zeros(2, 2),
        "head.weight": torch.zeros(4, 2),
        "steps": torch.zeros((), dtype=torch.long),  # not floating: moves nowhere
    }
    assert parameter_families(params) == {
        "embed": ["embed.weight"],
        "blocks.*.fc1": ["blocks.0.fc1.weight", "blocks.0.fc1.bias", "blocks.1.fc1.weight"],
        "blocks.*.attn.q": ["blocks.0.attn.q.weight"],
        "head": ["head.weight"],
    }
    tied = parameter_families(params, [("embed.weight", "head.weight")])
    assert tied["embed + head"] == ["embed.weight", "head.weight"] and "head" not in tied


def test_family_barriers_of_a_tied_gpt_move_the_embeddings_and_head_together():
    config = make_config("gpt", input_shape=(8,), num_classes=16, width=8, depth=1, heads=2)
    model = build_model("gpt", config, seed=0)
    a, b = (dict(build_model("gpt", config, seed=s).state_dict()) for s in (0, 1))
    x = torch.randint(0, 16, (6, 8))
    split = Split(x, torch.roll(x, -1, dims=1))
    rows = family_barriers(model, a, b, split)  # tied values differ on a path that moved one name alone
    assert {r["family"] for r in rows} >= {"embed + head", "blocks.*.fc1"} and "head" not in {r["family"] for r in rows}
    assert all(math.isfinite(r["alone"]) and math.isfinite(r["all_but"]) for r in rows)


@pytest.mark.parametrize(("lam", "line"), [(0.0, "lam: expected"), (1.0, "lam: expected")])
def test_family_barriers_refuse_the_path_ends(prepared, lam, line):
    (config, a), test = tiny(0), load_split(prepared, "test")
    with pytest.raises(ValueError, match=line):
        family_barriers(build_model("mlp", config), a, a, test, lam=lam)
    with pytest.raises(ValueError, match="permuted_b: expected the entries of params_a"):
        family_barriers(build_model("mlp", config), a, {k: v for k, v in a.items() if k != "out.bias"}, test)


def test_measure_method_adds_the_family_table_when_asked(prepared):
    (config, params_a), params_b = tiny(0), tiny(1)[1]
    splits = {s: load_split(prepared, s) for s in ("train", "test")}
    ckpts = (Checkpoint("mlp", config, 0, params_a), Checkpoint("mlp", config, 1, params_b))
    midpoint = Checkpoint("mlp", config, None, {k: (params_a[k] + params_b[k]) / 2 for k in params_a})
    plain, asked = (
        measure_method(
            prepare_pair(*ckpts, splits, MeasureSettings(num_lambdas=3, family_barriers=f)), ckpts[1], midpoint
        )
        for f in (False, True)
    )
    assert "families" not in plain[0]
    rows = asked[0]["families"]
    assert [r["family"] for r in rows] == ["(all)", "layers.0", "layers.1", "out"]
    assert rows[0]["alone"] == pytest.approx(asked[1]["test_loss_barrier_mid"], abs=1e-6)
