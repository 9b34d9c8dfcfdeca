"""Headed permutation groups (attention): the symmetry itself in float64 on the ViT, the three
negative controls that must change the function, the checks, the structured assignment against brute
force, and planted recovery by WM and AM."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re

import pytest
import torch
from torch.func import functional_call

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.heads import Heads, headed_matrix, headed_permutation, solve_tied, split_headed, tie_sets
from lmclab.core.orthogonal import as_matrix, random_orthogonal
from lmclab.core.spec import (
    apply_permutation,
    build_spec,
    check_permutation,
    compose,
    invert,
    random_permutation,
)
from lmclab.core.spec_builders import dense
from lmclab.search import SearchProblem, run_search
from lmclab.search.sinkhorn import (
    hard_permutation,
    init_scores,
    log_sinkhorn,
    scores_at,
    soft_permutation,
    tie_key,
)
from lmclab.search.weight_matching import solve_assignment

VIT = {"patch_size": 7, "width": 16, "heads": 4, "depth": 2, "mlp_ratio": 2}


def _vit(seed: int = 0, **options):
    config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, **{**VIT, **options})
    model = build_model("vit", config, seed=seed).double().eval()
    gen = torch.Generator().manual_seed(seed + 100)
    params = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in model.state_dict().items()}
    return config, model, get_arch("vit").permutation_spec(config), params


def _relative_change(model, params, permuted, x) -> float:
    with torch.no_grad():
        before, after = functional_call(model, params, (x,)), functional_call(model, permuted, (x,))
    return float((after - before).abs().max() / before.abs().max())


@pytest.mark.parametrize("pool,position", [("cls", "learned"), ("cls", "sincos"), ("mean", "learned")])
def test_random_headed_permutation_leaves_vit_logits_unchanged_in_float64(pool, position):
    config, model, spec, params = _vit(pool=pool, position=position)
    sizes = spec.group_sizes(params)
    perm = random_permutation(sizes, torch.Generator().manual_seed(1), spec.heads)
    check_permutation(perm, sizes, spec.heads)
    assert all(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert _relative_change(model, params, apply_permutation(spec, perm, params), x) < 1e-12
    sigma = {g: split_headed(perm[g], 4)[0] for g in spec.heads}
    assert all(torch.equal(sigma[f"P_qk_{k}"], sigma[f"P_vo_{k}"]) for k in range(config.depth))


def _controls(perm, gen):
    """The three wrong permutations of block 0 that must change the function."""
    qk, vo = perm["P_qk_0"], perm["P_vo_0"]
    sigma, taus = split_headed(qk, 4)
    crossing = torch.randperm(16, generator=gen)
    while split_headed(crossing, 4) is not None:
        crossing = torch.randperm(16, generator=gen)
    other_sigma = sigma[torch.tensor([1, 0, 2, 3])]
    v_sigma, v_taus = split_headed(vo, 4)
    q_tau_differs = headed_permutation(sigma, taus[:, torch.tensor([1, 0, 2, 3])])
    return {
        "Q/K across heads": {"P_qk_0": crossing},
        "V/O heads in another order": {"P_vo_0": headed_permutation(other_sigma, v_taus)},
        "Q and K with different tau": {"q_only": q_tau_differs},
    }


def test_the_three_wrong_attention_permutations_change_the_logits():
    _, model, spec, params = _vit(position="learned")
    sizes, gen = spec.group_sizes(params), torch.Generator().manual_seed(3)
    perm = random_permutation(sizes, gen, spec.heads)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64, generator=gen)
    for what, change in _controls(perm, gen).items():
        if "q_only" in change:  # W_Q's rows by another τ than W_K's: a spec where Q has its own group
            axes = {**spec.axes, "blocks.0.attn.q.weight": ("Q", "P_res"), "blocks.0.attn.q.bias": ("Q",)}
            wrong_spec = build_spec(axes)
            wrong = apply_permutation(wrong_spec, {**perm, "Q": change["q_only"]}, params)
        else:
            wrong = apply_permutation(spec, {**perm, **change}, params)
            with pytest.raises(ValueError, match="crosses heads|order the heads differently"):
                check_permutation({**perm, **change}, sizes, spec.heads)
        assert _relative_change(model, params, wrong, x) > 1e-3, what


def test_check_permutation_accepts_headed_and_refuses_what_breaks_heads_or_ties():
    heads = {"Q": Heads(2, "S"), "V": Heads(2, "S")}
    sizes = {"Q": 4, "V": 6}
    good = {"Q": torch.tensor([2, 3, 1, 0]), "V": torch.tensor([5, 3, 4, 0, 2, 1])}
    check_permutation(good, sizes, heads)
    with pytest.raises(ValueError, match="'Q' crosses heads"):
        check_permutation({**good, "Q": torch.tensor([0, 2, 1, 3])}, sizes, heads)
    with pytest.raises(
        ValueError, match=r"^permutations of groups 'Q' and 'V' order the heads differently; they share .* 'S'$"
    ):
        check_permutation({**good, "V": torch.tensor([0, 1, 2, 5, 4, 3])}, sizes, heads)
    check_permutation({**good, "Q": torch.tensor([0, 2, 1, 3])}, sizes)  # without heads: any bijection


def test_headed_permutations_compose_and_invert_within_the_headed_set():
    heads = {"Q": Heads(3, "S"), "V": Heads(3, "S")}
    sizes, gen = {"Q": 12, "V": 6}, torch.Generator().manual_seed(0)
    p, q = random_permutation(sizes, gen, heads), random_permutation(sizes, gen, heads)
    check_permutation(compose(p, q), sizes, heads)
    check_permutation(invert(p), sizes, heads)
    spec = build_spec(dense("q", "Q", None), dense("v", "V", None), dense("o", None, "V"), heads=heads)
    params = {k: torch.randn(*(sizes[a] if a else 5 for a in axes), generator=gen) for k, axes in spec.axes.items()}
    twice = apply_permutation(spec, p, apply_permutation(spec, q, params))
    once = apply_permutation(spec, compose(p, q), params)
    assert all(torch.equal(twice[k], once[k]) for k in params)


def _brute_force_best(costs):
    """The headed permutation of tie ``{"A": 3 heads × 2, "B": 3 heads × 3}`` maximising ``Σ_g Σ_i
    costs[g][i, perm_g[i]]``, by enumerating all 3!·(2!)³·(3!)³ of them."""
    best, best_value = None, -float("inf")
    for sigma in itertools.permutations(range(3)):
        for ta in itertools.product(itertools.permutations(range(2)), repeat=3):
            for tb in itertools.product(itertools.permutations(range(3)), repeat=3):
                perm = {
                    "A": headed_permutation(torch.tensor(sigma), torch.tensor(ta)),
                    "B": headed_permutation(torch.tensor(sigma), torch.tensor(tb)),
                }
                value = sum(float(costs[g][torch.arange(len(p)), p].sum()) for g, p in perm.items())
                if value > best_value:
                    best, best_value = perm, value
    return best


@pytest.mark.parametrize("seed", range(4))
def test_solve_tied_equals_brute_force_over_every_headed_permutation(seed):
    gen = torch.Generator().manual_seed(seed)
    heads = {"A": Heads(3, "S"), "B": Heads(3, "S")}
    costs = {"A": 2 * torch.randn(6, 6, generator=gen), "B": torch.randn(9, 9, generator=gen)}
    best = _brute_force_best(costs)
    solved = solve_tied(costs, heads, solve_assignment)
    assert all(torch.equal(solved[g], best[g]) for g in costs)
    assert tie_sets(["B", "C", "A"], heads) == [("A", "B"), ("C",)]


def _inside_heads(spec):
    """``spec`` with every headed group orthogonal inside its heads (the ViT's stream stays a permutation group)."""
    return dataclasses.replace(spec, kinds=dict.fromkeys(spec.heads, "orthogonal"))


def test_orthogonal_maps_inside_heads_keep_vit_logits_and_check_permutation_names_what_breaks_them():
    """``R_h`` per head, shared by a head's queries and keys (``qᵀRᵀRk = qᵀk``), another for its values (``W_O Rᵀ R
    W_V``), heads reordered by one σ per layer: the logits are kept in float64; a map across heads, another head
    order for V/O than for Q/K, or the queries rotated alone change them, and the first two are refused."""
    _, model, spec, params = _vit(position="learned")
    spec, sizes, gen = _inside_heads(spec), spec.group_sizes(params), torch.Generator().manual_seed(3)
    perm = random_permutation(sizes, gen, spec.heads, spec.kinds)
    check_permutation(perm, sizes, spec.heads, spec.kinds)
    assert all(perm[g].shape == (16, 16) for g in spec.heads) and perm["P_res"].dim() == 1
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64, generator=gen)
    assert _relative_change(model, params, apply_permutation(spec, perm, params), x) < 1e-12
    sigma, rotations = split_headed(perm["P_vo_0"], 4)
    torch.testing.assert_close(headed_matrix(sigma, rotations), perm["P_vo_0"], rtol=0, atol=0)
    assert torch.equal(sigma, split_headed(perm["P_qk_0"], 4)[0])
    wrong = {
        "crosses heads": random_orthogonal(16, gen),
        "order the heads differently": headed_matrix(sigma[torch.tensor([1, 0, 2, 3])], rotations),
    }
    for refusal, element in wrong.items():
        with pytest.raises(ValueError, match=refusal):
            check_permutation({**perm, "P_vo_0": element}, sizes, spec.heads, spec.kinds)
        assert _relative_change(model, params, apply_permutation(spec, {**perm, "P_vo_0": element}, params), x) > 1e-3
    axes = {**spec.axes, "blocks.0.attn.q.weight": ("Q", "P_res"), "blocks.0.attn.q.bias": ("Q",)}
    alone = dataclasses.replace(spec, axes=axes, kinds={**spec.kinds, "Q": "orthogonal"})
    other = headed_matrix(split_headed(perm["P_qk_0"], 4)[0], torch.stack([random_orthogonal(4, gen) for _ in "abcd"]))
    moved = apply_permutation(alone, {**perm, "Q": other}, params)  # W_Q's heads by other maps than W_K's
    assert _relative_change(model, params, moved, x) > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_solve_tied_with_a_group_orthogonal_inside_heads_equals_brute_force_over_head_orders(seed):
    """A tie of a permutation group ``A`` (3 heads × 2) and an orthogonal one ``B`` (3 heads × 3): for each σ the
    best maps inside heads are the assignments and the polar factors of the blocks σ picks, worth the nuclear
    norms; the solve equals the best σ over all 3! and beats every random element of the tie."""
    gen = torch.Generator().manual_seed(seed)
    heads, kinds = {"A": Heads(3, "S"), "B": Heads(3, "S")}, {"B": "orthogonal"}
    costs = {"A": torch.randn(6, 6, generator=gen), "B": 3 * torch.randn(9, 9, generator=gen, dtype=torch.float64)}
    solved = solve_tied(costs, heads, solve_assignment, kinds)
    check_permutation(solved, {"A": 6, "B": 9}, heads, kinds)

    def value(perm) -> float:
        return sum(float((as_matrix(p) * costs[g].double()).sum()) for g, p in perm.items())

    def blocks(g, d):
        return costs[g].double().reshape(3, d, 3, d).transpose(1, 2)

    brute = max(
        sum(float(torch.linalg.svdvals(blocks("B", 3)[h, k]).sum()) for h, k in enumerate(sigma))
        + sum(max(float(blocks("A", 2)[h, k][torch.arange(2), list(t)].sum()) for t in ((0, 1), (1, 0)))
              for h, k in enumerate(sigma))
        for sigma in itertools.permutations(range(3))
    )  # fmt: skip
    assert value(solved) == pytest.approx(brute, rel=1e-12)
    assert all(value(random_permutation({"A": 6, "B": 9}, gen, heads, kinds)) < value(solved) for _ in range(200))


