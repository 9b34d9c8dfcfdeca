"""Weight matching and activation matching: planted permutations, brute force, monotonicity."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch.func import functional_call

import lmclab
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.spec import apply_permutation, identity_permutation, invert, random_permutation
from lmclab.search import SearchProblem, check_method, run_search
from lmclab.search.activation_matching import _record, activation_matching
from lmclab.search.registered import search_problem
from lmclab.search.weight_matching import (
    LocalOptimaWarning,
    group_cost,
    matching_objective,
    solve_assignment,
    weight_matching,
)


def _spec(ckpt):
    return get_arch(ckpt.arch).permutation_spec(ckpt.config)


def _planted(ckpt, seed: int = 7):
    spec = _spec(ckpt)
    perm = random_permutation(spec.group_sizes(ckpt.state_dict), torch.Generator().manual_seed(seed))
    return spec, perm, apply_permutation(spec, perm, ckpt.state_dict)


def test_wm_recovers_planted_permutation_of_trained_mlp(trained) -> None:
    ckpt = trained(0)
    spec, perm, params_b = _planted(ckpt)
    result = weight_matching(spec, ckpt.state_dict, params_b)
    for g, p in invert(perm).items():
        assert torch.equal(result.perm[g], p), g
    recovered = apply_permutation(spec, result.perm, params_b)
    assert all(torch.equal(recovered[k], v) for k, v in ckpt.state_dict.items())


@pytest.mark.parametrize("statistic", ["cross_moment", "pearson"])
def test_am_recovers_planted_permutation_of_trained_mlp(trained, splits, statistic: str) -> None:
    """Exact on every unit that is ever active; dead ReLU units (always 0) are interchangeable."""
    ckpt = trained(0)
    spec, perm, params_b = _planted(ckpt, seed=11)
    model = get_arch("mlp").Model(ckpt.config)
    points = get_arch("mlp").activation_points(ckpt.config)
    result = activation_matching(
        spec, ckpt.state_dict, params_b, model=model, points=points, data=splits["train"], statistic=statistic
    )
    x = splits["train"].x
    acts = _record(model, ckpt.state_dict, [p[0] for p in points.values()], x)
    for g, p in invert(perm).items():
        alive = acts[points[g][0]].abs().sum(0) > 0
        assert alive.sum() > len(alive) // 2
        assert torch.equal(result.perm[g][alive], p[alive]), g
    recovered = apply_permutation(spec, result.perm, params_b)
    torch.testing.assert_close(
        functional_call(model, recovered, (x,)), functional_call(model, ckpt.state_dict, (x,)), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(("point", "part"), [("lin@-1:3", slice(None)), ("lin@-1[1/2]:2", slice(6, 12))])
def test_units_in_runs_sum_each_run_s_features_in_place(point: str, part: slice) -> None:
    """``:r``: one unit per run of r features (a whole head), the cross moment S[h, h'] = Σ_j E[a_hj b_h'j]
    summed over the features j in place, every feature of a run another sample; after a part ``[i/n]``."""
    from lmclab.search.activation_matching import _Moments, _units

    a, b = torch.randn(5, 7, 12, dtype=torch.float64), torch.randn(5, 7, 12, dtype=torch.float64)
    run = int(point.split(":")[1])
    ua, ub = _units(a, point), _units(b, point)
    units = len(range(12)[part]) // run
    assert ua.shape == (35 * run, units)
    moments = _Moments()
    moments.add(ua, ub)
    ra, rb = (z[..., part].reshape(35, units, run) for z in (a, b))
    by_hand = torch.einsum("nhj,ngj->hg", ra, rb) / (35 * run)
    torch.testing.assert_close(moments.similarity("cross_moment"), by_hand, rtol=1e-12, atol=1e-12)


def _all_objectives(spec, params_a, params_b, sizes):
    groups = sorted(sizes)
    for choice in itertools.product(*(itertools.permutations(range(sizes[g])) for g in groups)):
        perm = {g: torch.tensor(c) for g, c in zip(groups, choice, strict=True)}
        yield perm, matching_objective(spec, perm, params_a, params_b)


def _random_mlp(hidden: int, width: int, seed: int) -> tuple:
    config = make_config("mlp", input_shape=(1, 2, 3), num_classes=3, hidden=hidden, width=width)
    spec = get_arch("mlp").permutation_spec(config)
    g = torch.Generator().manual_seed(seed)
    model = get_arch("mlp").Model(config)
    draw = lambda: {k: torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}  # noqa: E731
    return spec, draw(), draw()


def test_a_permuted_copy_with_biases_at_zero_is_a_relabelling() -> None:
    """Zero-initialised biases: their norm and sum are 0 in both models, which no tolerance can exceed."""
    from lmclab.search.weight_matching import is_relabelling

    spec, params_a, _ = _random_mlp(hidden=2, width=16, seed=0)
    params_a = {k: torch.zeros_like(v) if k.endswith("bias") else v for k, v in params_a.items()}
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    params_b = apply_permutation(spec, perm, params_a)
    assert is_relabelling(spec, params_a, params_b)
    found = weight_matching(spec, params_a, params_b)
    assert found.stats["first_start"] == "sorted signatures"
    assert all(torch.equal(found.perm[g], p) for g, p in invert(perm).items())


@pytest.mark.parametrize("seed", range(5))
def test_wm_equals_brute_force_for_one_group(seed: int) -> None:
    spec, params_a, params_b = _random_mlp(hidden=1, width=5, seed=seed)
    best = max(obj for _, obj in _all_objectives(spec, params_a, params_b, {"P_0": 5}))
    result = weight_matching(spec, params_a, params_b)
    assert result.stats["objective"][-1] == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_wm_is_optimal_per_group_and_below_global_for_two_groups(seed: int) -> None:
    spec, params_a, params_b = _random_mlp(hidden=2, width=4, seed=seed)
    sizes = {"P_0": 4, "P_1": 4}
    everything = list(_all_objectives(spec, params_a, params_b, sizes))
    result = weight_matching(spec, params_a, params_b)
    found = result.stats["objective"][-1]
    assert found <= max(obj for _, obj in everything) + 1e-9
    for g in sizes:  # coordinate-wise optimum: no change of one group alone improves
        others = {h: p for h, p in result.perm.items() if h != g}
        alone = [obj for perm, obj in everything if all(torch.equal(perm[h], p) for h, p in others.items())]
        assert found == pytest.approx(max(alone), rel=1e-9)


def test_wm_finds_global_optimum_of_noisy_planted_pair() -> None:
    spec, params_a, noise = _random_mlp(hidden=2, width=4, seed=5)
    perm = random_permutation({"P_0": 4, "P_1": 4}, torch.Generator().manual_seed(0))
    params_b = apply_permutation(spec, perm, {k: v + 0.1 * noise[k] for k, v in params_a.items()})
    best = max(obj for _, obj in _all_objectives(spec, params_a, params_b, {"P_0": 4, "P_1": 4}))
    assert weight_matching(spec, params_a, params_b).stats["objective"][-1] == pytest.approx(best, rel=1e-9)


def test_wm_recovers_a_planted_permutation_that_only_the_biases_reveal() -> None:
    """Every hidden unit has the same incoming and outgoing weights, so the weight terms of each
    group's cost are constant and only ⟨b^a, P b^b⟩ decides the match (distinct biases: unique optimum)."""
    spec, params, _ = _random_mlp(hidden=2, width=5, seed=0)
    tied = {
        "layers.0.weight": params["layers.0.weight"][:1].expand(5, -1),  # identical rows
        "layers.1.weight": torch.full((5, 5), 0.3),
        "out.weight": params["out.weight"][:, :1].expand(-1, 5),
    }
    params_a = {**params, **{k: v.contiguous() for k, v in tied.items()}}
    planted = {"P_0": torch.tensor([2, 0, 4, 1, 3]), "P_1": torch.tensor([4, 3, 0, 2, 1])}
    params_b = apply_permutation(spec, planted, params_a)
    result = weight_matching(spec, params_a, params_b)
    for g, p in invert(planted).items():
        assert torch.equal(result.perm[g], p), g


