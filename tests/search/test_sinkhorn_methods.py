"""The Sinkhorn operator, WM Sinkhorn (DistL2Loss) and the optimiser/selection options of the
midpoint searches (STE, Sinkhorn STE), as the authors' reference computes them."""

from __future__ import annotations

import json
import math
import warnings
from functools import partial

import pytest
import torch
from conftest import random_params

from lmclab.archs import get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.spec import apply_permutation, build_spec, invert, random_permutation
from lmclab.core.spec_builders import dense
from lmclab.search import ste as ste_module
from lmclab.search import ste_sinkhorn as ste_sinkhorn_module
from lmclab.search.midpoint import drawn_lam, midpoint_loss, minibatches
from lmclab.search.sinkhorn import (
    hard_permutation,
    init_scores,
    log_sinkhorn,
    scaling_max_range,
    scaling_sinkhorn,
    scores_at,
    sinkhorn,
    soft_apply,
    soft_permutation,
)
from lmclab.search.weight_matching import matching_objective, weight_matching
from lmclab.search.wm_sinkhorn import (
    StalledSearchWarning,
    distance_loss,
    stalled,
    start_gradients,
    start_scores,
    wm_sinkhorn,
)

MLP = get_arch("mlp")


# ---- the Sinkhorn operator -----------------------------------------------------------------


def test_log_sinkhorn_rows_and_columns_sum_to_one_at_small_tau() -> None:
    scores = torch.randn(12, 12, generator=torch.Generator().manual_seed(0))
    soft = log_sinkhorn(scores, tau=0.1, n_iter=1000)  # 500 leaves the columns 8e-5 off
    torch.testing.assert_close(soft.sum(-1), torch.ones(12), atol=1e-5, rtol=0)  # rows: exact after the last step
    torch.testing.assert_close(soft.sum(-2), torch.ones(12), atol=1e-5, rtol=0)  # columns: converged


def test_columns_are_normalised_first_as_in_the_reference() -> None:
    """After one iteration the rows sum to 1 exactly and the columns do not (reference order)."""
    scores = torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    soft = log_sinkhorn(scores, tau=1.0, n_iter=1)
    torch.testing.assert_close(soft.sum(-1), torch.ones(6, dtype=torch.float64))
    assert float((soft.sum(-2) - 1).abs().max()) > 1e-3
    columns = scores.softmax(dim=-2)  # column softmax, then each row divided by its sum
    torch.testing.assert_close(soft, columns / columns.sum(-1, keepdim=True))