@pytest.mark.parametrize("method", ["wm", "am"])
def test_wm_and_am_recover_a_planted_element_orthogonal_inside_heads(method):
    """A ViT whose heads are rotated inside and reordered (its stream permuted): recovered to 1e-9."""
    problem, _ = _planted_problem(0.0)
    spec = _inside_heads(problem.spec)
    planted = random_permutation(
        spec.group_sizes(problem.params_a), torch.Generator().manual_seed(8), spec.heads, spec.kinds
    )
    problem = SearchProblem(
        **{**problem.__dict__, "spec": spec, "params_b": apply_permutation(spec, planted, problem.params_a)}
    )
    found = run_search(method, problem, seed=0).perm
    check_permutation(found, spec.group_sizes(problem.params_a), spec.heads, spec.kinds)
    for g, p in invert(planted).items():
        torch.testing.assert_close(as_matrix(found[g]), as_matrix(p), rtol=0, atol=1e-9, msg=g)


def _planted_problem(noise: float):
    """θb = π(θa) (+ noise) for a 4-head, 16-per-head ViT and a random headed π."""
    config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=64, heads=4, depth=2)
    model, spec = build_model("vit", config, seed=0).double().eval(), get_arch("vit").permutation_spec(config)
    gen = torch.Generator().manual_seed(5)
    params_a = {k: v + 0.2 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in model.state_dict().items()}
    planted = random_permutation(spec.group_sizes(params_a), gen, spec.heads)
    params_b = apply_permutation(spec, planted, params_a)
    params_b = {k: v + noise * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params_b.items()}
    x = torch.randn(256, 1, 28, 28, dtype=torch.float64, generator=gen)
    points = get_arch("vit").activation_points(config)
    labels = torch.randint(10, (256,), generator=gen)
    problem = SearchProblem(spec, params_a, params_b, model=model, points=points, train=Split(x, labels))
    return problem, invert(planted)