def test_wm_objective_never_decreases_on_a_real_pair(trained) -> None:
    a, b = trained(0), trained(1)
    result = weight_matching(_spec(a), a.state_dict, b.state_dict, tol=0.0, max_iter=50)
    obj = result.stats["objective"]
    assert len(obj) >= 3 and obj[-1] > obj[0]
    assert all(later >= earlier - 1e-9 * abs(earlier) for earlier, later in zip(obj, obj[1:], strict=False))


def _plain_wm(spec, params_a, params_b, generator, max_iter):
    """Reference loop without WM's shortcuts: every group solved every sweep, every term recomputed."""
    sizes = spec.group_sizes(params_a)
    perm, names = {g: torch.arange(n) for g, n in sizes.items()}, sorted(sizes)
    for _ in range(max_iter):
        for k in torch.randperm(len(names), generator=generator).tolist():
            perm[names[k]] = solve_assignment(group_cost(spec, names[k], perm, params_a, params_b))
    return perm


@pytest.mark.parametrize("hidden", [1, 3])
def test_wm_shortcuts_give_the_plain_loops_result_exactly(trained, hidden: int) -> None:
    a, b = trained(0, hidden=hidden), trained(1, hidden=hidden)
    result = weight_matching(
        _spec(a),
        a.state_dict,
        b.state_dict,
        tol=0.0,
        max_iter=8,
        restarts=1,
        generator=torch.Generator().manual_seed(5),
    )
    plain = _plain_wm(_spec(a), a.state_dict, b.state_dict, torch.Generator().manual_seed(5), max_iter=8)
    assert all(torch.equal(result.perm[g], plain[g]) for g in plain)
    assert result.stats["assignments"] < 8 * hidden  # skipped groups whose cost could not have changed


