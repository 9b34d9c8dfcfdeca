"""Refusals of the core that the rest of the suite reaches only through other processes or not at all:
each is one line naming what it is about, raised before any work, and the accepted side of its bound
passes (barriers, REPAIR's batches, residual blocks' shortcuts, merge transforms and partial zips too)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.core import device as device_module
from lmclab.core.bn_repair import bn_repair_hook, repair_bn
from lmclab.core.data import Split
from lmclab.core.heads import Heads
from lmclab.core.interpolation import interpolation_curve, measure_pair
from lmclab.core.metrics import barrier
from lmclab.core.repair import Moments, RepairAt, repair_interpolated, repair_merged, repair_to, unit_statistics
from lmclab.core.spec import PermutationSpec, Segment, apply_permutation, check_permutation
from lmclab.core.spec_builders import basic_block, bottleneck
from lmclab.core.transform import partial_merge, permutation_transforms, transform_merge


def test_a_device_is_auto_cpu_or_an_available_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_module.resolve_device("auto") == device_module.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^device: 'cuda:1' requested but CUDA is not available; use auto or cpu$"):
        device_module.resolve_device("cuda:1")
    with pytest.raises(ValueError, match=r"^device: unknown device 'gpu'; expected auto, cpu or cuda\[:N\]$"):
        device_module.resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_module.resolve_device("auto") == torch.device("cuda")  # recorded, not used: no GPU here


def test_the_machine_is_named_by_its_cpu_model_where_linux_lists_one() -> None:
    from pathlib import Path

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    if not names:
        pytest.skip("no CPU model name in /proc/cpuinfo on this machine")
    assert device_module.describe_machine()["cpu"] == names[0]


def test_the_machine_names_its_gpu_under_gpu_or_says_none(monkeypatch) -> None:
    keys = {"cpu", "cores", "gpu", "torch", "torch_threads", "python", "os"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert set(device_module.describe_machine()) == keys and device_module.describe_machine()["gpu"] == "none"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"Test GPU {index}")
    assert device_module.describe_machine()["gpu"] == "Test GPU 0"


def _net() -> tuple[nn.Module, dict, dict[str, Split]]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    data = Split(torch.randn(12, 4), torch.randint(0, 3, (12,)))
    return net, dict(net.state_dict()), {"test": data}


def test_a_curve_takes_one_repair_and_a_grid_with_both_ends_and_the_midpoint() -> None:
    net, params, splits = _net()
    spec = PermutationSpec({k: (None,) * v.dim() for k, v in params.items()})
    with pytest.raises(ValueError, match=r"^repair, repair_at: expected at most one of them$"):
        interpolation_curve(net, params, params, [0.0, 1.0], splits, repair=lambda p: p, repair_at=lambda lam: params)
    for lams in ([0.0, 0.25, 1.0], [0.25, 0.5, 1.0], [0.0, 0.5, 0.75]):  # each of the three missing in turn
        with pytest.raises(ValueError, match=r"^the λ grid must contain 0, ½ and 1$"):
            measure_pair(spec, net, params, params, params, lams, splits)
    curve, _ = measure_pair(spec, net, params, params, params, [0.0, 0.5, 1.0], splits)
    assert sorted({row["lam"] for row in curve}) == [0.0, 0.5, 1.0]


def test_bn_repair_needs_a_positive_batch() -> None:
    net, params, splits = _net()
    with pytest.raises(ValueError, match=r"^BN repair batch_size must be positive, got 0$"):
        repair_bn(net, params, splits["test"], batch_size=0)
    assert set(repair_bn(net, params, splits["test"], batch_size=5)) == set(params)


def test_a_bn_repair_hook_repairs_in_batches_of_its_batch_size() -> None:
    net, params, splits = _net()
    hook = bn_repair_hook(net, splits["test"], repair_samples=None, batch_size=5)
    assert int(hook(params)["1.num_batches_tracked"]) == 3  # 5 + 5 + 2 of the 12 samples
    with pytest.raises(ValueError, match=r"^BN repair batch_size must be positive, got 0$"):
        bn_repair_hook(net, splits["test"], repair_samples=None, batch_size=0)(params)


def test_a_spec_refuses_tensors_of_other_ranks_and_heads_it_cannot_place() -> None:
    params = {"w": torch.zeros(4, 3), "b": torch.zeros(4)}
    spec = PermutationSpec({"w": ("P", None), "b": ("P",)})
    spec.check(params)
    with pytest.raises(ValueError, match=r"^model_b: 'b' has 2 axes, the spec declares 1$"):
        spec.check({**params, "b": torch.zeros(4, 1)}, "model_b")
    lost = PermutationSpec(spec.axes, heads={"Q": Heads(2, "T")})
    with pytest.raises(ValueError, match=r"^state_dict: headed group 'Q' acts on no axis of the spec$"):
        lost.check(params)
    tied = PermutationSpec({"w": ("P", "R"), "b": ("P",)}, heads={"P": Heads(2, "T"), "R": Heads(2, "T")})
    tied.check({"w": torch.zeros(4, 6), "b": torch.zeros(4)})  # one head count per tie: accepted
    two = PermutationSpec({"w": ("P", "R"), "b": ("P",)}, heads={"P": Heads(2, "T"), "R": Heads(3, "T")})
    with pytest.raises(ValueError, match=r"^state_dict: groups tied by 'T' have different numbers of heads$"):
        two.check({"w": torch.zeros(4, 6), "b": torch.zeros(4)})


def test_a_permutation_names_exactly_the_specs_groups() -> None:
    check_permutation({"P": torch.tensor([1, 0])}, {"P": 2})
    with pytest.raises(ValueError, match=r"^permutation groups \['Q'\] do not match the spec's \['P'\]$"):
        check_permutation({"Q": torch.tensor([1, 0])}, {"P": 2})


def test_a_barrier_needs_both_endpoints_in_its_grid() -> None:
    """λ = 1 is θa: losses (1.0 at θb, 0.5 at θa) and accuracies against the line between unequal endpoints."""
    assert barrier([0.0, 0.25, 1.0], [1.0, 1.5, 0.5]) == pytest.approx(1.5 - (0.25 * 0.5 + 0.75 * 1.0))
    assert barrier([1.0, 0.25, 0.0], [0.8, 0.6, 0.9], higher_is_better=True) == pytest.approx(0.875 - 0.6)
    assert barrier([0.0, 0.5, 1 - 1e-12], [1.0, 2.0, 0.0]) == pytest.approx(1.5)  # 1 up to rounding: accepted
    refused = {
        "0.25 to 1": [0.25, 0.5, 1.0],
        "0 to 0.75": [0.0, 0.5, 0.75],
        "0 to inf": [0.0, 0.5, float("inf")],
        "-inf to 1": [float("-inf"), 0.5, 1.0],
        "nan to nan": [0.0, float("nan"), 1.0],
    }
    for span, lams in refused.items():
        with pytest.raises(ValueError, match=rf"^lams: the λ grid must contain both endpoints 0 and 1, got {span}$"):
            barrier(lams, [1.0, 2.0, 3.0])


def _repair_net() -> tuple[nn.Module, dict, dict, Split]:
    """A float64 MLP 3 → 4 → 2, two endpoints and 9 samples."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double().eval()
    gen = torch.Generator().manual_seed(1)
    params_a = dict(model.state_dict())
    params_b = {k: v + 0.5 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params_a.items()}
    return model, params_a, params_b, Split(torch.randn(9, 3, generator=gen, dtype=torch.float64), torch.zeros(9))


