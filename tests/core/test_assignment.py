"""The linear assignment solvers: every backend reaches the brute-force optimum for n ≤ 7
(square and rectangular) and scipy's optimal value on random, tie-heavy and rectangular matrices; every
method that solves assignments takes ``lap_backend``, solves all of them with it (a spy on both
solvers), records it in its stats and gives the same permutation with either backend on a planted
case; a bad or missing backend is one line naming ``lap_backend``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import random_params
from test_heads import _vit

import lmclab.core.assignment as assignment
from lmclab.archs import get_arch, make_config
from lmclab.core.assignment import BACKENDS, resolve_backend, solve_assignment
from lmclab.core.data import Split
from lmclab.core.options import OptionError
from lmclab.core.spec import apply_permutation, invert, random_permutation
from lmclab.search import METHODS, check_method, run_search
from lmclab.search.many_methods import MANY_METHODS, check_many, run_many
from lmclab.search.registered import search_problem
from lmclab.search.sinkhorn import hard_permutation, init_scores, scores_at
from lmclab.search.universe import pairwise_maps
from lmclab.search.weight_matching import matching_objective, weight_matching

# every pair method that solves assignments: those whose options choose the solver
PAIR_METHODS = tuple(m for m in METHODS if "lap_backend" in METHODS[m].options.model_fields)
MANY = ("merge_many", "c2m3", "sync", "star")  # every n-model method that does
QUICK = {  # enough for a planted MLP, in a fraction of a second
    "ste": {"epochs": 1, "batch_size": 100},
    "wm_sinkhorn": {"epochs": 2, "iterations": 5},
    "ste_sinkhorn": {"epochs": 1, "batch_size": 100, "init": "wm"},
    "c2m3": {"max_iter": 20},
}


def _value(cost: np.ndarray, p: torch.Tensor) -> float:
    return float(cost[np.arange(len(p)), p.numpy()].sum())


def _brute_force(cost: np.ndarray) -> float:
    """``max_p Σ_i cost[i, p[i]]`` over every injection of the rows into the columns."""
    n, m = cost.shape
    choices = np.array(list(itertools.permutations(range(m), n)), dtype=np.int64).reshape(-1, n)
    return float(cost[np.arange(n), choices].sum(1).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", range(1, 8))
def test_every_backend_reaches_the_brute_force_optimum(backend, n):
    rng = np.random.default_rng(n)
    for cost in (rng.standard_normal((n, n)), rng.integers(0, 3, (n, n)).astype(float), rng.random((n, n + 1))):
        p = solve_assignment(torch.from_numpy(cost), backend)
        assert p.dtype == torch.long and len(set(p.tolist())) == n and p.min() >= 0 and p.max() < cost.shape[1]
        assert _value(cost, p) == pytest.approx(_brute_force(cost), abs=1e-12)


@pytest.mark.parametrize(
    "kind,shape",
    [("random", (300, 300)), ("random", (64, 64)), ("ties", (200, 200)), ("ties", (33, 33))]
    + [("rectangular", (100, 257)), ("rectangular", (1, 40)), ("planted", (256, 256)), ("offset", (128, 128))],
)
def test_lapx_matches_scipys_optimal_value(kind, shape):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        if kind == "ties":
            cost = rng.integers(0, 3, shape).astype(float)  # many optima: the values must still agree
        elif kind == "planted":
            cost = 0.3 * rng.standard_normal(shape)
            cost[np.arange(shape[0]), rng.permutation(shape[1])] += 1.0
        else:
            cost = rng.standard_normal(shape) + (1e6 if kind == "offset" else 0.0)
        scipy_value = _value(cost, solve_assignment(torch.from_numpy(cost), "scipy"))
        lapx = solve_assignment(torch.from_numpy(cost), "lapx")
        assert len(set(lapx.tolist())) == shape[0]
        assert _value(cost, lapx) == pytest.approx(scipy_value, rel=1e-13, abs=1e-9)


def test_solve_assignment_refuses_in_one_line():
    with pytest.raises(OptionError, match=r"^backend must be one of \['auto', 'scipy', 'lapx'\], got 'jv'$"):
        solve_assignment(torch.eye(3), "jv")
    with pytest.raises(ValueError, match=r"^cost must be an \(n, m\) matrix with n ≤ m, got shape \(3, 2\)$"):
        solve_assignment(torch.ones(3, 2))
    with pytest.raises(ValueError, match="^cost has NaN or infinite entries$"):
        solve_assignment(torch.tensor([[0.0, float("nan")], [1.0, 2.0]]), "lapx")


@pytest.mark.parametrize("backend", ["scipy", "lapx"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "+inf", "-inf"])
def test_every_non_finite_cost_is_refused_in_our_words(backend, bad):
    """NaN, +inf and −inf alike, on both backends: −inf would otherwise be solved silently (a forbidden pair
    read as merely bad) and +inf fail with the backend's own message."""
    with pytest.raises(ValueError, match="^cost has NaN or infinite entries$"):
        solve_assignment(torch.tensor([[0.0, bad], [1.0, 2.0]]), backend)


