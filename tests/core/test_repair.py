"""REPAIR without BatchNorm (core/repair.py) in float64 on the MLP and the ViT: the repaired network's
per-unit statistics equal the interpolated endpoints', the endpoints are returned as they are, the
statistics are the exact per-unit moments, REPAIR commutes with permutations, dead units give no NaN."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.merge import lerp_params
from lmclab.core.repair import (
    Moments,
    RepairAt,
    merged_targets,
    repair_interpolated,
    repair_merged,
    repair_points,
    rescale,
    unit_statistics,
)
from lmclab.core.spec import apply_permutation, random_permutation

ARCHS = {
    "mlp": ({"input_shape": (1, 4, 4), "num_classes": 3, "hidden": 2, "width": 8}, 48),
    "vit": (
        {"input_shape": (1, 28, 28), "num_classes": 10, "patch_size": 7, "width": 16, "heads": 4, "depth": 2},
        20,
    ),
}
TOL = 1e-10


def _setup(arch: str):
    """Skeleton, spec, two float64 endpoints of different seeds, and float64 data."""
    options, n = ARCHS[arch]
    config = make_config(arch, **options)
    model = build_model(arch, config, seed=0).double().eval()
    gen = torch.Generator().manual_seed(7)
    params_a = {k: v + 0.1 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in model.state_dict().items()}
    params_b = {k: v.double() for k, v in build_model(arch, config, seed=1).state_dict().items()}
    data = Split(torch.randn(n, *config.input_shape, generator=gen, dtype=torch.float64), torch.zeros(n).long())
    return model, get_arch(arch).permutation_spec(config), params_a, params_b, data


def _max_gap(stats, targets) -> float:
    return max(
        max((s.mean - t.mean).abs().max().item(), (s.std - t.std).abs().max().item())
        for s, t in zip(stats, targets, strict=True)
    )


def test_default_points_are_the_biased_linears_and_convs_before_the_classifier_in_forward_order():
    model, _, params_a, _, data = _setup("mlp")
    assert repair_points(model, params_a, data) == ["layers.0", "layers.1"]
    model, _, params_a, _, data = _setup("vit")
    block = ["attn.q", "attn.k", "attn.v", "attn.out", "fc1", "fc2"]
    expected = ["embed"] + [f"blocks.{k}.{m}" for k in range(2) for m in block]
    assert repair_points(model, params_a, data) == expected
    assert repair_points(model, params_a, data, ["blocks.1.fc1", "embed"]) == ["embed", "blocks.1.fc1"]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repaired_statistics_equal_the_interpolated_endpoint_statistics(arch):
    model, _, params_a, params_b, data = _setup(arch)
    lam = 0.3
    points = repair_points(model, params_a, data)
    repaired = repair_interpolated(
        model, params_a, params_b, lam, data, batch_size=7
    )  # batches of 7: the moments are merged
    stats_a, stats_b, after, before = (
        unit_statistics(model, p, data, points, batch_size=len(data))
        for p in (params_a, params_b, repaired, lerp_params(params_a, params_b, lam))
    )
    for p in points:
        target_mean = lam * stats_a[p].mean + (1 - lam) * stats_b[p].mean
        target_std = lam * stats_a[p].std + (1 - lam) * stats_b[p].std
        assert (after[p].mean - target_mean).abs().max() < TOL, p
        assert (after[p].std - target_std).abs().max() < TOL, p
    assert max((before[p].std - after[p].std).abs().max().item() for p in points) > 1e-2  # REPAIR did something


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repair_at_the_endpoints_keeps_their_functions(arch):
    model, _, params_a, params_b, data = _setup(arch)
    with torch.no_grad():
        for lam, endpoint in ((1.0, params_a), (0.0, params_b)):  # θ(λ) = λ θa + (1 − λ) θb
            logits = functional_call(model, repair_interpolated(model, params_a, params_b, lam, data), (data.x,))
            assert (logits - functional_call(model, endpoint, (data.x,))).abs().max() < TOL, lam


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_unit_statistics_are_the_per_unit_moments_over_samples_and_positions(arch):
    model, _, _, _, data = _setup(arch)
    with torch.no_grad():  # the skeleton's own parameters, so that its modules can be called directly
        if arch == "mlp":
            outputs = {"layers.0": model.layers[0](data.x.flatten(1))}  # (batch, units)
        else:
            conv = model.embed(data.x)  # (batch, channels, 4, 4): channels on axis 1
            q = model.blocks[0].attn.q(model.blocks[0].norm1(model.tokens(data.x)))  # (batch, tokens, units)
            outputs = {"embed": conv.movedim(1, -1).reshape(-1, 16), "blocks.0.attn.q": q.reshape(-1, 16)}
    stats = unit_statistics(model, model.state_dict(), data, list(outputs), batch_size=7)
    for p, z in outputs.items():
        assert (stats[p].mean - z.mean(0)).abs().max() < TOL, p
        assert (stats[p].std - z.std(0, correction=0)).abs().max() < TOL, p


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repair_commutes_with_permutations(arch):
    model, spec, params_a, params_b, data = _setup(arch)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3), spec.heads)
    permuted = repair_interpolated(
        model, apply_permutation(spec, perm, params_a), apply_permutation(spec, perm, params_b), 0.4, data
    )
    expected = apply_permutation(spec, perm, repair_interpolated(model, params_a, params_b, 0.4, data))
    assert max((permuted[k] - expected[k]).abs().max().item() for k in expected) < TOL


def test_dead_unit_gets_its_mean_and_no_nan():
    model, _, params_a, params_b, data = _setup("mlp")
    params_b = {**params_b, "layers.0.weight": params_b["layers.0.weight"].clone()}
    params_b["layers.0.weight"][0] = -params_a["layers.0.weight"][0]  # unit 0 of θ(½) is constant: σ_m = 0
    repaired = repair_interpolated(model, params_a, params_b, 0.5, data)
    assert all(torch.isfinite(v).all() for v in repaired.values())
    points = ["layers.0", "layers.1"]
    after = unit_statistics(model, repaired, data, points)
    stats_a, stats_b = (unit_statistics(model, p, data, points) for p in (params_a, params_b))
    assert after["layers.0"].std[0] == 0 and stats_a["layers.0"].std[0] > 0
    assert (after["layers.0"].mean - (stats_a["layers.0"].mean + stats_b["layers.0"].mean) / 2).abs().max() < TOL
    assert (after["layers.1"].std - (stats_a["layers.1"].std + stats_b["layers.1"].std) / 2).abs().max() < TOL


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"lam": 1.5}, r"^lam must be in \[0, 1\], got 1.5$"),
        ({"lam": -0.1}, r"^lam must be in \[0, 1\]"),
        ({"lam": float("nan")}, r"^lam must be in \[0, 1\]"),
        ({"points": ["nope"]}, r"^points: 'nope' is not a Linear or Conv2d"),
        ({"points": ["blocks.0.norm1"]}, r"^points: 'blocks.0.norm1' is not a Linear or Conv2d"),
        ({"batch_size": 0}, r"^batch_size must be a positive"),
    ],
)
def test_bad_arguments_give_one_line_errors(kwargs, match):
    model, _, params_a, params_b, data = _setup("vit")
    kwargs = {"lam": 0.5, **kwargs}
    with pytest.raises(ValueError, match=match) as info:
        repair_interpolated(model, params_a, params_b, kwargs.pop("lam"), data, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repair_at_is_repair_at_every_lambda_and_for_each_new_pair_of_endpoints(arch):
    """The measure's REPAIR (RepairAt: endpoint statistics measured once per pair) equals repair_interpolated()."""
    model, spec, params_a, params_b, data = _setup(arch)
    repair_at = RepairAt(model, data)
    perm = random_permutation(spec.group_sizes(params_b), torch.Generator().manual_seed(2), spec.heads)
    other = apply_permutation(spec, perm, params_b)
    for a, b, lam in ((params_a, params_b, 0.3), (params_a, params_b, 0.7), (params_a, other, 0.3)):
        got, want = repair_at(a, b, lam), repair_interpolated(model, a, b, lam, data)
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= TOL
    with pytest.raises(ValueError, match="lam must be in"):
        repair_at(params_a, params_b, 1.5)