@pytest.mark.parametrize("noise", [0.0, 0.01])
@pytest.mark.parametrize("method", ["wm", "am"])
def test_wm_and_am_recover_a_planted_headed_permutation(method, noise):
    problem, expected = _planted_problem(noise)
    found = run_search(method, problem, seed=0).perm
    check_permutation(found, problem.spec.group_sizes(problem.params_a), problem.spec.heads)
    for g, p in expected.items():
        assert torch.equal(found[g], p), g


@pytest.mark.parametrize("method", ["wm", "am", "ste"])
def test_matching_two_unrelated_vits_keeps_heads_whole(method):
    """Unrelated endpoints: the unconstrained optimum of a Q/K or V/O group crosses heads; every method
    must return a headed permutation with one head order per block."""
    problem, _ = _planted_problem(0.0)
    _, _, _, other = _vit(seed=7, width=64, heads=4, patch_size=7)
    problem = SearchProblem(**{**problem.__dict__, "params_b": other})
    options = {"epochs": 1, "batch_size": 64} if method == "ste" else {}
    found = run_search(method, problem, seed=0, options=options).perm
    check_permutation(found, problem.spec.group_sizes(other), problem.spec.heads)


def _float(problem: SearchProblem) -> SearchProblem:
    """``problem`` in float32, the precision of the Sinkhorn methods' scores."""
    params = {side: {k: v.float() for k, v in getattr(problem, side).items()} for side in ("params_a", "params_b")}
    train = Split(problem.train.x.float(), problem.train.y)
    return SearchProblem(
        **{**problem.__dict__, **params, "model": copy.deepcopy(problem.model).float(), "train": train}
    )