def test_repair_to_targets_needs_a_positive_batch() -> None:
    model, params, _, data = _repair_net()
    target = Moments(torch.tensor([1.0, -2.0, 0.5, 3.0]).double(), torch.tensor([0.5, 2.0, 1.0, 0.25]).double())
    with pytest.raises(ValueError, match=r"^batch_size must be a positive number of samples, got 0$"):
        repair_to(model, params, data, {"0": target}, batch_size=0)
    repaired = repair_to(model, params, data, {"0": target}, batch_size=1)
    reached = unit_statistics(model, repaired, data, ["0"], batch_size=4)["0"]
    assert torch.allclose(reached.mean, target.mean) and torch.allclose(reached.std, target.std)


def test_repair_merged_refuses_a_batch_of_no_samples_before_measuring() -> None:
    model, params_a, params_b, data = _repair_net()
    for size in (0, -1):
        with pytest.raises(ValueError, match=rf"^batch_size must be a positive number of samples, got {size}$"):
            repair_merged(model, [params_a, params_b], data, weights=[0.25, 0.75], batch_size=size)
    merged = repair_merged(model, [params_a, params_b], data, weights=[0.25, 0.75], batch_size=1)
    assert merged.keys() == params_a.keys()


def test_repair_at_needs_a_positive_batch() -> None:
    model, params_a, params_b, data = _repair_net()
    with pytest.raises(ValueError, match=r"^batch_size must be a positive number of samples, got 0$"):
        RepairAt(model, data, batch_size=0)
    repaired = RepairAt(model, data, batch_size=1)(params_a, params_b, 0.25)
    expected = repair_interpolated(model, params_a, params_b, 0.25, data, batch_size=4)
    assert repaired.keys() == expected.keys() and all(torch.allclose(repaired[k], expected[k]) for k in expected)
    assert not torch.allclose(repaired["0.weight"], 0.25 * params_a["0.weight"] + 0.75 * params_b["0.weight"])