def test_the_points_and_batch_size_asked_are_the_ones_repaired_and_read():
    """Off the defaults: only ``layers.1`` repaired (``layers.0`` stays the plain merge, λ = 0.3, weights 0.3/0.7),
    the data read in batches of 20 by the measure's RepairAt and by repair_merged alike."""
    model, _, params_a, params_b, data = _setup("mlp")
    plain = lerp_params(params_a, params_b, 0.3)
    sizes = []
    hook = model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))
    try:
        at = RepairAt(model, data, points=["layers.1"], batch_size=20)(params_a, params_b, 0.3)
        assert max(sizes) == 20 and 8 in sizes  # 48 samples: 20, 20 and 8 in every pass (and 1 to find the points)
        sizes.clear()
        merged = repair_merged(model, [params_a, params_b], data, weights=[0.3, 0.7], points=["layers.1"])
        assert max(sizes) == 48  # the default batch of 500
    finally:
        hook.remove()
    want = repair_interpolated(model, params_a, params_b, 0.3, data, points=["layers.1"])
    for repaired in (at, merged):
        assert all(torch.equal(repaired[k], plain[k]) for k in plain if k.startswith("layers.0."))
        assert max((repaired[k] - want[k]).abs().max().item() for k in want) <= TOL
    assert not torch.equal(at["layers.1.weight"], plain["layers.1.weight"])


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repair_merged_of_two_endpoints_is_repair_at_their_weights(arch):
    model, _, params_a, params_b, data = _setup(arch)
    lam = 0.3
    pair = repair_interpolated(model, params_a, params_b, lam, data)
    many = repair_merged(model, [params_a, params_b], data, weights=[lam, 1 - lam])
    assert max((pair[k] - many[k]).abs().max().item() for k in pair) < TOL


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_repair_merged_sets_each_unit_to_the_weighted_endpoint_statistics(arch):
    model, spec, params_a, params_b, data = _setup(arch)
    perm = random_permutation(spec.group_sizes(params_b), torch.Generator().manual_seed(3), spec.heads)
    third = apply_permutation(spec, perm, params_b)
    third = {k: v * 1.1 if v.is_floating_point() else v for k, v in third.items()}  # other statistics
    aligned, weights = [params_a, params_b, third], [0.5, 0.2, 0.3]
    points = repair_points(model, params_a, data)
    repaired = repair_merged(model, aligned, data, weights=weights, batch_size=9)
    stats = [unit_statistics(model, p, data, points, batch_size=len(data)) for p in aligned]
    after = unit_statistics(model, repaired, data, points, batch_size=len(data))
    for p in points:
        target_mean = sum(w * s[p].mean for w, s in zip(weights, stats, strict=True))
        target_std = sum(w * s[p].std for w, s in zip(weights, stats, strict=True))
        assert (after[p].mean - target_mean).abs().max() < TOL, p
        assert (after[p].std - target_std).abs().max() < TOL, p
    equal = repair_merged(model, aligned, data)  # default weights: 1/N each
    mean = unit_statistics(model, equal, data, points[:1], batch_size=len(data))[points[0]].mean
    assert (mean - sum(s[points[0]].mean for s in stats) / 3).abs().max() < TOL


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([0.5, 0.6], "weights must be 2 non-negative numbers summing to 1"),
        ([1.0], "weights must be 2"),
        ([1.5, -0.5], r"weights must be 2 non-negative numbers summing to 1, got \[1.5, -0.5\]"),  # sums to 1
    ],
    ids=["sum", "length", "negative"],
)
def test_repair_merged_refuses_bad_weights_in_one_line(weights, match):
    model, _, params_a, params_b, data = _setup("mlp")
    with pytest.raises(ValueError, match=match):
        repair_merged(model, [params_a, params_b], data, weights=weights)


