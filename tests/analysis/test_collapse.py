"""Neural collapse statistics and mixup: closed forms of NC1 and the ETF distance, and mixup
training that is deterministic per seed and mixes what it says."""

from __future__ import annotations

import math

import pytest
import torch

from lmclab.analysis.collapse import collapse_stats
from lmclab.train.augment import Mixup
from lmclab.train.training import train


def simplex(c: int, scale: float = 3.0) -> torch.Tensor:
    return scale * (torch.eye(c, dtype=torch.float64) - 1.0 / c)


def test_features_collapsed_onto_a_simplex_etf_give_zero_statistics():
    y = torch.arange(5).repeat(40)
    rotation, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    stats = collapse_stats(simplex(5)[y] @ rotation + 7.0, y)  # rotated and shifted: still an ETF
    assert stats["nc1"] == pytest.approx(0, abs=1e-12) and stats["nc2_etf"] == pytest.approx(0, abs=1e-12)
    assert stats["nc_equinorm"] == pytest.approx(0, abs=1e-12)


def test_simplex_directions_of_unequal_norms_are_an_etf_that_is_not_equinorm():
    """Class means s_c·u_c with u_c the simplex directions and norms s = (1, 2, 3, 6); n_c ∝ 1/s_c samples
    put the global mean at the simplex's centre. Normalised means form the ETF (distance 0); the norms'
    coefficient of variation is std(s)/mean(s)."""
    norms = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    y = torch.repeat_interleave(torch.arange(4), torch.tensor([6, 3, 2, 1])).repeat(5)  # n_c·s_c = 6
    stats = collapse_stats(norms[y, None] * simplex(4, scale=1.0)[y] + 2.0, y)  # shifted off the origin
    assert stats["nc2_etf"] == pytest.approx(0, abs=1e-12) and stats["nc1"] == pytest.approx(0, abs=1e-12)
    assert stats["nc_equinorm"] == pytest.approx(float(norms.std() / norms.mean()), rel=1e-12)


def test_within_class_spread_and_unequal_means_are_measured():
    y = torch.arange(4).repeat(500)
    noise = torch.randn(2000, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # NC1 = tr(Σ_W Σ_B⁺)/C is linear in the within-class covariance: twice the noise, four times NC1
    small, large = collapse_stats(simplex(4)[y] + 0.1 * noise, y), collapse_stats(simplex(4)[y] + 0.2 * noise, y)
    assert large["nc1"] == pytest.approx(4 * small["nc1"], rel=0.05)  # NC1 grows with the within-class variance
    # closed form: means 3(e_c − 1/C) give Σ_B = (9/C)(I − 11ᵀ/C), Σ_W ≈ s²I, so NC1 ≈ s²(C − 1)/9
    assert small["nc1"] == pytest.approx(0.01 * 3 / 9, rel=0.1)
    means = torch.tensor([[1.0, 0, 0, 0], [2.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 3.0, 0]], dtype=torch.float64)
    skew = collapse_stats(means[y], y)
    assert skew["nc1"] == pytest.approx(0, abs=1e-12) and skew["nc2_etf"] > 0.3 and skew["nc_equinorm"] > 0.2


def test_features_of_a_diverged_model_give_nan_statistics_not_an_error():
    y = torch.arange(3).repeat(4)
    features = simplex(3)[y].clone()
    features[0, 0] = float("nan")  # training diverged: the end-of-training statistics are NaN, as its loss is
    stats = collapse_stats(features, y)
    assert stats.keys() == collapse_stats(simplex(3)[y], y).keys() and all(math.isnan(v) for v in stats.values())


def test_mixup_mixes_inputs_and_labels_with_one_beta_draw():
    x, y = torch.arange(8.0).reshape(8, 1), torch.arange(8)
    mixed, partner, lam = Mixup(0.4, seed=0).mix(x, y)
    assert 0 < lam < 1 and sorted(partner.tolist()) == list(range(8))
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x[partner])
    assert Mixup(0.4, seed=0).mix(x, y)[2] == lam and Mixup(0.4, seed=1).mix(x, y)[2] != lam
    with pytest.raises(ValueError, match=r"^mixup_alpha must be positive to mix"):
        Mixup(0.0, seed=0)


def test_mixup_training_is_deterministic_per_seed_and_writes_collapse_statistics(splits):
    from lmclab.archs import make_config

    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=32)

    def run(alpha):
        return train(
            "mlp",
            config,
            0,
            splits["train"],
            splits["test"],
            epochs=2,
            batch_size=100,
            mixup_alpha=alpha,
        )

    (a, history), (b, _), (plain, plain_history) = run(0.4), run(0.4), run(0.0)
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert not all(torch.equal(a.state_dict[k], plain.state_dict[k]) for k in a.state_dict)
    assert {"nc1", "nc2_etf", "nc_equinorm"} <= set(history[-1]) and "nc1" not in history[0]
    assert plain_history[-1]["nc1"] > 0 and history[-1]["train_loss"] > plain_history[-1]["train_loss"]  # mixed targets


def test_a_mixup_step_minimises_the_mixed_cross_entropy(splits):
    from torch.nn import functional as F

    from lmclab.core.distributed import World
    from lmclab.train.training import Step

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the step leaves the model as it is
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    step = Step(model, opt, sched, splits["train"], "none", torch.Generator(), World(), "fp32", Mixup(1.0, seed=3))
    idx = torch.randperm(len(splits["train"]), generator=torch.Generator().manual_seed(0))[:64]  # many classes
    summed, _, n = step.one(idx)
    x, y = splits["train"].x[idx], splits["train"].y[idx]
    mixed, partner, lam = Mixup(1.0, seed=3).mix(x, y)  # the same draws
    with torch.no_grad():
        logits = model(mixed)
        expected = lam * F.cross_entropy(logits, y) + (1 - lam) * F.cross_entropy(logits, partner)
    assert (partner != y).any()
    assert summed / n == pytest.approx(float(expected), rel=1e-6)


def test_the_mixup_table_compares_endpoints_and_methods_per_alpha():
    import pandas as pd

    from lmclab.studies.mixup import mixup_table

    def run(acc: float, nc1: float, barrier: float) -> dict:
        history = pd.DataFrame(
            [
                {"seed": s, "epoch": e, "test_acc": acc + 0.01 * s, "nc1": nc1 if e == 2 else None}
                for s in (0, 1)
                for e in (1, 2)
            ]
        )
        pairs = pd.DataFrame(
            [
                {
                    "method": m,
                    "pair": "seed0-seed1",
                    "test_loss_barrier_mid": barrier * (m == "identity"),
                    "l2_reduction_pct": 5.0,
                    "R_0.3": 0.1,
                }
                for m in ("identity", "wm")
            ]
        )
        return {"history": history, "pairs": pairs}

    table = mixup_table({0.4: run(0.9, 2.0, 0.5), 0.0: run(0.95, 1.0, 1.0)}, ["identity", "wm"])
    assert table["mixup_alpha"].tolist() == [0.0, 0.4]  # sorted by α
    assert table.loc[0, "acc %"] == "95.500 ± 0.707" and table.loc[1, "NC1"] == "2.000 ± 0.000"
    assert table.loc[0, "identity B½"] == "1.000 ± 0.000" and table.loc[1, "wm B½"] == "0.000 ± 0.000"