@pytest.mark.parametrize("method", ["wm_sinkhorn", "ste_sinkhorn"])
def test_sinkhorn_methods_keep_heads_whole_on_two_unrelated_vits(method):
    """The soft headed permutation's hard permutation keeps heads whole with one σ per block, and moves."""
    problem, _ = _planted_problem(0.0)
    _, _, _, other = _vit(seed=7, width=64, heads=4, patch_size=7)
    problem = _float(SearchProblem(**{**problem.__dict__, "params_b": other}))
    options = {"epochs": 1, "batch_size": 64} if method == "ste_sinkhorn" else {"epochs": 1, "iterations": 10}
    found = run_search(method, problem, seed=0, options=options).perm
    check_permutation(found, problem.spec.group_sizes(other), problem.spec.heads)
    assert any(not torch.equal(found[g], torch.arange(len(found[g]))) for g in problem.spec.heads)


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_wm_sinkhorn_recovers_a_planted_headed_permutation(noise):
    """DistL2 on the soft headed permutation finds π exactly; at the defaults (10 epochs × 100 steps) from
    the first epoch on, and already after 10 steps, which is what runs here."""
    problem, expected = _planted_problem(noise)
    found = run_search("wm_sinkhorn", _float(problem), seed=0, options={"epochs": 1, "iterations": 10}).perm
    assert all(torch.equal(found[g], p) for g, p in expected.items())