def test_repair_merged_of_one_endpoint_returns_it():
    model, _, params_a, _, data = _setup("mlp")
    alone = repair_merged(model, [params_a], data)  # its own statistics are the targets
    assert max((alone[k] - params_a[k]).abs().max().item() for k in params_a) < TOL


def test_repair_merged_reads_the_data_in_batches_of_batch_size():
    model, _, params_a, params_b, data = _setup("mlp")  # 48 samples
    sizes = []
    hook = model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))
    try:
        repair_merged(model, [params_a, params_b], data, batch_size=20)
    finally:
        hook.remove()
    assert max(sizes) == 20 and sizes.count(8) == sizes.count(20) // 2  # each pass: 20, 20 and 8


def test_merged_targets_read_the_data_in_batches_of_500_by_default():
    model, _, params_a, _, _ = _setup("mlp")
    data = Split(torch.zeros(501, 1, 4, 4, dtype=torch.float64), torch.zeros(501, dtype=torch.long))
    sizes = []
    hook = model.register_forward_pre_hook(lambda _m, args: sizes.append(len(args[0])))
    try:
        merged_targets(model, [params_a], data)
    finally:
        hook.remove()
    assert max(sizes) == 500 and 1 in sizes


def test_a_unit_with_zero_mean_and_zero_std_is_dead_not_divided_by_zero():
    """The dead-unit threshold σ_m ≤ 64·eps·|μ_m| includes its boundary: an all-zero unit (σ_m = μ_m = 0)
    keeps s = 1 and only moves its mean; a live unit gets s = σ_t / σ_m (closed form, off λ = ½)."""
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    params = {"fc.weight": weight, "fc.bias": torch.tensor([0.5, -1.0], dtype=torch.float64)}
    merged = Moments(
        mean=torch.tensor([0.0, 1.0], dtype=torch.float64), std=torch.tensor([0.0, 2.0], dtype=torch.float64)
    )
    target = Moments(
        mean=torch.tensor([5.0, 6.0], dtype=torch.float64), std=torch.tensor([3.0, 0.5], dtype=torch.float64)
    )
    out = rescale(params, "fc", merged, target)
    assert torch.equal(out["fc.weight"], torch.tensor([[1.0, 2.0], [0.75, 1.0]], dtype=torch.float64))
    assert torch.equal(out["fc.bias"], torch.tensor([0.5 + 5.0, 0.25 * (-1.0 - 1.0) + 6.0], dtype=torch.float64))