def test_a_bad_or_missing_backend_is_one_line_naming_lap_backend(monkeypatch):
    spec, params = _mlp(8)
    with pytest.raises(OptionError, match=r"^lap_backend must be one of \['auto', 'scipy', 'lapx'\], got 'lapjv'$"):
        weight_matching(spec, params, params, lap_backend="lapjv")
    with pytest.raises(OptionError, match=r"^lap_backend must be one of"):
        check_many("sync", {"lap_backend": None})
    monkeypatch.setattr(assignment.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(OptionError, match=r"^lap_backend is 'lapx' but the lapx package is not installed"):
        check_method("am", {"lap_backend": "lapx"})
    monkeypatch.setitem(__import__("sys").modules, "lap", None)  # `import lap` now fails
    with pytest.raises(ModuleNotFoundError, match=r"^lap_backend 'lapx' needs the lapx package: pip install lapx$"):
        solve_assignment(torch.eye(2), "lapx")


def test_exactly_the_methods_that_solve_assignments_take_lap_backend():
    assert {m for m, f in METHODS.items() if "lap_backend" in f.options.model_fields} == set(PAIR_METHODS)
    assert {m for m, f in MANY_METHODS.items() if "lap_backend" in f.options.model_fields} == set(MANY)
    for method in (*PAIR_METHODS, *MANY):
        options = (METHODS.get(method) or MANY_METHODS[method]).options
        assert options.model_fields["lap_backend"].default == "auto"
        assert options().lap_backend == "auto"  # kept: the width of each assignment decides
        assert options(lap_backend="scipy").lap_backend == "scipy"


def test_auto_is_lapx_below_its_width_scipy_from_it_and_scipy_where_lapx_is_missing(monkeypatch, calls):
    spec, params = _mlp(8)
    other = random_params("mlp", make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=8), 1)
    limit = assignment.AUTO_SCIPY_FROM
    assert resolve_backend("auto", limit - 1) == "lapx" and resolve_backend("auto", limit) == "scipy"
    assert resolve_backend("auto") == "auto" and resolve_backend("scipy", 3) == "scipy"
    assert resolve_backend("lapx", limit) == "lapx"  # a named solver at any width
    problem = search_problem(
        "mlp",
        make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=8),
        params,
        other,
        device=torch.device("cpu"),
    )
    found = run_search("wm", problem, seed=0)
    assert found.stats["lap_backend"] == "auto"
    assert "lap_solves" not in run_search("identity", problem, seed=0).stats  # it solves none
    assert found.stats["lap_solves"] == {"lapx": calls["lapx"]} and calls["scipy"] == 0 < calls["lapx"]
    monkeypatch.setattr(assignment, "AUTO_SCIPY_FROM", 8)  # the groups' width: now scipy's
    calls.update(dict.fromkeys(BACKENDS, 0))
    assert run_search("wm", problem, seed=0).stats["lap_solves"] == {"scipy": calls["scipy"]} != {"scipy": 0}
    cost = torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(solve_assignment(cost, "auto"), solve_assignment(cost, "lapx"))
    before = dict(calls)
    solve_assignment(cost[:3], "auto")  # (3, 6) and (3, 8): the wider side decides
    solve_assignment(torch.randn(3, 8, dtype=torch.float64), "auto")
    assert calls["lapx"] - before["lapx"] == 1 and calls["scipy"] - before["scipy"] == 1
    monkeypatch.setattr(assignment.importlib.util, "find_spec", lambda name: None)
    assert resolve_backend("auto") == "scipy" and resolve_backend("auto", 2) == "scipy"
    assert weight_matching(spec, params, other).stats["lap_backend"] == "scipy"
    monkeypatch.setitem(__import__("sys").modules, "lap", None)  # `import lap` fails: auto never tries it
    assert torch.equal(solve_assignment(cost, "auto"), solve_assignment(cost, "scipy"))


def test_counted_solves_nest_and_an_n_model_methods_stats_name_its_solvers(calls):
    inner_cost = torch.eye(3, dtype=torch.float64)
    with assignment.counting_solves() as outer:
        solve_assignment(inner_cost, "scipy")
        with assignment.counting_solves() as inner:
            solve_assignment(inner_cost, "lapx")
            solve_assignment(inner_cost, "lapx")
        assert inner == {"lapx": 2}
    assert outer == {"scipy": 1, "lapx": 2}
    solve_assignment(inner_cost, "scipy")  # outside every block: counted nowhere
    assert outer == {"scipy": 1, "lapx": 2}
    spec, base = _mlp(8)
    params = [base, apply_permutation(spec, random_permutation(spec.group_sizes(base), torch.Generator()), base)]
    before = dict(calls)
    stats = run_many("merge_many", spec, params, seed=0).stats
    assert stats["lap_solves"] == {"lapx": calls["lapx"] - before["lapx"]} != {"lapx": 0}