def test_ste_sinkhorn_started_at_wm_keeps_a_planted_headed_permutation():
    """``init: wm`` moves the headed factors to WM's (planted) permutation and the soft headed steps keep it
    at a small learning rate. Recovery from the identity is not a property of the midpoint loss here: on
    this untrained ViT (random or θa's own labels) other permutations give a lower loss than θa itself,
    and Sinkhorn STE moves away even from the planted start at lr 0.1."""
    problem, expected = _planted_problem(0.01)
    options = {"epochs": 1, "batch_size": 64, "init": "wm", "lr": 1e-3}
    found = run_search("ste_sinkhorn", _float(problem), seed=0, options=options).perm
    assert all(torch.equal(found[g], p) for g, p in expected.items())


# ---- the soft headed permutation of the Sinkhorn methods ---------------------------------------

HEADS = {"A": Heads(3, "S"), "B": Heads(3, "S")}
SIZES = {"A": 6, "B": 9, "P": 4}  # A: 3 heads of 2, B: 3 heads of 3, P plain


def _scores(seed: int = 0) -> dict:
    return {k: v.double() for k, v in init_scores(SIZES, torch.Generator().manual_seed(seed), heads=HEADS).items()}


def test_headed_initial_scores_draw_the_plain_groups_as_without_heads():
    scores = init_scores({**SIZES, "Q": 5}, torch.Generator().manual_seed(0), heads=HEADS)
    plain = init_scores({"P": 4, "Q": 5}, torch.Generator().manual_seed(0))
    assert all(torch.equal(scores[g], plain[g]) for g in plain)
    shapes = {k: tuple(v.shape) for k, v in scores.items()}
    assert shapes == {"P": (4, 4), "Q": (5, 5), tie_key("S"): (3, 3), "A": (3, 3, 2, 2), "B": (3, 3, 3, 3)}