def test_repair_merged_refuses_no_models_and_repair_at_takes_batches_of_one():
    model, _, params_a, params_b, data = _setup("mlp")
    with pytest.raises(ValueError, match=r"^aligned must hold at least one model, got none$"):
        repair_merged(model, [], data)
    one = RepairAt(model, data, batch_size=1)(params_a, params_b, 0.3)  # the smallest batch is allowed
    full = RepairAt(model, data, batch_size=len(data))(params_a, params_b, 0.3)
    assert all(torch.allclose(one[k], full[k], atol=1e-9) for k in full)


def test_measuring_with_repair_says_which_repair_and_keeps_the_unrepaired_barriers():
    from lmclab.core.interpolation import measure_pair_with_repair

    model, spec, params_a, params_b, data = _setup("mlp")
    lams, splits = [0.0, 0.3, 0.5, 1.0], {"test": data}
    rows, summary = measure_pair_with_repair(
        spec, model, params_a, params_b, params_b, lams, splits, repair=None, repair_at=RepairAt(model, data)
    )
    assert summary["ln_repair"] is True and summary["bn_repair"] is False
    assert {k for k in summary if k.startswith("norepair_")} and [r["repair"] for r in rows].count(True) == len(lams)
    plain_rows, plain = measure_pair_with_repair(spec, model, params_a, params_b, params_b, lams, splits, repair=None)
    assert plain["ln_repair"] is False and plain["bn_repair"] is False
    assert not any(k.startswith("norepair_") for k in plain) and not any(r["repair"] for r in plain_rows)