def _mlp(width: int, seed: int = 0):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=width)
    return get_arch("mlp").permutation_spec(config), random_params("mlp", config, seed)


@pytest.fixture
def calls(monkeypatch):
    """Counts of the assignments each solver ran during the test."""
    counts = dict.fromkeys(BACKENDS, 0)
    scipy_solve, lapx = assignment.linear_sum_assignment, assignment._lapx()

    def scipy_spy(*args, **kwargs):
        counts["scipy"] += 1
        return scipy_solve(*args, **kwargs)

    class LapxSpy:
        def lapjvr(self, *args, **kwargs):
            counts["lapx"] += 1
            return lapx.lapjvr(*args, **kwargs)

    monkeypatch.setattr(assignment, "linear_sum_assignment", scipy_spy)
    monkeypatch.setattr(assignment, "_lapx", LapxSpy)
    return counts


@pytest.mark.parametrize("method", PAIR_METHODS)
def test_every_pair_method_solves_with_its_backend_and_agrees_on_a_planted_copy(method, splits, calls):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=24)
    params_a = random_params("mlp", config, 0)
    spec = search_problem("mlp", config, params_a, params_a, device=torch.device("cpu")).spec
    planted = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    params_b = apply_permutation(spec, planted, params_a)
    train = Split(splits["train"].x[:300], splits["train"].y[:300])
    problem = search_problem("mlp", config, params_a, params_b, device=torch.device("cpu"), train=train)
    found = {}
    for backend in BACKENDS:
        before = dict(calls)
        found[backend] = run_search(method, problem, seed=0, options={**QUICK.get(method, {}), "lap_backend": backend})
        other = next(b for b in BACKENDS if b != backend)
        assert calls[backend] > before[backend] and calls[other] == before[other], backend
        assert found[backend].stats["lap_backend"] == backend
    assert all(torch.equal(found["scipy"].perm[g], p) for g, p in found["lapx"].perm.items())
    if method in ("wm", "am", "ste"):  # exact on a permuted copy
        assert all(torch.equal(found["lapx"].perm[g], p) for g, p in invert(planted).items())
    objective = [matching_objective(spec, found[b].perm, params_a, params_b) for b in BACKENDS]
    assert objective[0] == objective[1]


@pytest.mark.parametrize("method", [*MANY, "c2m3-merge_many"])
def test_every_n_model_method_solves_with_its_backend_and_recovers_planted_copies(method, calls):
    spec, base = _mlp(16)
    sizes, gen = spec.group_sizes(base), torch.Generator().manual_seed(2)
    truth = [{g: torch.arange(k) for g, k in sizes.items()}] + [random_permutation(sizes, gen) for _ in range(2)]
    params = [apply_permutation(spec, t, base) for t in truth]
    name, options = method.split("-")[0], {**QUICK.get(method.split("-")[0], {})}
    if method == "c2m3-merge_many":
        options["init"] = "merge_many"
    found = {}
    for backend in BACKENDS:
        before = dict(calls)
        found[backend] = run_many(name, spec, params, seed=0, options={**options, "lap_backend": backend})
        other = next(b for b in BACKENDS if b != backend)
        assert calls[backend] > before[backend] and calls[other] == before[other], backend
        assert found[backend].stats["lap_backend"] == backend
    for backend in BACKENDS:
        maps = pairwise_maps(found[backend].perms)
        for (i, j), m in maps.items():
            assert all(torch.equal(m[g], truth[j][g].argsort()[truth[i][g]]) for g in sizes), (backend, i, j)


def test_headed_groups_solve_with_the_backend(calls):
    """WM on a permuted copy of a ViT (attention: the structured assignment of each tie) and the Sinkhorn
    rounding of headed scores, with lapx only."""
    _, _, spec, params = _vit()
    sizes = spec.group_sizes(params)
    planted = random_permutation(sizes, torch.Generator().manual_seed(4), spec.heads)
    found = weight_matching(spec, params, apply_permutation(spec, planted, params), lap_backend="lapx")
    assert all(torch.equal(found.perm[g], p) for g, p in invert(planted).items())
    gen = torch.Generator().manual_seed(5)
    moved = scores_at(init_scores(sizes, gen, heads=spec.heads), planted, spec.heads)
    hard = hard_permutation(moved, tau=1.0, n_iter=20, heads=spec.heads, lap_backend="lapx")
    assert all(torch.equal(hard[g], p) for g, p in planted.items())
    assert calls["scipy"] == 0 and calls["lapx"] > 0