@pytest.mark.parametrize("shape", [(7, 7), (3, 9, 9)])
def test_scaling_vectors_give_the_log_domain_map_and_its_gradient(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(2)
    scores = (2 * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()
    weights = torch.randn(*shape, generator=gen, dtype=torch.float64)
    fast, slow = (f(scores, tau=0.7, n_iter=9) for f in (scaling_sinkhorn, log_sinkhorn))
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    (g_fast,), (g_slow,) = (torch.autograd.grad((s * weights).sum(), scores) for s in (fast, slow))
    torch.testing.assert_close(g_fast, g_slow, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: scaling_sinkhorn(x, tau=0.7, n_iter=9), (scores,))


def test_scaling_is_accurate_in_float32_up_to_its_range_and_the_log_domain_beyond() -> None:
    limit = scaling_max_range(torch.float32)
    assert limit == pytest.approx(0.45 * math.log(torch.finfo(torch.float32).max))
    base = torch.rand(16, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    exact = lambda s: log_sinkhorn(s, tau=1.0, n_iter=20)  # noqa: E731
    at_limit = base / (base.max() - base.min()) * (limit - 0.5)
    torch.testing.assert_close(
        scaling_sinkhorn(at_limit.float(), tau=1.0, n_iter=20).double(), exact(at_limit), rtol=0, atol=1e-4
    )
    beyond = at_limit.clone()
    beyond[:, 0] -= 4 * limit  # a column far below the rest: exp underflows to 0 in float32
    assert not torch.isfinite(scaling_sinkhorn(beyond.float(), tau=1.0, n_iter=20)).all()  # why the switch
    torch.testing.assert_close(sinkhorn(beyond.float(), tau=1.0, n_iter=20).double(), exact(beyond), rtol=0, atol=1e-4)


def test_groups_of_one_size_are_batched_without_mixing() -> None:
    gen = torch.Generator().manual_seed(4)
    scores = {
        "P_a": torch.randn(5, 5, generator=gen),
        "P_b": torch.randn(8, 8, generator=gen),
        "P_c": torch.randn(5, 5, generator=gen),
    }
    soft = soft_permutation(scores, tau=0.5, n_iter=10)
    assert list(soft) == list(scores)
    for g, s in scores.items():
        torch.testing.assert_close(soft[g], log_sinkhorn(s, tau=0.5, n_iter=10))


# ---- WM Sinkhorn (DistL2Loss) --------------------------------------------------------------


def _planted(width: int, hidden: int, seed: int, noise: float) -> tuple:
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=hidden, width=width)
    spec = MLP.permutation_spec(config)
    params_a = random_params("mlp", config, seed)
    planted = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(seed + 1))
    gen = torch.Generator().manual_seed(seed + 2)
    params_b = {
        k: v + noise * v.std() * torch.randn(v.shape, generator=gen)
        for k, v in apply_permutation(spec, planted, params_a).items()
    }
    return spec, params_a, params_b, invert(planted)


def test_distance_loss_is_the_mean_over_matched_entries() -> None:
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    gen = torch.Generator().manual_seed(5)
    params_a = {
        "l0.weight": torch.randn(3, 2, generator=gen),
        "l0.bias": torch.randn(3, generator=gen),
        "l1.weight": torch.randn(1, 3, generator=gen),
        "l1.bias": torch.randn(1, generator=gen),
    }
    params_b = {k: torch.randn(v.shape, generator=gen) for k, v in params_a.items()}
    scores = {"P": torch.randn(3, 3, generator=gen)}
    soft = soft_permutation(scores, tau=1.0, n_iter=5)["P"]
    by_hand = (
        (params_a["l0.weight"] - soft @ params_b["l0.weight"]).pow(2).sum()
        + (params_a["l0.bias"] - soft @ params_b["l0.bias"]).pow(2).sum()
        + (params_a["l1.weight"] - params_b["l1.weight"] @ soft.T).pow(2).sum()
        + (params_a["l1.bias"] - params_b["l1.bias"]).pow(2).sum()
    ) / 13
    loss = distance_loss(spec, scores, params_a, params_b, tau=1.0, n_iter=5)
    torch.testing.assert_close(loss, by_hand)
    torch.testing.assert_close(soft_apply(spec, {"P": soft}, params_b)["l1.weight"], params_b["l1.weight"] @ soft.T)


def test_wm_sinkhorn_s_soft_loss_is_the_mean_of_its_adam_steps_at_its_temperature() -> None:
    spec = build_spec(dense("l0", "P", None, bias=False), dense("l1", None, "P", bias=False))
    gen = torch.Generator().manual_seed(5)
    params_a = {"l0.weight": torch.randn(4, 2, generator=gen), "l1.weight": torch.randn(3, 4, generator=gen)}
    params_b = {k: torch.randn(v.shape, generator=gen) for k, v in params_a.items()}
    sinkhorn = {"tau": 0.5, "n_iter": 3}
    found = wm_sinkhorn(
        spec,
        params_a,
        params_b,
        generator=torch.Generator().manual_seed(0),
        epochs=1,
        iterations=2,
        lr=0.3,
        tau=0.5,
        sinkhorn_iters=3,
    )
    scores = {g: s.requires_grad_() for g, s in init_scores({"P": 4}, torch.Generator().manual_seed(0)).items()}
    adam, losses = torch.optim.Adam(scores.values(), lr=0.3), []
    for _ in range(2):
        loss = distance_loss(spec, scores, params_a, params_b, **sinkhorn)
        adam.zero_grad()
        loss.backward()
        adam.step()
        losses.append(loss.item())
    assert found.stats["curve"][1]["soft_loss"] == pytest.approx(sum(losses) / 2, rel=1e-6)
    assert losses[1] != pytest.approx(losses[0], rel=1e-3)  # the first step moved the scores
    start = init_scores({"P": 4}, torch.Generator().manual_seed(0))
    for other in ({"tau": 1.0, "n_iter": 3}, {"tau": 0.5, "n_iter": 20}):  # the temperature and iterations matter
        assert float(distance_loss(spec, start, params_a, params_b, **other)) != pytest.approx(losses[0], rel=1e-5)


def test_wm_sinkhorn_s_curve_counts_the_units_each_epoch_moved_and_scores_its_permutation() -> None:
    spec = build_spec(dense("l0", "P", None), dense("l1", "Q", "P"), dense("l2", None, "Q"))
    gen = torch.Generator().manual_seed(5)
    shapes = {"l0.weight": (6, 3), "l0.bias": (6,), "l1.weight": (6, 6), "l1.bias": (6,), "l2.weight": (2, 6)}
    shapes["l2.bias"] = (2,)
    params_a, params_b = ({k: torch.randn(n, generator=gen) for k, n in shapes.items()} for _ in range(2))
    perms = []
    found = wm_sinkhorn(
        spec, params_a, params_b, generator=torch.Generator().manual_seed(0), epochs=4, iterations=3, lr=3.0,
        patience=None, monitor=lambda perm: perms.append(perm) or {},
    )  # fmt: skip
    curve = found.stats["curve"]
    assert len(perms) == len(curve) == 5 and curve[0]["changed"] is None and found.stats["epochs"] == 4
    for row, before, after in zip(curve[1:], perms[:-1], perms[1:], strict=True):
        assert row["changed"] == sum(int((after[g] != before[g]).sum()) for g in after)
    assert any(row["changed"] > 0 for row in curve[1:])
    assert [r["objective"] for r in curve] == [matching_objective(spec, p, params_a, params_b) for p in perms]
    assert found.stats["best_epoch"] == max(curve, key=lambda r: r["objective"])["epoch"]


@pytest.mark.slow
@pytest.mark.parametrize(("width", "epochs"), [(64, 20), (512, 30)])
def test_wm_sinkhorn_recovers_a_planted_permutation(width: int, epochs: int) -> None:
    """θb = π(θa) + noise (5 % of each tensor's std): the search returns π⁻¹ exactly."""
    spec, params_a, params_b, expected = _planted(width, hidden=2, seed=6, noise=0.05)
    result = wm_sinkhorn(
        spec, params_a, params_b, generator=torch.Generator().manual_seed(0), epochs=epochs, iterations=10
    )
    for g, p in expected.items():
        assert torch.equal(result.perm[g], p), (g, int((result.perm[g] != p).sum()))


@pytest.mark.slow
def test_convergence_stop_returns_the_full_schedules_permutation() -> None:
    spec, params_a, params_b, expected = _planted(64, hidden=2, seed=7, noise=0.05)

    def run(**kw):
        return wm_sinkhorn(
            spec,
            params_a,
            params_b,
            generator=torch.Generator().manual_seed(0),
            epochs=40,
            iterations=10,
            **kw,
        )

    full, stopped = run(patience=None), run(patience=3)
    objectives = [r["objective"] for r in stopped.stats["curve"]]
    assert len(objectives) < len(full.stats["curve"]) == 41
    assert objectives == [r["objective"] for r in full.stats["curve"][: len(objectives)]]
    assert stopped.stats["best_epoch"] == len(objectives) - 1 - 3  # three epochs without a better one
    for g, p in expected.items():
        assert torch.equal(stopped.perm[g], p) and torch.equal(full.perm[g], p)


def test_best_selection_returns_the_best_scored_epoch() -> None:
    spec, params_a, params_b, _ = _planted(16, hidden=1, seed=8, noise=2.0)

    def run(select):
        return wm_sinkhorn(
            spec,
            params_a,
            params_b,
            select=select,
            generator=torch.Generator().manual_seed(0),
            epochs=12,
            iterations=3,
            lr=3.0,
        )

    best, last = run("best"), run("last")
    curve = best.stats["curve"]
    top = max(curve, key=lambda r: r["objective"])
    assert best.stats["best_epoch"] == top["epoch"] and last.stats["best_epoch"] == 12
    assert matching_objective(spec, best.perm, params_a, params_b) == pytest.approx(top["objective"])
    assert matching_objective(spec, last.perm, params_a, params_b) == pytest.approx(curve[-1]["objective"])
    seconds = [r["seconds"] for r in curve]  # since the search started, which lasted best.stats["seconds"]
    assert seconds == sorted(seconds) and 0 < seconds[0] <= seconds[-1] <= best.stats["seconds"]


def test_patience_counts_epochs_since_the_last_better_one() -> None:
    """The stop epoch follows from the full run's objectives: stop once ``patience`` epochs in a row
    have not beaten the best so far (a new best restarts the count)."""
    spec, params_a, params_b, _ = _planted(16, hidden=1, seed=8, noise=2.0)

    def run(**kw):
        return wm_sinkhorn(
            spec,
            params_a,
            params_b,
            generator=torch.Generator().manual_seed(0),
            epochs=30,
            iterations=3,
            lr=3.0,
            **kw,
        )

    objectives = [r["objective"] for r in run().stats["curve"]]

    def stop_epoch(patience: int, restart: bool) -> int:
        best, stale = objectives[0], 0
        for epoch, value in enumerate(objectives[1:], start=1):
            stale = 0 if value > best and restart else stale + (value <= best)
            best = max(best, value)
            if stale >= patience:
                return epoch
        return len(objectives) - 1

    assert stop_epoch(6, restart=True) != stop_epoch(6, restart=False)  # the case tells them apart
    assert run(patience=6).stats["curve"][-1]["epoch"] == stop_epoch(6, restart=True)


def test_stalled_means_no_epoch_changed_the_hard_permutation() -> None:
    start = {"epoch": 0, "changed": None}
    assert stalled([start, {"changed": 0}, {"changed": 0}])
    assert not stalled([start, {"changed": 0}, {"changed": 3}, {"changed": 0}])  # it moved once
    assert not stalled([start])  # no epoch ran
    assert not stalled([{"epoch": 0}, {"epoch": 1}])  # a curve without "changed" (STE, coordinate descent)


@pytest.mark.slow
def test_below_adams_eps_the_search_stalls_warns_and_a_larger_lr_recovers() -> None:
    """Scaling θa and θb by s scales the DistL2 gradients by s²: at s = 0.01 they fall below Adam's
    ε (1e-8), a step is ≈ lr·g/ε and at lr 1 the planted permutation of the unscaled case is never
    reached — the search returns its start (the identity) and says so; lr 10 finds it again."""
    spec, params_a, params_b, expected = _planted(64, hidden=2, seed=6, noise=0.05)
    small_a, small_b = ({k: 0.01 * v for k, v in p.items()} for p in (params_a, params_b))

    def run(a, b, lr):
        return wm_sinkhorn(
            spec, a, b, generator=torch.Generator().manual_seed(0), epochs=20, iterations=10, lr=lr, patience=None
        )

    with pytest.warns(StalledSearchWarning, match=r"in 200 Adam steps .* raise lr \(it was 1\)"):
        stuck = run(small_a, small_b, 1.0)
    assert stuck.stats["stalled"] and stuck.stats["best_epoch"] == 0
    assert all(torch.equal(p, torch.arange(len(p))) for p in stuck.perm.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalledSearchWarning)
        found, unscaled = run(small_a, small_b, 10.0), run(params_a, params_b, 1.0)
    for result in (found, unscaled):
        assert result.stats["stalled"] is False
        assert all(torch.equal(result.perm[g], p) for g, p in expected.items())


def test_start_gradients_scale_with_the_weights_squared_and_give_adams_first_step() -> None:
    """The DistL2 gradient is quadratic in θ (× s²); Adam's first step at lr 1 is g/(|g| + ε), i.e.
    ≈ ±1 for g ≫ ε and ≈ g/ε for g ≪ ε — checked against torch's Adam on the same scores."""
    spec, params_a, params_b, _ = _planted(32, hidden=2, seed=3, noise=0.5)
    one = start_gradients(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    small_a, small_b = ({k: 1e-3 * v for k, v in p.items()} for p in (params_a, params_b))
    small = start_gradients(spec, small_a, small_b, generator=torch.Generator().manual_seed(0))
    for g in one:
        assert small[g]["rms_grad"] == pytest.approx(1e-6 * one[g]["rms_grad"], rel=1e-4)
        assert one[g]["n"] == 32 and one[g]["max_grad"] >= one[g]["rms_grad"]
    scores = {
        g: s.requires_grad_() for g, s in init_scores({"P_0": 32, "P_1": 32}, torch.Generator().manual_seed(0)).items()
    }
    before = {g: s.detach().clone() for g, s in scores.items()}
    optimizer = torch.optim.Adam(scores.values(), lr=1.0)
    matched = spec.matched(small_b)
    distance_loss(spec, scores, small_a, matched, tau=1.0, n_iter=20).backward()
    optimizer.step()
    for g in scores:
        moved = float((scores[g].detach() - before[g]).double().pow(2).mean().sqrt())
        assert moved == pytest.approx(small[g]["first_step_rms"], rel=1e-3)
        assert moved == pytest.approx(small[g]["rms_over_eps"], rel=0.2)  # g ≪ ε: the step is ≈ g/ε


def test_start_gradients_are_those_of_the_loss_at_their_temperature_and_iterations() -> None:
    spec, params_a, params_b, _ = _planted(6, hidden=1, seed=3, noise=0.5)
    found = start_gradients(spec, params_a, params_b, generator=torch.Generator().manual_seed(0), tau=0.5, n_iter=3)
    default = start_gradients(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    assert default == start_gradients(
        spec, params_a, params_b, generator=torch.Generator().manual_seed(0), tau=1.0, n_iter=20
    )
    scores = {g: s.requires_grad_() for g, s in init_scores({"P_0": 6}, torch.Generator().manual_seed(0)).items()}
    distance_loss(spec, scores, params_a, spec.matched(params_b), tau=0.5, n_iter=3).backward()
    grad = scores["P_0"].grad.double()
    rms = float(grad.pow(2).mean().sqrt())
    assert found["P_0"]["n"] == 6 and found["P_0"]["max_grad"] == float(grad.abs().max())
    assert found["P_0"]["rms_grad"] == rms and found["P_0"]["rms_over_eps"] == rms / 1e-8
    assert default["P_0"]["rms_grad"] != pytest.approx(rms, rel=1e-3)


# ---- optimiser options: two steps of a fixed gradient g, by hand ---------------------------


def _two_steps(optimizer: torch.optim.Optimizer, theta: torch.Tensor, g: float) -> list[float]:
    values = []
    for _ in range(2):
        optimizer.zero_grad()
        (g * theta).sum().backward()
        optimizer.step()
        values.append(float(theta.detach()))
    return values


def test_sgd_momentum_of_ste() -> None:
    theta = torch.tensor([1.0], requires_grad=True)
    opt = ste_module.make_optimizer("sgd", [theta], lr=0.1, momentum=0.9)
    # b1 = g, θ1 = 1 − 0.1·2 = 0.8; b2 = 0.9·2 + 2 = 3.8, θ2 = 0.8 − 0.38 = 0.42
    assert _two_steps(opt, theta, 2.0) == pytest.approx([0.8, 0.42])


# Adam: the gradient is g' = g + wd·θ: 0.8 then 0.75. Step 1 is −lr (m̂/√v̂ = 1): θ1 = 0.9. Step 2:
# m = 0.9·0.08 + 0.1·0.75, v = 0.999·0.00064 + 0.001·0.5625, bias-corrected by 1 − 0.9², 1 − 0.999².
ADAM_2 = 0.9 - 0.1 * ((0.9 * 0.08 + 0.1 * 0.75) / 0.19) / math.sqrt((0.999 * 0.00064 + 0.001 * 0.5625) / (1 - 0.999**2))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("adam", [0.9, ADAM_2]),
        # AdamW: θ ← θ(1 − lr·wd), then the step of the constant g, −lr: 0.95 − 0.1; 0.85·0.95 − 0.1
        ("adamw", [0.85, 0.7075]),
    ],
)
def test_adam_and_adamw_weight_decay_of_ste_sinkhorn(name: str, expected: list[float]) -> None:
    theta = torch.tensor([1.0], requires_grad=True)
    opt = ste_sinkhorn_module.make_optimizer(name, [theta], lr=0.1, weight_decay=0.5)
    assert _two_steps(opt, theta, 0.3) == pytest.approx(expected, abs=1e-6)


def test_the_last_short_batch_is_kept_unless_dropped() -> None:
    gen = torch.Generator().manual_seed(0)
    kept = minibatches(10, 4, gen, drop_last=False)
    assert [len(b) for b in kept] == [4, 4, 2] and sorted(torch.cat(kept).tolist()) == list(range(10))
    assert [len(b) for b in minibatches(10, 4, gen, drop_last=True)] == [4, 4]


def _tiny_problem() -> tuple:
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    net = torch.nn.Sequential()
    net.add_module("l0", torch.nn.Linear(784, 8))
    net.add_module("relu", torch.nn.ReLU())
    net.add_module("l1", torch.nn.Linear(8, 10))
    gen = torch.Generator().manual_seed(9)
    params = [{k: torch.randn(v.shape, generator=gen) * 0.1 for k, v in net.state_dict().items()} for _ in range(2)]
    data = Split(torch.randn(50, 784, generator=gen), torch.randint(0, 10, (50,), generator=gen))
    return spec, net, params, data


def test_scores_at_moves_the_identity_initialisation_to_a_permutation() -> None:
    gen = torch.Generator().manual_seed(3)
    scores = init_scores({"P": 7, "Q": 5}, gen)
    perm = {g: torch.randperm(n, generator=gen) for g, n in (("P", 7), ("Q", 5))}
    moved = scores_at(scores, perm)
    for g, p in perm.items():
        torch.testing.assert_close(moved[g][torch.arange(len(p)), p], scores[g].diagonal())
        assert sorted(moved[g].flatten().tolist()) == sorted(scores[g].flatten().tolist())  # same entries
    hard = hard_permutation(moved, tau=1.0, n_iter=20)
    assert {g: p.tolist() for g, p in hard.items()} == {g: p.tolist() for g, p in perm.items()}


def test_ste_sinkhorn_init_wm_starts_from_weight_matchings_permutation() -> None:
    """With a negligible learning rate the scores stay where they start: ``init="wm"`` returns
    coordinate-descent WM's permutation, the default ``identity`` the identity."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    wm = weight_matching(spec, params_a, params_b).perm["P"]
    assert not torch.equal(wm, torch.arange(8))

    def run(init: str) -> torch.Tensor:
        return ste_sinkhorn_module.ste_sinkhorn(
            spec,
            params_a,
            params_b,
            model=net,
            data=data,
            generator=torch.Generator().manual_seed(0),
            epochs=1,
            batch_size=50,
            lr=1e-9,
            init=init,
        ).perm["P"]

    assert torch.equal(run("wm"), wm)
    assert torch.equal(run("identity"), torch.arange(8))


def test_wm_sinkhorn_init_wm_starts_at_weight_matchings_permutation_and_never_ends_below_it() -> None:
    """``init="wm"``: epoch 0 scores coordinate-descent WM's permutation (the same one ste_sinkhorn's
    ``init="wm"`` starts from); with a negligible lr it is returned; with lr 3 ``select="best"``
    returns a permutation at least as good by ⟨θa, π(θb)⟩, while the identity start ends below it here."""
    spec, params_a, params_b, _ = _planted(16, hidden=1, seed=8, noise=2.0)
    found = weight_matching(spec, params_a, params_b, restarts=1)
    target = matching_objective(spec, found.perm, params_a, params_b)

    def run(init: str, lr: float):
        return wm_sinkhorn(
            spec,
            params_a,
            params_b,
            generator=torch.Generator().manual_seed(0),
            epochs=6,
            iterations=3,
            lr=lr,
            init=init,
        )

    with pytest.warns(StalledSearchWarning, match="it returned weight matching's permutation — raise lr"):
        still = run("wm", 1e-9)
    assert {g: p.tolist() for g, p in still.perm.items()} == {g: p.tolist() for g, p in found.perm.items()}
    assert still.stats["curve"][0]["objective"] == pytest.approx(target)
    moved, plain = run("wm", 3.0), run("identity", 3.0)
    assert moved.stats["curve"][0]["objective"] == pytest.approx(target)
    assert max(r["objective"] for r in moved.stats["curve"]) >= target - 1e-9
    assert max(r["objective"] for r in plain.stats["curve"]) < target


def test_init_wm_draws_weight_matchings_visiting_order_from_the_search_generator() -> None:
    # the noisy identity, then WM's unit order, from one generator: STE Sinkhorn's minibatches come next
    spec, params_a, params_b, _ = _planted(8, hidden=3, seed=8, noise=2.0)
    ours, by_hand = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    start_scores(spec, params_a, params_b, init="wm", generator=ours, device="cpu", lap_backend="scipy")
    init_scores(spec.group_sizes(params_a), by_hand)
    weight_matching(spec, params_a, params_b, generator=by_hand, restarts=1)
    assert torch.equal(ours.get_state(), by_hand.get_state())
    only_scores = torch.Generator().manual_seed(5)
    init_scores(spec.group_sizes(params_a), only_scores)
    assert not torch.equal(ours.get_state(), only_scores.get_state())


def test_ste_sinkhorn_s_first_loss_is_the_midpoint_at_its_temperature() -> None:
    spec, net, (params_a, params_b), data = _tiny_problem()
    found = ste_sinkhorn_module.ste_sinkhorn(
        spec,
        params_a,
        params_b,
        model=net,
        data=data,
        generator=torch.Generator().manual_seed(0),
        epochs=1,
        batch_size=50,
        tau=0.5,
        sinkhorn_iters=3,
    )
    start = init_scores({"P": 8}, torch.Generator().manual_seed(0))

    def first_loss(tau: float, n_iter: int) -> float:
        soft = soft_permutation(start, tau=tau, n_iter=n_iter)
        return float(midpoint_loss(net, spec, params_a, soft_apply(spec, soft, params_b), data.x, data.y))

    assert found.stats["curve"][1]["train_loss"] == pytest.approx(first_loss(0.5, 3), rel=1e-7)
    assert first_loss(1.0, 3) != pytest.approx(first_loss(0.5, 3), rel=1e-4)
    assert first_loss(0.5, 20) != pytest.approx(first_loss(0.5, 3), rel=1e-7)


def test_ste_sinkhorn_s_loss_is_the_merge_s_at_a_weight_drawn_after_the_minibatches() -> None:
    """``lam_spread`` (Theus et al. 2025): the step's loss is the merge's at λ ~ U(½ − s, ½ + s), drawn from the
    search's generator after the scores and the epoch's minibatch order."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    run = partial(
        ste_sinkhorn_module.ste_sinkhorn, spec, params_a, params_b, model=net, data=data, epochs=1, batch_size=50
    )
    found = run(generator=torch.Generator().manual_seed(0), lam_spread=0.3)
    by_hand = torch.Generator().manual_seed(0)
    start = init_scores({"P": 8}, by_hand)
    torch.randperm(50, generator=by_hand)
    lam = drawn_lam(0.3, by_hand)
    assert abs(lam - 0.5) > 0.05
    soft = soft_apply(spec, soft_permutation(start, tau=1.0, n_iter=20), params_b)
    expected = float(midpoint_loss(net, spec, params_a, soft, data.x, data.y, lam=lam))
    assert found.stats["curve"][1]["train_loss"] == pytest.approx(expected, rel=1e-6)
    midpoint = run(generator=torch.Generator().manual_seed(0)).stats["curve"][1]["train_loss"]
    assert midpoint != pytest.approx(expected, rel=1e-3)