def test_wm_stops_at_max_iter_and_is_deterministic(trained) -> None:
    a, b = trained(0), trained(1)
    one = weight_matching(_spec(a), a.state_dict, b.state_dict, max_iter=1, tol=0.0)
    assert one.stats["sweeps"] == 1
    r1 = weight_matching(_spec(a), a.state_dict, b.state_dict, generator=torch.Generator().manual_seed(3))
    r2 = weight_matching(_spec(a), a.state_dict, b.state_dict, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(r1.perm[g], r2.perm[g]) for g in r1.perm)


def test_wm_stops_at_the_first_sweep_that_improves_nothing() -> None:
    spec, params_a, noise = _random_mlp(hidden=2, width=4, seed=5)
    perm = random_permutation({"P_0": 4, "P_1": 4}, torch.Generator().manual_seed(0))
    params_b = apply_permutation(spec, perm, {k: v + 0.1 * noise[k] for k, v in params_a.items()})
    obj = weight_matching(spec, params_a, params_b, tol=0.0, max_iter=50).stats["objective"]
    assert len(obj) - 1 < 50 and obj[-1] == obj[-2]
    # every earlier sweep improved
    assert all(later > earlier for earlier, later in zip(obj[:-2], obj[1:-1], strict=True))
    with pytest.raises(ValueError, match=r"^tol must be a non-negative number, got -0.001$"):
        weight_matching(spec, params_a, params_b, tol=-1e-3)


def test_wm_s_tolerance_is_relative_so_scaling_both_models_changes_nothing() -> None:
    """The stop (a sweep gaining ≤ tol of the objective) reads no unit: θa and θb scaled by 10³ or 10⁻³ take the
    same sweeps to the same permutation."""
    spec, params_a, params_b = _random_mlp(hidden=2, width=16, seed=0)
    found = []
    for scale in (1.0, 1e-3, 1e3):
        scaled = ({k: scale * v for k, v in p.items()} for p in (params_a, params_b))
        found.append(weight_matching(spec, *scaled, generator=torch.Generator().manual_seed(0)))
    assert [r.stats["sweeps"] for r in found] == [4, 4, 4]
    assert all(torch.equal(r.perm[g], p) for r in found[1:] for g, p in found[0].perm.items())