def test_a_residual_block_without_projection_reads_and_writes_one_stream() -> None:
    for build, mid in ((basic_block, "P_m"), (bottleneck, ("P_m", "P_n"))):
        with pytest.raises(ValueError, match=r"^layer1\.0: an identity shortcut needs the same stream in and out$"):
            build("layer1.0", "P_in", "P_out", mid, downsample=False)
        same = build("layer1.0", "P_in", "P_in", mid, downsample=False)
        assert same["layer1.0.conv1.weight"][1] == "P_in" and "layer1.0.downsample.0.weight" not in same
        projected = build("layer1.0", "P_in", "P_out", mid, downsample=True)
        assert projected["layer1.0.downsample.0.weight"] == ("P_out", "P_in", None, None)


def _two_models(spec: PermutationSpec) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(2)
    shapes = {"w": (5, 3), "b": (5,), "o": (2, 5)}
    return [{k: torch.randn(shapes[k], generator=gen, dtype=torch.float64) for k in spec.axes} for _ in range(2)]


def test_merge_transforms_are_one_per_model() -> None:
    spec = PermutationSpec({"w": ("P", None), "b": ("P",), "o": (None, "P")})
    params, weights = _two_models(spec), [0.25, 0.75]
    perms = [{"P": torch.arange(5)}, {"P": torch.tensor([3, 0, 4, 1, 2])}]
    merges, unmerges = permutation_transforms(perms, weights)
    with pytest.raises(ValueError, match=r"^merges and unmerges must hold one transform per model \(2\), got 1 and 2$"):
        transform_merge(spec, params, merges[:1], unmerges, weights=weights)
    with pytest.raises(ValueError, match=r"^merges and unmerges must hold one transform per model \(0\), got 0 and 0$"):
        transform_merge(spec, [], [], [])
    with pytest.raises(ValueError, match=r"^merges and unmerges must hold one transform per model \(0\), got 0 and 0$"):
        partial_merge(spec, [], [], [], ["P"])
    with pytest.raises(ValueError, match=r"^weights: there is no model to weigh \(got none\)$"):
        permutation_transforms([])
    merged = transform_merge(spec, params, merges, unmerges, weights=weights)
    aligned = [apply_permutation(spec, perm, p) for perm, p in zip(perms, params, strict=True)]
    assert all(torch.allclose(merged[k], 0.25 * aligned[0][k] + 0.75 * aligned[1][k]) for k in spec.axes)


def test_a_partial_zip_cannot_split_the_groups_one_layer_produces() -> None:
    """``w`` produces 2 units of P beside 3 of Q on one axis: zipping P alone would share half of its rows."""
    both = (Segment("P", 2), Segment("Q", 3))
    spec = PermutationSpec({"w": (both, None), "b": (both,), "o": (None, both)})
    params = _two_models(spec)
    perms = [{"P": torch.arange(2), "Q": torch.arange(3)}, {"P": torch.tensor([1, 0]), "Q": torch.tensor([2, 0, 1])}]
    merges, unmerges = permutation_transforms(perms, [0.25, 0.75])
    message = r"^partial zip: 'w' produces zipped and unzipped groups \['P', 'Q'\]$"
    with pytest.raises(ValueError, match=message):
        partial_merge(spec, params, merges, unmerges, ["P"], weights=[0.25, 0.75])
    nets = partial_merge(spec, params, merges, unmerges, ["P", "Q"], weights=[0.25, 0.75])
    whole = transform_merge(spec, params, merges, unmerges, weights=[0.25, 0.75])
    assert all(torch.allclose(net[k], whole[k]) for net in nets for k in spec.axes)  # every layer shared