def test_ste_sinkhorn_counts_the_short_batch_as_a_step() -> None:
    spec, net, (params_a, params_b), data = _tiny_problem()
    run = lambda drop: ste_sinkhorn_module.ste_sinkhorn(  # noqa: E731
        spec,
        params_a,
        params_b,
        model=net,
        data=data,
        generator=torch.Generator().manual_seed(0),
        epochs=2,
        batch_size=16,
        drop_last=drop,
        optimizer="adamw",
        weight_decay=0.01,
    )
    assert [r["steps"] for r in run(False).stats["curve"]] == [0, 4, 8]
    assert [r["steps"] for r in run(True).stats["curve"]] == [0, 3, 6]


def test_bf16_runs_the_midpoint_products_in_bfloat16_and_follows_the_float32_run() -> None:
    """``precision: bf16`` autocasts π_soft(θb) and the midpoint forward (the layers' outputs are bfloat16);
    the per-epoch losses stay within bfloat16 rounding of the float32 run's."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    seen: list[torch.dtype] = []
    net.l0.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))

    def run(precision):
        return ste_sinkhorn_module.ste_sinkhorn(
            spec,
            params_a,
            params_b,
            model=net,
            data=data,
            generator=torch.Generator().manual_seed(0),
            epochs=3,
            batch_size=16,
            optimizer="adamw",
            lr=0.1,
            precision=precision,
        ).stats["curve"][1:]

    fp32 = [r["train_loss"] for r in run("fp32")]
    assert set(seen) == {torch.float32}
    seen.clear()
    bf16 = [r["train_loss"] for r in run("bf16")]
    assert set(seen) == {torch.bfloat16}
    assert bf16 == pytest.approx(fp32, rel=2e-2) and bf16 != fp32


def test_bf16_computes_the_soft_permuted_parameters_under_autocast(monkeypatch) -> None:
    """π_soft(θb) is inside the autocast region: the permuted parameters that reach the midpoint loss
    are bfloat16 (products of S and θb in bfloat16), the unpermuted ones untouched float32."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    seen: list[dict[str, torch.dtype]] = []

    def recording(model, spec, params_a, permuted_b, x, y, *, lam):
        seen.append({k: v.dtype for k, v in permuted_b.items()})
        return midpoint_loss(model, spec, params_a, permuted_b, x, y, lam=lam)

    monkeypatch.setattr(ste_sinkhorn_module, "midpoint_loss", recording)
    run = lambda precision: ste_sinkhorn_module.ste_sinkhorn(  # noqa: E731
        spec,
        params_a,
        params_b,
        model=net,
        data=data,
        generator=torch.Generator().manual_seed(0),
        epochs=1,
        batch_size=25,
        precision=precision,
    )
    run("bf16")
    permuted = {
        "l0.weight": torch.bfloat16,
        "l0.bias": torch.bfloat16,
        "l1.weight": torch.bfloat16,
        "l1.bias": torch.float32,
    }
    assert len(seen) == 2 and all(dtypes == permuted for dtypes in seen)
    seen.clear()
    run("fp32")
    assert len(seen) == 2 and all(set(dtypes.values()) == {torch.float32} for dtypes in seen)