def test_run_search_dispatch_and_option_errors(trained, splits) -> None:
    a, b = trained(0), trained(1)
    problem = search_problem(
        "mlp", a.config, a.state_dict, b.state_dict, device=torch.device("cpu"), train=splits["train"]
    )
    ident = run_search("identity", problem, seed=0)
    assert all(torch.equal(p, torch.arange(len(p))) for p in ident.perm.values())
    wm = run_search("wm", problem, seed=0, options={"max_iter": 5})
    assert wm.stats["sweeps"] <= 5 and wm.stats["seconds"] >= 0
    with pytest.raises(ValueError, match=r"^method: unknown method 'nope'"):
        check_method("nope")
    with pytest.raises(ValueError, match=r"^options: unknown option\(s\) \['iters'\]"):
        check_method("wm", {"iters": 3})
    with pytest.raises(ValueError, match=r"^max_iter must be a positive integer, got 0$"):
        run_search("wm", problem, seed=0, options={"max_iter": 0})
    with pytest.raises(ValueError, match=r"^statistic must be one of \['cross_moment', 'pearson'\], got 'cosine'$"):
        run_search("am", problem, seed=0, options={"statistic": "cosine"})


def test_run_search_needs_no_architecture_registry(trained, splits) -> None:
    """A hand-built problem (spec, parameters, skeleton, points) is all a search sees."""
    a, b = trained(0), trained(1)
    spec, (_, perm, params_b) = _spec(a), _planted(a, seed=3)
    problem = SearchProblem(
        spec,
        a.state_dict,
        params_b,
        model=get_arch("mlp").Model(a.config),
        points=get_arch("mlp").activation_points(a.config),
        train=splits["train"],
    )
    found = run_search("wm", problem, seed=0).perm
    assert all(torch.equal(found[g], p) for g, p in invert(perm).items())
    am = activation_matching(
        spec, a.state_dict, params_b, model=problem.model, points=problem.points, data=splits["train"]
    ).perm
    assert all(torch.equal(run_search("am", problem, seed=0).perm[g], p) for g, p in am.items())
    with pytest.raises(ValueError, match=r"^SearchProblem.points: activation_matching needs it, got None$"):
        run_search(
            "am", SearchProblem(spec, a.state_dict, b.state_dict, model=problem.model, train=splits["train"]), seed=0
        )


# ---- restarts: the sorted-signature start and keeping the best of several starts --------------------------


def _planted_mlp(seed: int, widths: tuple[int, ...] = (6, 7, 5)) -> tuple:
    config = make_config("mlp", input_shape=(1, 3, 3), num_classes=4, hidden=len(widths), width=widths[0])
    spec = get_arch("mlp").permutation_spec(config)
    gen = torch.Generator().manual_seed(seed)
    params_a = {
        "layers.0.weight": torch.randn(6, 9, generator=gen, dtype=torch.float64),
        "layers.0.bias": torch.randn(6, generator=gen, dtype=torch.float64),
        "layers.1.weight": torch.randn(6, 6, generator=gen, dtype=torch.float64),
        "layers.1.bias": torch.randn(6, generator=gen, dtype=torch.float64),
        "layers.2.weight": torch.randn(6, 6, generator=gen, dtype=torch.float64),
        "layers.2.bias": torch.randn(6, generator=gen, dtype=torch.float64),
        "out.weight": torch.randn(4, 6, generator=gen, dtype=torch.float64),
        "out.bias": torch.randn(4, generator=gen, dtype=torch.float64),
    }
    perm = random_permutation(spec.group_sizes(params_a), gen)
    return spec, params_a, apply_permutation(spec, perm, params_a), invert(perm)


@pytest.mark.parametrize("seed", range(4))
def test_the_sorted_signature_start_is_the_planted_permutation_of_every_group_at_once(seed: int) -> None:
    """Each group solved alone on sorted slices, blind to the other groups: exactly π⁻¹ on a permuted copy."""
    from functools import partial

    from lmclab.search.weight_matching import sorted_signature_start

    spec, params_a, params_b, truth = _planted_mlp(seed)
    start = sorted_signature_start(spec, params_a, params_b, partial(solve_assignment, backend="scipy"))
    assert all(torch.equal(start[g], truth[g]) for g in truth)
    unrelated = {k: torch.randn_like(v) for k, v in params_b.items()}  # a negative control: nothing to find
    start = sorted_signature_start(spec, params_a, unrelated, partial(solve_assignment, backend="scipy"))
    assert not all(torch.equal(start[g], truth[g]) for g in truth)