def test_soft_headed_permutation_is_the_product_of_its_factors_and_doubly_stochastic():
    scores = _scores()
    soft = soft_permutation(scores, tau=0.7, n_iter=9, heads=HEADS)
    assert list(soft) == ["P", "A", "B"]
    head = log_sinkhorn(scores[tie_key("S")], tau=0.7, n_iter=9)
    for g, d in (("A", 2), ("B", 3)):
        for h, k in itertools.product(range(3), repeat=2):  # block (h, k) of P_g, each block on its own
            block = soft[g][h * d : (h + 1) * d, k * d : (k + 1) * d]
            torch.testing.assert_close(block, head[h, k] * log_sinkhorn(scores[g][h, k], tau=0.7, n_iter=9))
    converged = soft_permutation(scores, tau=1.0, n_iter=500, heads=HEADS)
    for p in converged.values():
        torch.testing.assert_close(p.sum(0), torch.ones(len(p), dtype=p.dtype), rtol=0, atol=1e-10)
        torch.testing.assert_close(p.sum(1), torch.ones(len(p), dtype=p.dtype), rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_scores_at_moves_the_initialisation_to_a_headed_permutation(seed):
    """The moved scores' hard permutation is ``perm``; their soft permutation is the initial one with its
    columns reordered by ``perm`` (``new[i, perm[i']] = old[i, i']``); one-hot factors give ``perm`` itself."""
    scores, gen = _scores(seed), torch.Generator().manual_seed(seed + 10)
    perm = random_permutation(SIZES, gen, HEADS)
    moved = scores_at(scores, perm, HEADS)
    hard = hard_permutation(moved, tau=1.0, n_iter=20, heads=HEADS)
    assert {g: p.tolist() for g, p in hard.items()} == {g: p.tolist() for g, p in perm.items()}
    before, after = (soft_permutation(s, tau=1.0, n_iter=20, heads=HEADS) for s in (scores, moved))
    for g, p in perm.items():
        torch.testing.assert_close(after[g], before[g][:, torch.argsort(p)])
    sharp = soft_permutation({k: 60 * v for k, v in moved.items()}, tau=1.0, n_iter=20, heads=HEADS)
    for g, p in perm.items():
        torch.testing.assert_close(sharp[g], torch.eye(len(p), dtype=torch.float64)[p], rtol=0, atol=1e-9)


# (25, 0.5) and (21, 1.0): cases where the assignment on P itself (the Frobenius-closest headed permutation) differs
@pytest.mark.parametrize("seed,noise", [(0, 0.5), (25, 0.5), (21, 1.0)])
def test_hard_headed_permutation_maximises_the_log_soft_weight_by_brute_force(seed, noise):
    """Over every headed permutation of the tie: argmax of ``Σ_g Σ_i log P_g[i, perm_g[i]]``."""
    gen = torch.Generator().manual_seed(seed)
    scores = {k: v + noise * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in _scores(seed).items()}
    soft = soft_permutation(scores, tau=0.5, n_iter=5, heads=HEADS)
    best = _brute_force_best({g: w.log() for g, w in soft.items()})
    hard = hard_permutation(scores, tau=0.5, n_iter=5, heads=HEADS)
    assert all(torch.equal(hard[g], best[g]) for g in best)
    assert torch.equal(hard["P"], solve_assignment(scores["P"]))


def test_a_tied_group_whose_units_do_not_split_into_its_heads_is_named():
    heads = {"A": Heads(3, "S"), "B": Heads(3, "S")}
    costs = {"A": torch.randn(6, 6), "B": torch.randn(7, 7)}
    with pytest.raises(ValueError, match=r"^group 'B': 7 units do not split into 3 heads of equal size$"):
        solve_tied(costs, heads, solve_assignment)


def _rotary_gpt(kind: str):
    """lmclab's ``gpt`` with rotary positions (float64, random weights) and its spec with each layer's queries
    and keys one headed group of ``kind`` (the learned-position spec's ``P_qk_k``, whose features are free)."""
    from lmclab.archs import gpt

    options = dict(input_shape=(8,), num_classes=13, width=16, depth=2, heads=2, norm="rmsnorm", tie_embeddings=False)
    torch.manual_seed(0)
    model = gpt.Model(gpt.Config(position="rotary", **options)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    spec = gpt.permutation_spec(gpt.Config(position="learned", **options))
    axes = {k: v for k, v in spec.axes.items() if k != "pos_embed.weight"}
    kinds = {g: kind for g in spec.heads if g.startswith("P_qk")}
    return model, dataclasses.replace(spec, axes=axes, kinds=kinds)


def test_rotations_of_each_rotary_plane_keep_a_rotary_gpts_logits_and_other_maps_do_not():
    """q'·k' with q' = q·cos + rotate_half(q)·sin: a 2 × 2 rotation of each plane (j, j + d/2), the same for a
    head's queries and keys, commutes with every turn RoPE makes; a general orthogonal map of a head does not."""
    x = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(1))
    for kind, changes in (("rotary", False), ("orthogonal", True)):
        model, spec = _rotary_gpt(kind)
        params = model.state_dict()
        perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
        check_permutation(perm, spec.group_sizes(params), spec.heads, spec.kinds)
        change = _relative_change(model, params, apply_permutation(spec, perm, params), x)
        assert (change > 1e-3) if changes else (change < 1e-12), kind


def test_a_rotary_group_takes_only_maps_that_turn_each_plane_alone():
    model, spec = _rotary_gpt("rotary")
    sizes, gen = spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(3)
    perm = random_permutation(sizes, gen, spec.heads, spec.kinds)
    bent = dict(perm, P_qk_0=headed_matrix(torch.arange(2), torch.stack([random_orthogonal(8, gen)] * 2)))
    expected = "group 'P_qk_0' is rotary: each head's map must turn its planes (j, j + 4) alone"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        check_permutation(bent, sizes, spec.heads, spec.kinds)
    sigma = split_headed(as_matrix(perm["P_vo_0"]), 2)[0]  # the tie's head order
    heads_only = headed_permutation(sigma, torch.arange(8).repeat(2, 1))
    check_permutation(dict(perm, P_qk_0=heads_only), sizes, spec.heads, spec.kinds)  # an index tensor: no turn
    crossed = headed_permutation(sigma, torch.tensor([[4, 1, 2, 3, 0, 5, 6, 7], list(range(8))]))
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):  # features 0 and 4 swapped: a reflection
        check_permutation(dict(perm, P_qk_0=crossed), sizes, spec.heads, spec.kinds)
    plain = dataclasses.replace(spec, kinds={"P_res": "rotary"})
    with pytest.raises(ValueError, match=r"kind 'rotary' of 'P_res': expected one of .* \(rotary: headed\)$"):
        plain.check(model.state_dict())