def _best_batch_ste(spec, net, params_a, params_b, data, *, lr: float, epoch_perms: list):
    """STE with SGD (momentum 0.9) for 4 epochs of batches of 16, selecting the best minibatch;
    ``epoch_perms`` receives the projection at the end of each epoch."""
    return ste_module.ste(
        spec,
        params_a,
        params_b,
        model=net,
        data=data,
        generator=torch.Generator().manual_seed(0),
        optimizer="sgd",
        lr=lr,
        momentum=0.9,
        epochs=4,
        batch_size=16,
        holdout=0.0,
        select="best_batch",
        monitor=lambda perm: epoch_perms.append(perm) or {},
    )


def test_ste_best_batch_needs_no_holdout_and_holdout_selection_does() -> None:
    """Minibatch losses are noisy: here the lowest is in epoch 2 of 4, so neither the last epoch nor
    its projection is returned."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    epoch_perms = []
    result = _best_batch_ste(spec, net, params_a, params_b, data, lr=50.0, epoch_perms=epoch_perms)
    curve = result.stats["curve"]
    assert all(r["heldout_loss"] is None for r in curve)
    assert result.stats["best_epoch"] == min(curve[1:], key=lambda r: r["best_batch_loss"])["epoch"] == 2
    assert not torch.equal(result.perm["P"], epoch_perms[-1]["P"])
    with pytest.raises(ValueError, match=r"^holdout must be above 0 when select is 'holdout'"):
        ste_module.ste(
            spec, params_a, params_b, model=net, data=data, generator=torch.Generator(), holdout=0.0, select="holdout"
        )


def test_ste_best_batch_returns_the_permutation_of_the_step_with_the_lowest_loss(monkeypatch) -> None:
    """Every step's projection and loss are recorded: the one returned is the lowest loss's, which here
    differs from the projection at the end of its epoch (so returning that would fail)."""
    spec, net, (params_a, params_b), data = _tiny_problem()
    steps, epoch_perms, step = [], [], ste_module.ste_step

    def recording(*args, **kwargs):
        perm, loss = step(*args, **kwargs)
        steps.append((perm, loss))
        return perm, loss

    monkeypatch.setattr(ste_module, "ste_step", recording)
    result = _best_batch_ste(spec, net, params_a, params_b, data, lr=1.0, epoch_perms=epoch_perms)
    best = min(range(len(steps)), key=lambda i: steps[i][1])  # 3 steps per epoch
    best_perm = steps[best][0]
    assert len(steps) == 12 and torch.equal(result.perm["P"], best_perm["P"])
    assert result.stats["best_epoch"] == 1 + best // 3 == 3
    assert not torch.equal(best_perm["P"], epoch_perms[result.stats["best_epoch"]]["P"])


def test_the_gradients_tool_writes_start_gradients_of_each_pair(tmp_path, trained) -> None:
    from sinkhorn_gradients import app
    from typer.testing import CliRunner

    from lmclab.archs.checkpoint import save_checkpoint

    a, b = trained(0), trained(1)
    for name, ckpt in (("a.pt", a), ("b.pt", b)):
        save_checkpoint(tmp_path / name, ckpt)
    out, pair = tmp_path / "grad.json", f"{tmp_path / 'a.pt'} {tmp_path / 'b.pt'}"
    result = CliRunner().invoke(app, ["--pair", pair, "--out", str(out), "--seed", "3"])
    assert result.exit_code == 0, result.output
    rows = {r["group"]: r for r in json.loads(out.read_text())["rows"]}
    spec = MLP.permutation_spec(a.config)
    expected = start_gradients(spec, a.state_dict, b.state_dict, generator=torch.Generator().manual_seed(3))
    assert set(rows) == set(expected) == {"P_0", "P_1"}
    for g, numbers in expected.items():
        assert {k: rows[g][k] for k in numbers} == numbers
        assert rows[g]["entries"] == sum(v.numel() for v in spec.matched(b.state_dict).values())
    bad = CliRunner().invoke(app, ["--pair", str(tmp_path / "a.pt"), "--out", str(out)])
    assert bad.exit_code != 0 and "--pair: expected two checkpoint paths 'A B'" in bad.output


def test_the_stall_message_gives_the_steps_the_largest_score_drift_and_the_lr() -> None:
    from lmclab.search.wm_sinkhorn import WMSinkhornOptions, _stall_message

    start = {"P_0": torch.zeros(2, 2), "P_1": torch.ones(3, 3)}
    scores = {"P_0": torch.tensor([[0.0, -2e-3], [0.0, 0.0]]), "P_1": torch.full((3, 3), 1.0005)}
    options = WMSinkhornOptions(iterations=7, lr=0.5)
    message = _stall_message([{"epoch": 0}, {"epoch": 3}], options, scores, start)
    assert message == (
        "wm_sinkhorn: the hard permutation never left its start in 21 Adam steps (scores moved at most 0.002): the "
        "mean DistL2 gradients are below Adam's ε for a model this size, so a step is ≈ lr·gradient/ε; no alignment "
        "was found — raise lr (it was 0.5)"
    )
    moved = _stall_message([{"epoch": 2}], WMSinkhornOptions(iterations=7, lr=0.5, init="wm"), scores, start)
    assert moved.endswith(
        "in 14 Adam steps (scores moved at most 0.002): the mean DistL2 gradients are below "
        "Adam's ε for a model this size, so a step is ≈ lr·gradient/ε; it returned weight matching's permutation "
        "— raise lr (it was 0.5)"
    )


def test_by_default_the_search_stops_ten_scores_after_its_best_and_the_steps_are_the_papers() -> None:
    """The defaults (100 × 10 steps, patience 10) follow the fixed schedule's Adam trajectory: the same
    objective at every score until the stop, ten scores after the best."""
    spec, params_a, params_b, _ = _planted(32, hidden=2, seed=9, noise=0.5)
    run = partial(wm_sinkhorn, spec, params_a, params_b)
    stopped = run(generator=torch.Generator().manual_seed(0))
    full = run(generator=torch.Generator().manual_seed(0), patience=None)
    paper = run(generator=torch.Generator().manual_seed(0), epochs=10, iterations=100, patience=None)
    curve = [r["objective"] for r in stopped.stats["curve"]]
    assert len(full.stats["curve"]) == 101 and len(curve) < 101
    assert curve == [r["objective"] for r in full.stats["curve"][: len(curve)]]
    assert stopped.stats["best_epoch"] == len(curve) - 1 - 10
    # the paper's 10 × 100 is the same trajectory, scored every hundred steps
    assert [r["objective"] for r in paper.stats["curve"]] == [r["objective"] for r in full.stats["curve"][::10]]