def test_restarts_keep_the_highest_objective_and_warn_when_starts_disagree() -> None:
    spec, params_a, params_b = _random_mlp(hidden=3, width=32, seed=5)  # two unrelated models
    with pytest.warns(LocalOptimaWarning) as warned:
        found = weight_matching(spec, params_a, params_b, restarts=6, generator=torch.Generator().manual_seed(0))
    finals = found.stats["restart_objectives"]
    assert [str(w.message) for w in warned] == [
        f"weight matching: its 6 starts ended at different ⟨θa, π(θb)⟩ ({min(finals):.6g} to {max(finals):.6g}); "
        "coordinate descent stops in local optima on this pair, the highest is kept"
    ]
    caller = (__file__, "mutmut/mutation/trampoline.py")  # (mutmut's trampoline is the caller of a mutated function)
    assert warned[0].filename.endswith(caller)  # reported at the caller's line
    with pytest.warns(LocalOptimaWarning) as warned:  # many calls down in lmclab: still the caller's line
        lmclab.find_permutation(params_a, params_b, spec=spec, options={"restarts": 6})
    assert warned[0].filename.endswith(caller)
    assert len(finals) == 6 and len(set(finals)) > 1
    assert found.stats["objective"][-1] == max(finals) == finals[found.stats["kept_start"]]
    assert matching_objective(spec, found.perm, params_a, params_b) == pytest.approx(max(finals), rel=1e-12)
    one = weight_matching(spec, params_a, params_b, restarts=1, generator=torch.Generator().manual_seed(0))
    assert one.stats["restart_objectives"] == finals[:1]  # the first start is the plain identity start


def _starts(monkeypatch, spec, params_a, params_b, restarts: int) -> list[dict]:
    """The permutation each of weight matching's starts descends from, in order."""
    from lmclab.search import weight_matching as module

    seen, descend = [], module._descend
    monkeypatch.setattr(
        module, "_descend", lambda spec, a, b, init, *rest: seen.append(init) or descend(spec, a, b, init, *rest)
    )
    with warnings.catch_warnings():  # whether the starts end apart is not the question here
        warnings.simplefilter("ignore", LocalOptimaWarning)
        weight_matching(spec, params_a, params_b, restarts=restarts, generator=torch.Generator().manual_seed(0))
    return seen


def test_the_starts_are_the_identity_then_the_sorted_signatures_then_random(monkeypatch) -> None:
    """Module docstring: the identity first and the sorted signatures second on unrelated models, the other
    way round on a relabelling; random permutations only from the third start on."""
    from functools import partial

    from lmclab.search.weight_matching import sorted_signature_start

    same = lambda p, q: p.keys() == q.keys() and all(torch.equal(p[g], q[g]) for g in p)  # noqa: E731
    for planted in (False, True):
        if planted:
            spec, params_a, params_b, _ = _planted_mlp(seed=0)
        else:
            spec, params_a, params_b = _random_mlp(hidden=3, width=16, seed=5)
        identity = identity_permutation(spec.group_sizes(params_a))
        signature = sorted_signature_start(spec, params_a, params_b, partial(solve_assignment, backend="scipy"))
        assert not same(identity, signature)
        starts = _starts(monkeypatch, spec, params_a, params_b, restarts=3)
        assert len(starts) == 3
        first, second = (signature, identity) if planted else (identity, signature)
        assert same(starts[0], first) and same(starts[1], second), planted
        assert not same(starts[2], identity) and not same(starts[2], signature)


@pytest.mark.slow
def test_the_default_recovers_a_planted_mobilenet_where_the_identity_start_stops_short() -> None:
    """torchvision's MobileNetV3 (width ×¼, float64): coordinate descent from the identity ends in a local
    optimum on every one of three planted copies; the default starts from the sorted signatures there (a
    relabelled copy) and is exact, as are two starts."""
    import torchvision

    from lmclab.trace import trace

    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v3_small(width_mult=0.25, num_classes=10).double().eval()
    spec = trace(net, torch.randn(2, 3, 32, 32, dtype=torch.float64)).spec
    params_a = net.state_dict()
    for seed in range(3):
        perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(seed))
        params_b = apply_permutation(spec, perm, params_a)
        plain = weight_matching(spec, params_a, params_b, init_perm=identity_permutation(spec.group_sizes(params_a)))
        assert not all(torch.equal(plain.perm[g], invert(perm)[g]) for g in perm)
        assert plain.stats["first_start"] == "init_perm"
        found = weight_matching(spec, params_a, params_b)
        assert found.stats["first_start"] == "sorted signatures"
        assert all(torch.equal(found.perm[g], invert(perm)[g]) for g in perm)
        with pytest.warns(LocalOptimaWarning):  # the identity, second, ends lower
            both = weight_matching(spec, params_a, params_b, restarts=2)
        assert all(torch.equal(both.perm[g], invert(perm)[g]) for g in perm) and both.stats["kept_start"] == 0