@pytest.mark.parametrize("seed", range(3))
def test_solve_tied_with_a_rotary_group_equals_brute_force_over_head_orders_and_plane_angles(seed):
    """Per plane the value (B_jj + B_j'j')·cos φ + (B_j'j − B_jj')·sin φ peaks in closed form: the solve equals the
    best head order of the closed forms, which a grid of 3,600 angles per plane approaches from below, and no
    random element of the tie beats it."""
    gen = torch.Generator().manual_seed(seed)
    heads, kinds = {"Q": Heads(3, "S"), "V": Heads(3, "S")}, {"Q": "rotary", "V": "orthogonal"}
    costs = {g: torch.randn(12, 12, generator=gen, dtype=torch.float64) for g in heads}
    solved = solve_tied(costs, heads, solve_assignment, kinds)
    check_permutation(solved, {"Q": 12, "V": 12}, heads, kinds)

    def value(perm) -> float:
        return sum(float((as_matrix(p) * costs[g]).sum()) for g, p in perm.items())

    phi = torch.linspace(0, 2 * torch.pi, 3601, dtype=torch.float64)[:-1]

    def grid(block) -> float:  # plane j of a 4 × 4 block: rows/columns j and j + 2
        return sum(
            float(
                (
                    phi.cos() * (block[j, j] + block[j + 2, j + 2]) + phi.sin() * (block[j + 2, j] - block[j, j + 2])
                ).max()
            )
            for j in range(2)
        )

    q, v = (costs[g].reshape(3, 4, 3, 4).transpose(1, 2) for g in ("Q", "V"))
    brute = max(
        sum(grid(q[h, k]) + float(torch.linalg.svdvals(v[h, k]).sum()) for h, k in enumerate(sigma))
        for sigma in itertools.permutations(range(3))
    )
    assert brute <= value(solved) <= brute + 1e-4
    assert all(value(random_permutation({"Q": 12, "V": 12}, gen, heads, kinds)) < value(solved) for _ in range(200))


@pytest.mark.parametrize("method", ["wm", "am"])
def test_wm_and_am_recover_a_planted_element_with_rotary_planes(method):
    """A rotary gpt whose planes are turned, heads reordered, MLP units and stream permuted, aligned through
    ``lmclab.align`` with the spec given: recovered to 1e-9."""
    import lmclab
    from lmclab.archs import gpt

    model, spec = _rotary_gpt("rotary")
    params = model.state_dict()
    planted = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(8), spec.heads, spec.kinds)
    x = torch.randint(0, 13, (64, 8), generator=torch.Generator().manual_seed(4))
    config = gpt.Config(input_shape=(8,), num_classes=13, width=16, heads=2, depth=2, tie_embeddings=False)
    found = lmclab.align(
        params,
        apply_permutation(spec, planted, params),
        method=method,
        symmetry="orthogonal",
        spec=spec,
        model=model,
        points=gpt.activation_points(config),
        data=(x, x),
        device="cpu",
    ).perm
    for g, p in invert(planted).items():
        torch.testing.assert_close(as_matrix(found[g]), as_matrix(p), rtol=0, atol=1e-9, msg=g)
