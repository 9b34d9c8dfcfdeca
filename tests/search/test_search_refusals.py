"""The search methods' refusals of a bad input, each reached through the function a caller uses and asserted
as its whole one-line message, next to the nearest accepted input and the value it gives: a learning curve
without its model, activation matching's points, the n-model methods' two models, the transform merges'
plain groups and REPAIR's single merged model of one group per point, a headed permutation that keeps its
heads, ZipIt!'s equal widths and its linkages above −inf."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch
from test_cca_zipit import WIDTH, data, mlp
from test_many_models import planted, recovered
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.heads import Heads
from lmclab.core.merge import aligned_midpoint
from lmclab.core.options import OptionError
from lmclab.core.repair import repair_merged, unit_statistics
from lmclab.core.spec import PermutationSpec, Segment, apply_permutation, build_spec, random_permutation
from lmclab.core.spec_builders import conv, dense
from lmclab.core.transform import TransformResult, permutation_transforms
from lmclab.search import SearchProblem, run_search
from lmclab.search.features import repair_transformed, transform_targets
from lmclab.search.many_methods import run_many
from lmclab.search.sinkhorn import hard_permutation, init_scores, scores_at
from lmclab.search.zipit import zip_merges


def test_a_learning_curve_on_a_test_split_needs_the_model():
    model, spec, _, _ = mlp(0)
    model = model.float()  # Sinkhorn WM's scores are float32: a float32 model
    params_a, params_b = ({k: v.float() for k, v in mlp(seed)[3].items()} for seed in (0, 1))
    test = Split(data(40).x.float(), torch.arange(40) % 3)
    quick = {"epochs": 2, "iterations": 3, "lr": 0.5, "select": "last"}
    message = r"^SearchProblem\.model: the learning curve on SearchProblem\.test needs it, got None$"
    with pytest.raises(ValueError, match=message):
        run_search("wm_sinkhorn", SearchProblem(spec, params_a, params_b, test=test), seed=0, options=quick)
    plain = run_search("wm_sinkhorn", SearchProblem(spec, params_a, params_b), seed=0, options=quick)
    assert [sorted(set(row) & {"l2", "test_loss"}) for row in plain.stats["curve"]] == [["l2"]] * 3
    problem = SearchProblem(spec, params_a, params_b, model=model, test=test)
    found = run_search("wm_sinkhorn", problem, seed=0, options=quick)
    assert all(torch.equal(found.perm[g], p) for g, p in plain.perm.items())  # the curve does not steer
    _, merged = aligned_midpoint(spec, params_a, params_b, found.perm)
    assert found.stats["curve"][-1]["test_loss"] == pytest.approx(evaluate(model, merged, test).loss, rel=1e-12)


def test_a_learning_curve_evaluates_the_merged_midpoint_after_its_repair():
    model, spec, _, _ = mlp(0)
    model = model.float()
    params_a, params_b = ({k: v.float() for k, v in mlp(seed)[3].items()} for seed in (0, 1))
    test = Split(data(40).x.float(), torch.arange(40) % 3)
    halved = lambda merged: {k: v / 2 for k, v in merged.items()}  # noqa: E731
    problem = SearchProblem(spec, params_a, params_b, model=model, test=test, repair=halved)
    found = run_search("wm_sinkhorn", problem, seed=0, options={"epochs": 2, "iterations": 3, "select": "last"})
    _, merged = aligned_midpoint(spec, params_a, params_b, found.perm)
    last = found.stats["curve"][-1]["test_loss"]
    assert last == pytest.approx(evaluate(model, halved(merged), test).loss, rel=1e-12)
    assert last != pytest.approx(evaluate(model, merged, test).loss, rel=1e-3)


def test_the_search_time_excludes_the_learning_curve_s_which_is_reported_apart(monkeypatch):
    model, spec, _, _ = mlp(0)
    model = model.float()
    params_a, params_b = ({k: v.float() for k, v in mlp(seed)[3].items()} for seed in (0, 1))
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def slow_repair(merged):  # each learning-curve row takes a second; nothing else takes any time
        clock[0] += 1.0
        return merged

    test = Split(data(40).x.float(), torch.arange(40) % 3)
    problem = SearchProblem(spec, params_a, params_b, model=model, test=test, repair=slow_repair)
    found = run_search("wm_sinkhorn", problem, seed=0, options={"epochs": 2, "iterations": 3})
    assert found.stats["monitor_seconds"] == len(found.stats["curve"]) == 3
    assert found.stats["seconds"] == 0.0


def test_activation_matching_needs_activation_points_of_exactly_the_spec_groups():
    model, spec, points, params_a = mlp(0)
    truth = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(4))
    params_b, x = apply_permutation(spec, truth, params_a), data(50)
    for wrong in ({"P_1": points["P_1"]}, {**points, "P_9": points["P_0"]}):
        problem = SearchProblem(spec, params_a, params_b, model=model, points=wrong, train=x)
        got = re.escape(str(sorted(wrong)))
        message = rf"^points: expected activation points of exactly the groups \['P_0', 'P_1'\], got {got}$"
        with pytest.raises(ValueError, match=message):
            run_search("am", problem, seed=0)
    problem = SearchProblem(spec, params_a, params_b, model=model, points=points, train=x)
    found = run_search("am", problem, seed=0, options={"statistic": "pearson", "batch_size": 16})
    aligned = apply_permutation(spec, found.perm, params_b)
    assert all(torch.equal(aligned[k], v) for k, v in params_a.items())  # the planted permutation undone


@pytest.mark.parametrize("method", ["c2m3", "star", "sync"])
def test_the_universe_methods_need_at_least_two_models(method):
    spec, params, truth = planted(5, 2, noise=0.01)
    with pytest.raises(OptionError, match=r"^params must name at least 2 models, got 1$"):
        run_many(method, spec, params[:1], seed=0)
    assert recovered(run_many(method, spec, params, seed=3).perms, truth)


def _vit_inputs():
    config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=8, heads=2, depth=1)
    model = build_model("vit", config, seed=0).double().eval()
    images = torch.rand(24, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    inputs = {
        "model": model,
        "points": get_arch("vit").activation_points(config),
        "data": Split(images, torch.zeros(24, dtype=torch.long)),
    }
    return get_arch("vit").permutation_spec(config), model.state_dict(), inputs


@pytest.mark.parametrize("method", ["cca", "zipit"])
def test_the_transform_merges_refuse_a_spec_with_attention_heads(method):
    spec, params, inputs = _vit_inputs()
    message = (
        r"^group 'P_qk_0' is headed: a general linear map would mix attention heads; "
        r"merge/unmerge transforms need plain groups$"
    )
    forwards = []
    hook = inputs["model"].register_forward_pre_hook(lambda *_: forwards.append(1))
    with pytest.raises(ValueError, match=message):
        run_many(method, spec, [params, params], seed=0, **inputs)
    hook.remove()
    assert not forwards  # refused before reading any activation
    plain = PermutationSpec(spec.axes, spec.stats)  # the same groups, as plain ones
    merged = run_many(method, plain, [params, params], seed=0, **inputs).merged
    assert max(float((merged[k] - v).abs().max()) for k, v in params.items() if v.is_floating_point()) < 1e-6


def _permutation_result(spec, params, weights):
    """A TransformResult of random permutations (M_i = w_i P_i, U_i = P_iᵀ) and the aligned endpoints."""
    gen = torch.Generator().manual_seed(2)
    perms = [random_permutation(spec.group_sizes(params[0]), gen) for _ in params]
    aligned = [apply_permutation(spec, perm, p) for perm, p in zip(perms, params, strict=True)]
    merged = {k: sum(w * a[k] for w, a in zip(weights, aligned, strict=True)) for k in params[0]}
    return TransformResult(*permutation_transforms(perms, weights), merged, [], {}), aligned


def test_repair_of_a_transform_merge_refuses_a_point_of_composite_output():
    net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    gen = torch.Generator().manual_seed(0)
    params = [{k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in net.state_dict().items()}]
    params.append({k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in params[0].items()})
    x = Split(torch.randn(40, 3, generator=gen, dtype=torch.float64), torch.zeros(40, dtype=torch.long))
    weights = [0.3, 0.7]
    halves = (Segment("P_0", 4), Segment("P_1", 2))  # the hidden units in two groups
    composite = build_spec({"0.weight": (halves, None), "0.bias": (halves,)}, dense("2", None, halves))
    result, _ = _permutation_result(composite, params, weights)
    message = r"^points: '0' produces a composite axis; REPAIR of a transform needs one group$"
    with pytest.raises(ValueError, match=message):
        repair_transformed(net, composite, params, result, x, weights=weights)
    for hidden in ("P_0", None):  # one group, or none (an ungrouped point: M_i = w_i I)
        plain = build_spec(dense("0", hidden, None), dense("2", None, hidden))
        result, aligned = _permutation_result(plain, params, weights)
        ours = repair_transformed(net, plain, params, result, x, weights=weights)
        theirs = repair_merged(net, aligned, x, weights=weights)
        assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) < 1e-10
        assert max(float((ours[k] - result.merged[k]).abs().max()) for k in ours) > 1e-3  # repair did act


def test_repair_of_a_transform_merge_reads_a_conv_point_s_channels():
    net = nn.Sequential(nn.Conv2d(2, 4, 1), nn.ReLU(), nn.Conv2d(4, 3, 1)).double()  # 4 channels, 5 columns
    gen = torch.Generator().manual_seed(0)
    params = [{k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in net.state_dict().items()}]
    params.append({k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in params[0].items()})
    x = Split(torch.randn(20, 2, 3, 5, generator=gen, dtype=torch.float64), torch.zeros(20, dtype=torch.long))
    spec = build_spec(conv("0", "P_0", None, bias=True), conv("2", None, "P_0", bias=True))
    result, aligned = _permutation_result(spec, params, [0.5, 0.5])
    ours = repair_transformed(net, spec, params, result, x)
    theirs = repair_merged(net, aligned, x)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) < 1e-10


def test_repair_of_a_transform_merge_at_chosen_points_leaves_the_others_as_merged():
    model, spec, _, params_a = mlp(0)
    params, x = [params_a, mlp(1)[3]], data(60)
    result, _ = _permutation_result(spec, params, [0.5, 0.5])
    every = transform_targets(model, spec, params, result.merges, x, batch_size=7)
    assert list(every) == ["layers.0", "layers.1"]  # the default: every hidden layer, in forward order
    chosen = transform_targets(model, spec, params, result.merges, x, points=["layers.1"])
    assert list(chosen) == ["layers.1"]
    assert torch.allclose(chosen["layers.1"].mean, every["layers.1"].mean, rtol=1e-12)
    assert torch.allclose(chosen["layers.1"].std, every["layers.1"].std, rtol=1e-12)
    repaired = repair_transformed(model, spec, params, result, x, points=["layers.1"], batch_size=7)
    assert torch.equal(repaired["layers.0.weight"], result.merged["layers.0.weight"])
    assert not torch.allclose(repaired["layers.1.weight"], result.merged["layers.1.weight"])
    reached = unit_statistics(model, repaired, x, ["layers.1"])["layers.1"]
    assert torch.allclose(reached.mean, chosen["layers.1"].mean) and torch.allclose(reached.std, chosen["layers.1"].std)


def test_repair_of_a_transform_merge_refuses_a_partial_zip():
    model, spec, points, params_a = mlp(0)
    params, x = [params_a, mlp(1)[3]], data(60)
    inputs = {"model": model, "points": points, "data": x}
    partial = run_many("zipit", spec, params, seed=0, options={"partial_zip": 1}, **inputs)
    message = r"^result: a partial zip has no single merged model to repair; repair each of its heads$"
    with pytest.raises(ValueError, match=message):
        repair_transformed(model, spec, params, partial, x)
    full = run_many("zipit", spec, params, seed=0, options={"within_model": False}, **inputs)
    repaired = repair_transformed(model, spec, params, full, x)
    targets = transform_targets(model, spec, params, full.merges, x)
    reached = unit_statistics(model, repaired, x, list(targets))
    for point, target in targets.items():
        assert torch.allclose(reached[point].mean, target.mean) and torch.allclose(reached[point].std, target.std)


def test_scores_at_refuses_a_headed_permutation_that_crosses_heads():
    heads = {"Q": Heads(2, "S")}
    scores = init_scores({"P": 3, "Q": 4}, torch.Generator().manual_seed(0), heads=heads)
    crossing = {"P": torch.tensor([2, 0, 1]), "Q": torch.tensor([0, 2, 1, 3])}  # unit 2 of head 1 into head 0
    with pytest.raises(ValueError, match=r"^perm: the permutation of headed group 'Q' crosses heads$"):
        scores_at(scores, crossing, heads)
    headed = {"P": torch.tensor([2, 0, 1]), "Q": torch.tensor([3, 2, 0, 1])}  # heads swapped, one reordered
    hard = hard_permutation(scores_at(scores, headed, heads), tau=0.5, n_iter=20, heads=heads)
    assert {g: p.tolist() for g, p in hard.items()} == {g: p.tolist() for g, p in headed.items()}


def test_zipit_merges_only_models_of_equal_width():
    model, spec, points, params = mlp(0)
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=2, width=WIDTH + 2)
    wider = build_model("mlp", config, seed=1).double().state_dict()
    inputs = {"model": model, "points": points, "data": data(30)}
    with pytest.raises(
        ValueError, match=rf"^ZipIt! merges models of equal width, got widths \[{WIDTH}, {WIDTH + 2}\]$"
    ):
        run_many("zipit", spec, [params, wider], seed=0, **inputs)
    merged = run_many("zipit", spec, [params, params], seed=0, options={"alpha": 0.5}, **inputs).merged
    assert all(torch.allclose(merged[k], v) for k, v in params.items())  # a model zipped with itself


def _linkage(off_diagonal: float, size: int = 3) -> torch.Tensor:
    """A correlation of ``size`` features with ``off_diagonal`` everywhere but features 1 and 2 (0.5, if any)."""
    corr = torch.full((size, size), off_diagonal, dtype=torch.float64)
    if size > 2:
        corr[1, 2] = corr[2, 1] = 0.5
    return corr.fill_diagonal_(1.0)


def test_zip_merges_refuses_a_step_whose_admissible_linkages_are_all_minus_infinity():
    """Three models of one feature: features 1 and 2 merge first, then {0} and {1, 2} at α · min(c01, c02)."""
    message = (
        r"^correlation: after {} of {} merges every admissible pair has linkage -inf; expected entries above -inf$"
    )
    with pytest.raises(ValueError, match=message.format(1, 2)):
        zip_merges(_linkage(-math.inf), [1, 1, 1], True, alpha=0.3, beta=None)
    with pytest.raises(ValueError, match=message.format(0, 1)):
        zip_merges(_linkage(-math.inf, 2), [1, 1], True, alpha=0.3, beta=None)
    assert zip_merges(_linkage(-1e300), [1, 1, 1], True, alpha=0.3, beta=None) == [(1, 2), (0, 1)]
    assert zip_merges(_linkage(math.inf), [1, 1, 1], True, alpha=0.3, beta=None) == [(0, 1), (0, 2)]
    assert zip_merges(_linkage(math.nan), [1, 1, 1], True, alpha=0.3, beta=None) == [(0, 1), (0, 2)]
    corr = _linkage(-math.inf, 4)
    corr[0, 2], corr[2, 0], corr[1, 3], corr[3, 1] = 0.9, 0.9, 0.2, 0.2  # −inf where the greedy never joins
    assert zip_merges(corr, [2, 2], True, alpha=0.3, beta=None) == [(0, 2), (1, 3)]