def test_the_sorted_signature_start_reads_past_the_batchnorm_statistics_of_a_group() -> None:
    """A BN net's group lists the running statistics (no signature) before the next layer's input
    columns: skipping them must not end the group's cost. The first conv's units are made identical, so
    only the next conv's columns tell them apart (a VGG with BN, a permuted copy)."""
    from functools import partial

    from lmclab.search.weight_matching import sorted_signature_start

    config = make_config("vgg", input_shape=(3, 32, 32), num_classes=10, width_multiplier=0.25)
    spec = get_arch("vgg").permutation_spec(config)
    gen = torch.Generator().manual_seed(3)
    params_a = {
        k: (torch.randn(v.shape, generator=gen, dtype=torch.float64) if v.is_floating_point() else v)
        for k, v in build_model("vgg", config, seed=0).state_dict().items()
    }
    entries = [name for name, _ in spec.groups["P_0"]]
    assert entries.index("features.1.running_mean") < entries.index("features.4.weight")
    for name in ("features.0.weight", "features.1.weight", "features.1.bias"):
        params_a[name] = params_a[name][:1].expand_as(params_a[name]).clone()  # every unit alike
    perm = random_permutation(spec.group_sizes(params_a), gen)
    params_b = apply_permutation(spec, perm, params_a)
    start = sorted_signature_start(spec, params_a, params_b, partial(solve_assignment, backend="scipy"))
    assert torch.equal(start["P_0"], invert(perm)["P_0"])


def test_a_long_rows_signature_is_its_evenly_spaced_order_statistics_scaled_to_the_full_row() -> None:
    from lmclab.search.weight_matching import SIGNATURE, _signatures

    length = 3 * SIGNATURE + 7  # past the bound: subsampled
    ones = torch.ones(2, length)
    (sig_a, scale), (sig_b, _) = _signatures(ones, 0, (0, 2, 1, 1, 1)), _signatures(2 * ones, 0, (0, 2, 1, 1, 1))
    assert sig_a.shape == (2, SIGNATURE) and scale == length / SIGNATURE
    assert torch.allclose(scale * sig_a @ sig_b.T, torch.full((2, 2), 2.0 * length))  # ⟨1, 2⟩ over the full row
    rows = torch.randn(3, length, generator=torch.Generator().manual_seed(0))
    sig, _ = _signatures(rows, 0, (0, 3, 1, 1, 1))
    ordered = rows.sort(dim=1).values
    assert torch.equal(sig[:, 0], ordered[:, 0]) and torch.equal(sig[:, -1], ordered[:, -1])  # both ends kept
    assert (sig[:, 1:] >= sig[:, :-1]).all()
    exact = rows[:, :SIGNATURE]  # at the bound: the full sorted rows, unscaled
    sig, scale = _signatures(exact, 0, (0, 3, 1, 1, 1))
    assert scale == 1.0 and torch.equal(sig, exact.sort(dim=1).values)


def test_signatures_sorted_a_few_units_at_a_time_are_those_of_all_units_at_once(monkeypatch) -> None:
    """Units of blocks of 2 on axis 1 of a (5, 12) tensor, in chunks of one or two units (a slice of 12 or 20
    entries): the same signatures as in one piece; units in two interleaved copies are sorted at once."""
    import lmclab.search.weight_matching as wm

    value = torch.randn(5, 12, generator=torch.Generator().manual_seed(1))
    whole = wm._signatures(value, 1, (2, 8, 2, 1, 1))[0]
    assert whole.shape == (4, 10)
    for slice_size in (10, 20):
        monkeypatch.setattr(wm, "SLICE", slice_size)
        assert torch.equal(wm._signatures(value, 1, (2, 8, 2, 1, 1))[0], whole)
    copies = wm._signatures(value, 1, (0, 12, 1, 2, 1))[0]
    assert torch.equal(copies, wm.unit_rows(value, 1, 0, 12, 1, 2, 1).sort(dim=1).values) and copies.shape == (6, 10)


