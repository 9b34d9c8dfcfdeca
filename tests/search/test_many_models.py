"""The n-model methods: MergeMany, star, sync and C2M3's Frank–Wolfe map N models into one
universe. Planted copies are recovered exactly (every pairwise map, the optimum of the shared
objective), with and without noise; brute force on three tiny MLPs bounds every method's objective
and is reached on planted cases; maps from one universe have cycle error 0 while independent pairwise
WM does not; the objective identity holds in float64; Frank–Wolfe keeps doubly-stochastic iterates and
never lowers the objective; the line search and the synchronisation have closed forms."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.options import Options, takes
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.search.c2m3 import INITS, _fit, _maximum, _moved, _start, c2m3, frank_wolfe_step, relaxed_objective
from lmclab.search.many_methods import MANY_METHODS, run_many
from lmclab.search.merge_many import merge_many
from lmclab.search.star import star
from lmclab.search.sync import sync, synchronise
from lmclab.search.universe import cycle_error, pairwise_maps, shared_objective, summed_distance, universe_result
from lmclab.search.weight_matching import weight_matching

METHODS = {
    "merge_many": lambda spec, params: merge_many(spec, params),
    "star": lambda spec, params: star(spec, params),
    "sync": lambda spec, params: sync(spec, params),
    "c2m3": lambda spec, params: c2m3(spec, params),  # init: sinkhorn_barycenter
    "c2m3-merge_many": lambda spec, params: c2m3(spec, params, init="merge_many"),
}


def mlp(width: int, seed: int = 0, hidden: int = 2):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=hidden, width=width)
    torch.manual_seed(seed)
    model = build_model("mlp", config)
    return get_arch("mlp").permutation_spec(config), model.state_dict()


def planted(width: int, n: int, noise: float = 0.0, seed: int = 1, hidden: int = 2):
    """``n`` copies of one random MLP, copy i permuted by ``truth[i]`` (copy 0 not), plus noise."""
    spec, base = mlp(width, hidden=hidden)
    sizes, gen = spec.group_sizes(base), torch.Generator().manual_seed(seed)
    truth = [{g: torch.arange(k) for g, k in sizes.items()}] + [random_permutation(sizes, gen) for _ in range(n - 1)]
    params = [apply_permutation(spec, t, base) for t in truth]
    params = [{k: v + noise * v.std() * torch.randn(v.shape, generator=gen) for k, v in p.items()} for p in params]
    return spec, params, truth


def recovered(perms, truth) -> bool:
    """Every pairwise map equals the planted one: model j into frame i is truth_i⁻¹ then truth_j."""
    maps = pairwise_maps(perms)
    return all(
        torch.equal(maps[(i, j)][g], truth[j][g].argsort()[truth[i][g]])
        for i, j in itertools.permutations(range(len(truth)), 2)
        for g in truth[0]
    )


@pytest.mark.parametrize("noise", [0.0, 0.3])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_recovers_planted_copies_and_their_optimum(method, noise):
    spec, params, truth = planted(32, 4, noise)
    result = METHODS[method](spec, params)
    assert recovered(result.perms, truth)
    best = shared_objective(
        spec,
        [
            apply_permutation(spec, {g: t.argsort() for g, t in tr.items()}, p)
            for tr, p in zip(truth, params, strict=True)
        ],
    )
    assert result.stats["objective_final"] == pytest.approx(best, rel=1e-12)
    assert cycle_error(pairwise_maps(result.perms), 4) == 0.0


def test_frank_wolfe_from_the_identity_can_stop_at_a_vertex_below_the_planted_optimum():
    """Why the identity is not C2M3's default start: on these noisy copies it reaches a vertex (gap 0,
    a stationary point) whose objective is below the planted one, which the default start reaches."""
    spec, params, truth = planted(32, 4, 0.3)
    stuck, default = c2m3(spec, params, init="identity"), c2m3(spec, params)
    assert stuck.stats["gap"][-1] == 0.0 and recovered(default.perms, truth)
    assert stuck.stats["objective_final"] < default.stats["objective_final"] - 1.0


def test_the_shared_objective_is_mergemany_distance_rewritten():
    spec, params, _ = planted(16, 5, noise=1.0)
    params = [{k: v.double() for k, v in p.items()} for p in params]
    n, norms = len(params), sum(float(v.pow(2).sum()) for p in params for v in spec.matched(p).values())
    pairs = sum(float(sum((a[k] * b[k]).sum() for k in spec.matched(a))) for a, b in itertools.combinations(params, 2))
    assert shared_objective(spec, params) == pytest.approx(pairs, rel=1e-12)
    assert ((n - 1) * norms - n * summed_distance(spec, params)) / 2 == pytest.approx(pairs, rel=1e-12)


def brute_force(spec, params) -> float:
    """The best shared objective over every permutation of models 1 and 2 (model 0 fixes the universe)."""
    sizes = spec.group_sizes(params[0])
    choices = [
        dict(zip(sizes, ps, strict=True))
        for ps in itertools.product(*(itertools.permutations(range(k)) for k in sizes.values()))
    ]
    choices = [{g: torch.tensor(p) for g, p in c.items()} for c in choices]
    best = -math.inf
    for p1, p2 in itertools.product(choices, repeat=2):
        aligned = [params[0], apply_permutation(spec, p1, params[1]), apply_permutation(spec, p2, params[2])]
        best = max(best, shared_objective(spec, aligned))
    return best


@pytest.mark.parametrize("width,hidden", [(3, 2), (4, 1)])
def test_no_method_beats_brute_force_and_each_reaches_it_when_planted(width, hidden):
    unrelated = [mlp(width, seed=s, hidden=hidden)[1] for s in range(3)]
    spec, copies, _ = planted(width, 3, noise=0.05, hidden=hidden)
    for params, planted_case in ((unrelated, False), (copies, True)):
        optimum = brute_force(spec, params)
        for name, method in METHODS.items():
            found = method(spec, params).stats["objective_final"]
            assert found <= optimum + 1e-9 * abs(optimum), name
            if planted_case:
                assert found == pytest.approx(optimum, rel=1e-12), name
        assert c2m3(spec, params, init="identity").stats["objective_final"] <= optimum + 1e-9 * abs(optimum)


def test_independent_pairwise_wm_is_not_cycle_consistent_but_universe_maps_are():
    spec = mlp(16)[0]
    params = [mlp(16, seed=s)[1] for s in range(4)]  # unrelated random models: matchings disagree
    direct = {(i, j): weight_matching(spec, params[i], params[j]).perm for i, j in itertools.permutations(range(4), 2)}
    assert cycle_error(direct, 4) > 0.5
    for found in (merge_many(spec, params), sync(spec, params), c2m3(spec, params, max_iter=10)):
        assert cycle_error(pairwise_maps(found.perms), 4) == 0.0
    with pytest.raises(ValueError, match="^n_models: a cycle needs at least 3 models, got 2"):
        cycle_error(direct, 2)


@pytest.mark.parametrize("init", INITS)
def test_frank_wolfe_iterates_stay_doubly_stochastic_and_never_lower_the_objective(init):
    spec, params, _ = planted(16, 3, noise=2.0)
    matched = [{k: v.double() for k, v in spec.matched(p).items()} for p in params]
    soft = _start(spec, params, spec.group_sizes(params[0]), init, torch.Generator().manual_seed(0))
    values = [float(relaxed_objective(spec, soft, matched))]
    for _ in range(8):
        gap, t, direction, value = frank_wolfe_step(spec, soft, matched, degree=4, current=values[-1])
        assert gap >= -1e-9 and 0.0 <= t <= 1.0
        soft = _moved(soft, direction, t)
        values.append(float(relaxed_objective(spec, soft, matched)))
        assert value == pytest.approx(values[-1], rel=1e-10)  # the step's F is the iterate's
        for matrix in (m for s in soft for m in s.values()):
            ones = torch.ones(len(matrix), dtype=matrix.dtype)
            assert matrix.min() >= -1e-12
            assert torch.allclose(matrix.sum(0), ones, atol=1e-12) and torch.allclose(matrix.sum(1), ones, atol=1e-12)
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(values, values[1:], strict=False))
    result = c2m3(spec, params, init=init)
    trace = result.stats["objective"]
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(trace, trace[1:], strict=False))


def test_the_relaxed_objective_is_the_sum_of_the_models_pairwise_inner_products():
    spec, params, _ = planted(4, 3, noise=1.0)
    matched = [{k: v.double() for k, v in spec.matched(p).items()} for p in params]
    soft = _start(spec, params, spec.group_sizes(params[0]), "identity", torch.Generator().manual_seed(0))
    pairs = sum(sum((p[k] * q[k]).sum() for k in p) for p, q in itertools.combinations(matched, 2))
    assert float(relaxed_objective(spec, soft, matched)) == pytest.approx(float(pairs), rel=1e-12)
    assert c2m3(spec, params, init="identity", max_iter=1).stats["objective"][0] == pytest.approx(float(pairs))


class _Untimed(Options):
    """No options."""


@takes(_Untimed)
def _untimed(spec, params, *, options):
    """Every model left where it is, with no ``seconds`` in its stats."""
    return universe_result(spec, [{g: torch.arange(n) for g, n in spec.group_sizes(params[0]).items()}] * 2, params, {})


def test_run_many_times_a_registered_method_that_reports_no_seconds_of_its_own(monkeypatch):
    spec, params, _ = planted(4, 2)
    ticks = []
    monkeypatch.setattr(time, "perf_counter", lambda: ticks.append(None) or 2.5 * len(ticks))
    monkeypatch.setitem(MANY_METHODS, "untimed", _untimed)
    result = run_many("untimed", spec, params, seed=0)
    assert result.stats["seconds"] == 2.5 and len(ticks) == 2  # read before and after the method, once each


def test_the_relaxed_objective_of_one_model_is_zero():
    """``F = Σ_{i<j} ⟨P_i(θ_i), P_j(θ_j)⟩`` has no pair to sum with one model."""
    spec, params, _ = planted(4, 1)
    matched = [{k: v.double() for k, v in spec.matched(p).items()} for p in params]
    soft = _start(spec, params, spec.group_sizes(params[0]), "identity", torch.Generator().manual_seed(0))
    assert float(relaxed_objective(spec, soft, matched)) == 0.0


def test_a_frank_wolfe_step_keeps_the_iterates_dtype_whatever_torch_s_default():
    spec, params, _ = planted(4, 3, noise=1.0)
    matched = [{k: v.float() for k, v in spec.matched(p).items()} for p in params]
    soft = _start(spec, params, spec.group_sizes(params[0]), "identity", torch.Generator().manual_seed(0))
    soft = [{g: m.float() for g, m in s.items()} for s in soft]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, _, direction, _ = frank_wolfe_step(spec, soft, matched, degree=4)
    finally:
        torch.set_default_dtype(default)
    assert {m.dtype for d in direction for m in d.values()} == {torch.float32}


def test_the_line_search_finds_the_maximum_of_a_polynomial():
    def line_search(objective, degree):  # as frank_wolfe_step searches along its segment
        return _maximum(_fit(objective, degree))[0]

    assert line_search(lambda t: -((t - 0.3) ** 2), 2) == pytest.approx(0.3, abs=1e-12)
    assert line_search(lambda t: (t - 0.2) * (t - 0.5) * (t - 0.9) * t, 4) == pytest.approx(
        max((t for t in torch.linspace(0, 1, 100001).tolist()), key=lambda t: (t - 0.2) * (t - 0.5) * (t - 0.9) * t),
        abs=1e-4,
    )
    assert line_search(lambda t: t**4, 4) == 1.0 and line_search(lambda t: -t, 4) == 0.0


def test_the_line_search_of_a_line_or_a_constant_takes_an_end():
    """Degree 1 or 0: no critical point inside [0, 1]; the higher end, or t = 0 when both ends are equal."""
    assert _maximum(_fit(lambda t: 3.0 - 2.0 * t, 1)) == (0.0, pytest.approx(3.0))
    assert _maximum(_fit(lambda t: 0.5 + t, 1)) == (1.0, pytest.approx(1.5))
    assert _maximum(_fit(lambda t: 2.0, 0)) == (0.0, pytest.approx(2.0))


def test_synchronisation_of_consistent_maps_returns_them():
    size, gen = 6, torch.Generator().manual_seed(0)
    universe = [torch.arange(size)] + [torch.randperm(size, generator=gen) for _ in range(3)]
    maps = pairwise_maps([{"g": u} for u in universe])
    scores = synchronise({(i, j): maps[(i, j)]["g"] for i, j in itertools.combinations(range(4), 2)}, 4, size)
    for i, s in enumerate(scores):
        assert torch.equal(s.argmax(1), universe[i])


def test_each_c2m3_start_is_what_its_name_says():
    """identity: every model at I; merge_many: the one-hot matrices of MergeMany's permutations; the
    Sinkhorn barycenter: model 0 at I, the others at a doubly stochastic matrix within 1e-3 of uniform."""
    from lmclab.search.merge_many import merge_many

    spec, params, _ = planted(8, 3, noise=0.5)
    sizes = spec.group_sizes(params[0])
    found = merge_many(spec, params, generator=torch.Generator().manual_seed(1)).perms
    starts = {init: _start(spec, params, sizes, init, torch.Generator().manual_seed(1)) for init in INITS}
    eye = {g: torch.eye(n, dtype=torch.float64) for g, n in sizes.items()}
    assert all(torch.equal(s[g], eye[g]) for s in starts["identity"] for g in sizes)
    assert all(torch.equal(s[g], eye[g][p[g]]) for s, p in zip(starts["merge_many"], found, strict=True) for g in sizes)
    bary = starts["sinkhorn_barycenter"]
    assert all(torch.equal(bary[0][g], eye[g]) for g in sizes)
    for g, n in sizes.items():
        assert 0 < (bary[1][g] - 1 / n).abs().max() < 1e-3 and torch.equal(bary[1][g], bary[2][g])


def _unrelated(n: int = 3):
    """``n`` unrelated random MLPs on 4×4 inputs: 3 hidden layers of 6 units."""
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=3, width=6)
    params = [build_model("mlp", config, seed=s).state_dict() for s in range(n)]
    return get_arch("mlp").permutation_spec(config), params


def test_star_and_sync_run_one_capped_weight_matching_per_pair_on_the_callers_generator():
    spec, params = _unrelated()
    groups = len(spec.groups)
    for method, pairs in ((star, [(0, 1), (0, 2)]), (sync, list(itertools.combinations(range(3), 2)))):
        ours, by_hand = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        found = method(spec, params, wm_max_iter=1, generator=ours)
        wm = [weight_matching(spec, params[i], params[j], max_iter=1, generator=by_hand) for i, j in pairs]
        assert torch.equal(ours.get_state(), by_hand.get_state())
        assert all(r.stats["assignments"] == groups for r in wm)  # one sweep: every group solved once
        rounding = 3 * groups if method is sync else 0
        assert found.stats["assignments"] == len(pairs) * groups + rounding
        if method is star:
            assert all(torch.equal(p[g], r.perm[g]) for p, r in zip(found.perms[1:], wm, strict=True) for g in p)
        else:
            assert found.stats["pairs"] == 3
    assert star(spec, params).stats["assignments"] > 2 * groups  # the default cap lets the descents sweep again


def test_merge_many_passes_stop_at_max_iter_or_when_a_pass_gains_no_more_than_tol():
    spec, params = _unrelated()
    groups = len(spec.groups)
    once = merge_many(spec, params, max_iter=1, wm_max_iter=1)
    assert once.stats["iterations"] == 1 and len(once.stats["distance"]) == 2
    assert once.stats["assignments"] == 3 * groups  # each model's descent: one sweep, every group solved once
    settled = merge_many(spec, params, tol=0.0)
    distance = settled.stats["distance"]
    assert 1 < settled.stats["iterations"] < 20 and distance[-1] == distance[-2]  # a pass that gained nothing
    assert all(b < a for a, b in zip(distance[:-2], distance[1:-1], strict=True))
    assert merge_many(spec, params, tol=1.0).stats["iterations"] == 1  # any first pass gains at most 100 %


def test_c2m3_iterations_stop_at_max_iter_or_a_gap_within_tol_and_count_their_assignments():
    spec, params = _unrelated()
    groups = len(spec.groups)
    capped = c2m3(spec, params, max_iter=2)
    assert capped.stats["iterations"] == 2 and len(capped.stats["gap"]) == 2
    assert capped.stats["assignments"] == 3 * groups * (2 + 1)  # a linear step per model and iteration, the rounding
    fraction = capped.stats["gap"][0] / abs(capped.stats["objective"][0])  # the first gap over F at the start
    loose = c2m3(spec, params, tol=1.01 * fraction, max_iter=2)
    assert loose.stats["iterations"] == 1 and loose.stats["step"] == [] and len(loose.stats["objective"]) == 1
    assert c2m3(spec, params, tol=0.99 * fraction, max_iter=2).stats["iterations"] == 2
    assert (
        loose.stats["init"] == "sinkhorn_barycenter"
        and c2m3(spec, params, init="identity", max_iter=1).stats["init"] == "identity"
    )