def test_the_sorted_signature_start_recovers_a_planted_copy_from_subsampled_signatures() -> None:
    """Layer 0's rows (2,500 inputs) and P_0's are longer than SIGNATURE: the start still is π⁻¹."""
    from functools import partial

    from lmclab.search.weight_matching import sorted_signature_start

    config = make_config("mlp", input_shape=(1, 50, 50), num_classes=3, hidden=2, width=6)
    spec = get_arch("mlp").permutation_spec(config)
    gen = torch.Generator().manual_seed(0)
    params_a = {k: torch.randn(v.shape, generator=gen) for k, v in get_arch("mlp").Model(config).state_dict().items()}
    perm = random_permutation(spec.group_sizes(params_a), gen)
    start = sorted_signature_start(
        spec, params_a, apply_permutation(spec, perm, params_a), partial(solve_assignment, backend="lapx")
    )
    assert all(torch.equal(start[g], p) for g, p in invert(perm).items())


def _other_values(params: dict, keep: str) -> dict:
    """``params`` in float64 with ``layers.1.weight``'s values changed, its largest kept: two inner values moved
    apart by as much (``spread``: the sum kept, not the norm), or its smallest raised and two inner values moved
    to keep both its sum and its norm (``least``)."""
    out = {k: v.double() for k, v in params.items()}
    w = out["layers.1.weight"].view(-1)
    order = w.argsort()
    low, u, v = order[0], order[len(w) // 2], order[len(w) // 2 + 1]
    if keep == "spread":
        w[u], w[v] = w[u] - 0.01, w[v] + 0.01
        return out
    m = w[low] + 0.01 * (w[order[1]] - w[low])  # still the smallest value, but another one
    total, squares = w[low] + w[u] + w[v] - m, w[low] ** 2 + w[u] ** 2 + w[v] ** 2 - m**2
    half = ((squares - total**2 / 2) / 2).sqrt()
    w[low], w[u], w[v] = m, total / 2 - half, total / 2 + half
    return out


def test_a_relabelling_is_told_from_a_copy_changed_in_one_value() -> None:
    from lmclab.search.weight_matching import is_relabelling

    spec, params_a, _ = _random_mlp(hidden=2, width=16, seed=0)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    params_b = apply_permutation(spec, perm, params_a)
    assert is_relabelling(spec, params_a, params_b) and is_relabelling(spec, params_a, params_a)
    for change in (1e-6, -1e-6):  # one inner value, off by a millionth: same extremes, other sums
        nudged = {k: v.clone() for k, v in params_b.items()}
        w = nudged["layers.1.weight"]
        inner = (w != w.max()) & (w != w.min())
        w[inner.nonzero()[0].tolist()[0], inner.nonzero()[0].tolist()[1]] *= 1 + change
        assert not is_relabelling(spec, params_a, nudged)
    swapped = {**params_b, "layers.1.bias": params_b["layers.1.bias"].clone()}
    swapped["layers.1.bias"][0] = params_b["layers.1.bias"].max() + 1  # a new largest value
    assert not is_relabelling(spec, params_a, swapped)
    assert not is_relabelling(spec, params_a, _random_mlp(hidden=2, width=16, seed=1)[1])
    assert not is_relabelling(spec, params_a, _other_values(params_b, "spread"))  # same sum, another norm
    assert not is_relabelling(spec, params_a, _other_values(params_b, "least"))  # same sums, another smallest value
    found = weight_matching(spec, params_a, params_b)
    assert found.stats["first_start"] == "sorted signatures"
    assert all(torch.equal(found.perm[g], p) for g, p in invert(perm).items())
    assert (
        weight_matching(spec, params_a, _random_mlp(hidden=2, width=16, seed=1)[1]).stats["first_start"] == "identity"
    )
