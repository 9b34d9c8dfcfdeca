"""The public API's n-model merge (``lmclab.merge_many``), repair (``lmclab.repair``), the argument
order of ``lmclab.apply_permutation``, the short reprs, ``Curve.to_frame`` and the data-needing methods
read off the registry."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn
from torch.func import functional_call

import lmclab
from lmclab.core.merge import lerp_params
from lmclab.core.repair import repair_interpolated, repair_points, unit_statistics
from lmclab.core.spec import random_permutation
from lmclab.search import METHODS, needs_data, needs_model
from lmclab.search.many_methods import MANY_METHODS
from lmclab.trace import trace, trace_spec


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _copies(net: nn.Module, x: torch.Tensor, n: int = 3) -> list[dict]:
    """``net``'s state dict and n − 1 randomly permuted copies of it (the same function)."""
    spec = trace_spec(net, x)
    sizes = spec.group_sizes(net.state_dict())
    perms = [random_permutation(sizes, torch.Generator().manual_seed(s)) for s in range(1, n)]
    return [net.state_dict()] + [lmclab.apply_permutation(spec, p, net.state_dict()) for p in perms]


def _close(a: dict, b: dict, atol: float = 1e-5) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol) for k in a)


def test_apply_permutation_takes_spec_perm_params_and_round_trips() -> None:
    net, x = _mlp(0), torch.randn(8, 12)
    spec = trace_spec(net, x)
    perm = random_permutation(spec.group_sizes(net.state_dict()), torch.Generator().manual_seed(3))
    moved = lmclab.apply_permutation(spec, perm, net.state_dict())
    assert torch.allclose(functional_call(net, moved, (x,)), net(x), atol=1e-6)  # the same function
    back = lmclab.apply_permutation(spec, {g: p.argsort() for g, p in perm.items()}, moved)
    assert _close(back, net.state_dict(), atol=0)
    wrong = {g: p.roll(1) for g, p in perm.items()}  # negative control: another π is another model
    half = {**moved, **{k: v for k, v in lmclab.apply_permutation(spec, wrong, net.state_dict()).items() if "3." in k}}
    assert not torch.allclose(functional_call(net, half, (x,)), net(x), atol=1e-3)
    refusal = r"^perm and params must be mappings \(group -> index tensor; name -> tensor\), in that order$"
    with pytest.raises(TypeError, match=refusal):
        lmclab.apply_permutation(spec, net.state_dict(), list(perm.values()))
    with pytest.raises(TypeError, match=refusal):  # a list of index tensors is no perm, whatever params is
        lmclab.apply_permutation(spec, list(perm.values()), net.state_dict())
    short = {k: v for k, v in net.state_dict().items() if k != "5.bias"}
    with pytest.raises(ValueError, match=r"^params: keys do not match the permutation spec \(missing \['5\.bias'\]"):
        lmclab.apply_permutation(spec, perm, short)


def test_data_needing_methods_are_read_off_the_registry() -> None:
    assert [m for m in METHODS if needs_data(m)] == ["am", "ste", "ste_sinkhorn"]
    assert [m for m in MANY_METHODS if needs_data(m)] == ["cca", "zipit"]
    assert needs_model("am") and not needs_model("wm") and not needs_data("c2m3")
    unknown = (
        "method: unknown method 'nope'; expected one of ['identity', 'wm', 'am', 'ste', 'wm_sinkhorn', 'ste_sinkhorn', "
        "'merge_many', 'c2m3', 'sync', 'star', 'cca', 'zipit']"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(unknown)}$"):
        needs_data("nope")


def test_a_many_merge_built_with_its_defaults_shows_no_models_and_no_groups() -> None:
    assert repr(lmclab.ManyMerge("merge_many", None)) == "ManyMerge(method='merge_many', 0 models, 0 groups {})"


def test_a_many_merge_built_with_one_permutation_shows_its_groups() -> None:
    built = lmclab.ManyMerge("merge_many", None, perms=[{"P_0": torch.tensor([2, 0, 1])}])
    assert repr(built).endswith(", 1 group {P_0: 3})")


def test_a_transform_merge_shows_the_units_each_group_is_merged_into() -> None:
    zipped = lmclab.ManyMerge("zipit", None, merges=[{"P_0": torch.zeros(4, 8)}] * 2, repair="bn")
    assert repr(zipped) == "ManyMerge(method='zipit', 2 models, 1 group {P_0: 4}, repair='bn')"


@pytest.mark.parametrize("method", ["merge_many", "star", "c2m3"])
def test_merge_many_recovers_three_permuted_copies(method: str) -> None:
    net, x = _mlp(0), torch.randn(8, 12)
    copies = _copies(net, x)
    res = lmclab.merge_many([net, *copies[1:]], method=method, example_inputs=x, device="cpu")
    assert len(res.aligned) == 3 and all(_close(a, res.aligned[0]) for a in res.aligned)  # one frame
    assert _close(res.merged, res.aligned[0])  # the merge is each copy, in the common frame
    assert torch.allclose(functional_call(net, res.merged, (x,)), net(x), atol=1e-5)  # the same function
    assert len(res.perms) == 3 and res.merges == [] and res.repair is None
    assert repr(res).startswith(f"ManyMerge(method={method!r}, 3 models, 2 groups {{P_0: 16, P_1: 16}}")
    assert "tensor" not in repr(res)
    naive = {k: torch.stack([c[k] for c in copies]).mean(0) for k in copies[0]}
    assert not torch.allclose(functional_call(net, naive, (x,)), net(x), atol=1e-3)  # negative control


def test_merge_many_with_a_transform_method_reads_data_and_repairs() -> None:
    net, x = _mlp(0), torch.randn(256, 12)
    copies = _copies(net, x[:2])
    data = (x, torch.randint(0, 3, (256,)))
    res = lmclab.merge_many(copies, method="zipit", model=net, data=data, device="cpu")
    assert res.aligned == [] and len(res.merges) == 3 and res.perms == []
    assert torch.allclose(functional_call(net, res.merged, (x,)), net(x), atol=1e-4)  # copies zip to the net
    fixed = lmclab.merge_many(copies, method="cca", model=net, data=data, repair="auto", device="cpu")
    assert fixed.repair == "repair" and torch.allclose(functional_call(net, fixed.merged, (x,)), net(x), atol=1e-3)


def test_merge_many_with_a_given_spec_still_runs_the_module_for_a_transform_method_and_for_a_repair() -> None:
    net, x = _mlp(0), torch.randn(256, 12)
    copies, traced = _copies(net, x[:2]), trace(net, x[:2])
    spec, points, data = traced.spec, traced.points, (x, torch.randint(0, 3, (256,)))
    zipped = lmclab.merge_many(copies, method="zipit", spec=spec, points=points, model=net, data=data, device="cpu")
    assert torch.allclose(functional_call(net, zipped.merged, (x,)), net(x), atol=1e-4)  # copies zip to the net
    fixed = lmclab.merge_many(copies, spec=spec, model=net, data=data, repair="repair", device="cpu")
    assert fixed.repair == "repair" and torch.allclose(functional_call(net, fixed.merged, (x,)), net(x), atol=1e-4)


def test_the_repair_of_a_merge_reads_the_aligned_models() -> None:
    """REPAIR of an n-model merge measures the endpoints in the common frame: on permuted copies the
    repaired merge is the net's function again; the unaligned copies' statistics would move its units."""
    net, x = _mlp(0), torch.randn(256, 12)
    copies = _copies(net, x[:2])
    data = (x, torch.zeros(256))
    res = lmclab.merge_many(copies, model=net, data=data, repair="repair", repair_samples=None, device="cpu")
    assert res.repair == "repair"
    assert torch.allclose(functional_call(net, res.merged, (x,)), net(x), atol=1e-4)
    plain = lmclab.merge_many(copies, model=net, example_inputs=x[:2], device="cpu")
    unaligned = lmclab.repair(net, plain.merged, copies, data=data, repair="repair", repair_samples=None, device="cpu")
    assert not torch.allclose(functional_call(net, unaligned, (x,)), net(x), atol=1e-2)  # negative control


def test_merge_many_leaves_the_callers_module_and_state_dicts_alone() -> None:
    net, x = _mlp(0), torch.randn(8, 12)
    copies = _copies(net, x)
    before = [{k: v.clone() for k, v in c.items()} for c in copies]
    net.train()
    lmclab.merge_many(copies, model=net, example_inputs=x, repair="repair", data=(x, torch.zeros(8)), device="cpu")
    assert net.training and all(_close(c, b, atol=0) for c, b in zip(copies, before, strict=True))


AT_LEAST_2 = "models: expected a list of at least 2 models (nn.Modules, state dicts or checkpoint paths)"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, x: lmclab.merge_many([m], example_inputs=x), AT_LEAST_2),
        (lambda m, x: lmclab.merge_many(m, example_inputs=x), AT_LEAST_2),
        (lambda m, x: lmclab.merge_many({m, copy.deepcopy(m)}, example_inputs=x), AT_LEAST_2),  # no order
        (
            lambda m, x: lmclab.merge_many([m, m], method="wm", example_inputs=x),
            "method: unknown n-model method 'wm'; expected one of ['merge_many', 'c2m3', 'sync', 'star', 'cca', "
            "'zipit']",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], method="cca", example_inputs=x),
            "data: method 'cca' reads the models' activations and needs training data",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], options={"seed": 1}, example_inputs=x),
            "options: unknown option(s) ['seed']; expected some of ['lap_backend', 'max_iter', 'tol', 'wm_max_iter']",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], options={"max_iter": 0}, example_inputs=x),
            "options['max_iter'] must be a positive integer, got 0",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], repair="bn", example_inputs=x),
            "data: repair='bn' needs training data to measure the statistics on",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], repair="x", example_inputs=x),
            "repair must be one of ['auto', 'none', 'bn', 'repair'], got 'x'",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m], repair="bn", data=(x, torch.zeros(8))),
            "repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm",
        ),
        (
            lambda m, x: lmclab.merge_many([m, {**m.state_dict(), "3.bias": torch.zeros(5)}], example_inputs=x),
            "models[1]: tensor '3.bias' has shape (5,), models[0]'s (16,)"
            " (a model of other widths: pass its module, whose forward is traced)",
        ),
        (
            lambda m, x: lmclab.merge_many([m, m, {k: torch.zeros(2) for k in "wxyz"}], example_inputs=x),
            "models[2]: tensor names differ from models[0]'s (missing ['1.bias', '1.weight', '3.bias'], extra ['w', "
            "'x', 'y'])",  # the first three of each
        ),
    ],
)
def test_merge_many_refuses_bad_calls_in_one_line_before_any_search(call, message: str, monkeypatch) -> None:
    import lmclab.search.many_methods as many

    def never(*args, **kwargs):
        raise AssertionError("a search ran before the call was checked")

    monkeypatch.setattr(many, "run_many", never)
    monkeypatch.setattr("lmclab.api.many.run_many", never)
    with pytest.raises((ValueError, TypeError), match=f"^{re.escape(message)}$"):
        call(_mlp(0), torch.randn(8, 12))


def test_repair_with_unequal_endpoint_weights_is_repair_of_the_interpolated_pair() -> None:
    net, x = _mlp(0), torch.randn(300, 12) * 2
    a, b = _mlp(0).state_dict(), _mlp(1).state_dict()
    lam, data = 0.3, (x, torch.zeros(300))
    merged = lerp_params(a, b, lam)
    fixed = lmclab.repair(net, merged, [a, b], data=data, repair="repair", weights=[lam, 1 - lam], device="cpu")
    expected = repair_interpolated(net, a, b, lam, lmclab.as_split(data))
    assert _close(fixed, expected, atol=1e-5)
    split = lmclab.as_split(data)
    points = repair_points(net, a, split)
    stats = [unit_statistics(net, p, split, points) for p in (a, b, fixed, merged)]
    for point in points:
        target = lam * stats[0][point].std + (1 - lam) * stats[1][point].std
        assert torch.allclose(stats[2][point].std, target, atol=1e-4)
        assert not torch.allclose(stats[3][point].std, target, atol=1e-2)  # the plain merge had lost variance
    even = lmclab.repair(net, merged, [a, b], data=data, repair="repair", device="cpu")  # weights ½, ½
    assert not _close(even, fixed, atol=1e-3)
    assert _close(merged, lerp_params(a, b, lam), atol=0)  # the caller's state dict is untouched


def test_repair_bn_recomputes_the_running_statistics() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(300, 6) * 3 + 1
    fixed = lmclab.repair(net, net.state_dict(), data=(x, torch.zeros(300)), device="cpu")  # auto: bn
    h = net[0](x)
    assert torch.allclose(fixed["1.running_mean"], h.mean(0), atol=1e-4)
    assert not torch.allclose(net.state_dict()["1.running_mean"], h.mean(0), atol=1e-2)
    more = (torch.randn(501, 6), torch.zeros(501))  # by default a fixed subset of 500 samples
    default = lmclab.repair(net, net.state_dict(), data=more, device="cpu")
    assert _close(default, lmclab.repair(net, net.state_dict(), data=more, repair_samples=500, device="cpu"), atol=0)
    assert not _close(default, lmclab.repair(net, net.state_dict(), data=more, repair_samples=None, device="cpu"))


NO_MODEL = "must be an nn.Module, a state dict of tensors or a checkpoint path, got int"
OTHER_NAMES = "tensor names differ from merged_params's (missing ['1.bias', '1.weight', '3.bias'], extra ['x'])"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repair": "bn"}, "repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm"),
        ({"repair": "nope"}, "repair must be one of ['auto', 'none', 'bn', 'repair'], got 'nope'"),
        ({"repair": "none"}, "repair: 'none' repairs nothing; expected bn, repair or auto"),
        (
            {"repair": "repair", "endpoints": []},
            "endpoints: repair='repair' needs the merged models (their statistics are the targets)",
        ),
        ({"repair": "repair", "endpoints": [{"x": torch.zeros(1)}]}, f"endpoints[0]: {OTHER_NAMES}"),
        ({"endpoints": [_mlp(1).state_dict(), {"x": torch.zeros(1)}]}, f"endpoints[1]: {OTHER_NAMES}"),
        ({"repair_samples": 0}, "repair_samples must be a positive number of images or null, got 0"),
        ({"endpoints": [1, 2]}, f"endpoints[0] {NO_MODEL}"),
        ({"endpoints": [_mlp(1).state_dict(), 2]}, f"endpoints[1] {NO_MODEL}"),
        ({"endpoints": ["a", "b"]}, "endpoints[0]: a: no such file or folder"),
        ({"endpoints": [_mlp(1).state_dict(), "b"]}, "endpoints[1]: b: no such file or folder"),
    ],
)
def test_repair_refuses_bad_calls_in_one_line(kwargs: dict, message: str) -> None:
    net = _mlp(0)
    call = {"endpoints": [net.state_dict()], **kwargs}
    with pytest.raises((ValueError, TypeError, FileNotFoundError), match=f"^{re.escape(message)}$"):
        lmclab.repair(net, net.state_dict(), data=(torch.randn(8, 12), torch.zeros(8)), device="cpu", **call)
    bn = nn.Sequential(nn.Linear(12, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match=r"^repair: 'repair' does not fit this model; use bn: the model has BatchNorm"):
        lmclab.repair(
            bn, bn.state_dict(), [bn.state_dict()], data=(torch.randn(8, 12), torch.zeros(8)), repair="repair"
        )


def test_alignment_and_curve_have_short_reprs_and_the_curve_a_frame() -> None:
    a, b, x = _mlp(0), _mlp(1), torch.randn(32, 12)
    res = lmclab.find_permutation(a, b, example_inputs=x, device="cpu")
    assert repr(res).startswith("Alignment(method='wm', 2 groups {P_0: 16, P_1: 16}, ")
    assert "tensor" not in repr(res) and len(repr(res)) < 200
    stats = {"seconds": 1.5, "stalled": True, "curve": [1.0], "sweeps": 3, "objective": 2.25, "epochs": 7}
    assert repr(lmclab.Alignment("wm", res.spec, res.perm, stats)) == (
        "Alignment(method='wm', 2 groups {P_0: 16, P_1: 16}, seconds=1.5, sweeps=3, objective=2.25)"
    )  # the first three numbers
    curve = lmclab.curve(a, res.apply(b), eval_data=(x, torch.randint(0, 3, (32,))), num_lambdas=3, device="cpu")
    assert repr(curve) == f"Curve(splits=['test'], 3 λ values, loss barrier {curve.barrier():.4g} on 'test')"
    frame = curve.to_frame()
    assert list(frame.columns) == ["lam", "split", "loss", "acc"] and len(frame) == 3
    assert frame["loss"].tolist() == [r["loss"] for r in curve.rows]
    rows = [{"split": "test", "acc": 0.5, "loss": 1.0, "lam": 0.0, "seconds": 2.0}]  # rows of one's own, more keys
    assert list(lmclab.Curve(rows).to_frame().columns) == ["lam", "split", "loss", "acc"]


def test_as_split_keeps_integer_token_inputs_integers() -> None:
    tokens, y = torch.randint(0, 50, (4, 7)), torch.tensor([0, 1, 0, 1], dtype=torch.int32)
    assert lmclab.as_split((tokens, y)).x.dtype == torch.int64
    assert (
        lmclab.as_split([(tokens, y)]).x.dtype == torch.int64 and lmclab.as_split([(tokens, y)]).y.dtype == torch.int64
    )
    half = torch.randn(4, 3).double()
    assert lmclab.as_split((half, y)).x.dtype == torch.float64


def test_a_dataloader_is_streamed_batch_by_batch_with_the_numbers_of_the_whole_split(monkeypatch) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    a, b = _mlp(0), _mlp(1)
    x, y = torch.randn(100, 12), torch.randint(0, 3, (100,), dtype=torch.int32)  # int32 labels: read as classes
    held = lmclab.curve(a, b, eval_data=(x, y), num_lambdas=3, device="cpu")

    def never(*args, **kwargs):
        raise AssertionError("a DataLoader was concatenated into memory")

    monkeypatch.setattr("lmclab.api.curves.as_split", never)
    streamed = lmclab.curve(a, b, eval_data=DataLoader(TensorDataset(x, y), batch_size=30), num_lambdas=3, device="cpu")
    assert [r["lam"] for r in streamed.rows] == [r["lam"] for r in held.rows]
    for r, s in zip(streamed.rows, held.rows, strict=True):
        assert r["loss"] == pytest.approx(s["loss"], rel=1e-5) and r["acc"] == pytest.approx(s["acc"])
    with pytest.raises(ValueError, match="^eval_data: a DataLoader yielded no batches$"):
        lmclab.curve(a, b, eval_data=DataLoader(TensorDataset(x[:0], y[:0])), num_lambdas=3, device="cpu")


def test_merge_many_builds_the_module_of_state_dicts_by_its_factory_with_its_kwargs() -> None:
    """``factory(**kwargs)`` is the module the state dicts run in: with the width they were saved at, the merge
    of permuted copies is the function they share; with another, the first state dict is refused by shape."""

    def build(width: int) -> nn.Module:
        return nn.Sequential(
            nn.Flatten(), nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 3)
        )

    net, x = _mlp(0), torch.randn(8, 12)
    merged = lmclab.merge_many(_copies(net, x), factory=build, kwargs={"width": 16}, example_inputs=x, device="cpu")
    torch.testing.assert_close(functional_call(net, merged.merged, (x,)), net(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"^models\[0\]: tensor '1\.weight' has shape \(16, 12\), the module "):
        lmclab.merge_many(_copies(net, x), factory=build, kwargs={"width": 8}, example_inputs=x)


def test_the_data_a_repair_holds_is_moved_to_the_search_s_device(monkeypatch) -> None:
    """With a repair the data is held as one Split, moved to the search's device (a GPU's, when there is one)."""
    from lmclab.core.data import Split

    moved, to = [], Split.to
    monkeypatch.setattr(Split, "to", lambda self, device: moved.append(device) or to(self, device))
    net, x = _mlp(0), torch.randn(8, 12)
    lmclab.merge_many(
        _copies(net, x, 2), model=net, example_inputs=x, repair="repair", data=(x, torch.zeros(8)), device="cpu"
    )
    assert moved and all(torch.device(d) == torch.device("cpu") for d in moved)


def test_the_data_a_transform_method_reads_in_memory_is_moved_to_the_search_s_device(monkeypatch) -> None:
    """Without a repair, tensors given as data are held as one Split on the search's device (a GPU's, when there
    is one), as a repair's are."""
    from lmclab.core.data import Split

    moved, to = [], Split.to
    monkeypatch.setattr(Split, "to", lambda self, device: moved.append(device) or to(self, device))
    net, x = _mlp(0), torch.randn(8, 12)
    lmclab.merge_many(_copies(net, x, 2), method="zipit", model=net, data=(x, torch.zeros(8)), device="cpu")
    assert moved and all(torch.device(d) == torch.device("cpu") for d in moved)


def test_merge_many_s_default_seed_is_the_commands_0() -> None:
    """``lmclab merge-many`` seeds with 0 unless --seed says otherwise; the call without ``seed`` merges alike."""
    nets, x = [_mlp(s) for s in range(3)], torch.randn(8, 12)
    default, zero, one = (
        lmclab.merge_many(nets, example_inputs=x, device="cpu", **seed) for seed in ({}, {"seed": 0}, {"seed": 1})
    )
    assert _close(default.merged, zero.merged, atol=0)
    assert not _close(default.merged, one.merged)  # the seed orders the models' alignments: it matters here


def test_merge_many_traces_the_spec_on_its_data_when_no_example_inputs_are_given() -> None:
    net, x = _mlp(0), torch.randn(8, 12)
    data = (x, torch.zeros(8))
    merged = lmclab.merge_many(_copies(net, x), model=net, data=data, repair="repair", device="cpu")
    torch.testing.assert_close(functional_call(net, merged.merged, (x,)), net(x), rtol=1e-4, atol=1e-4)


def test_repair_without_a_module_names_model_and_what_needs_it() -> None:
    net = _mlp(0)
    expected = (
        "model: repair needs the nn.Module the state dicts belong to (pass model= or factory=, or model_a as a "
        "module, a Hugging Face folder or an lmclab checkpoint)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        lmclab.repair(None, net.state_dict(), [net.state_dict()], data=(torch.randn(8, 12), torch.zeros(8)))


def test_a_curves_evaluation_data_in_memory_is_moved_to_its_device(monkeypatch) -> None:
    """Each split held in memory lands on the curve's device (a GPU's, when there is one)."""
    from lmclab.core.data import Split

    moved, to = [], Split.to
    monkeypatch.setattr(Split, "to", lambda self, device: moved.append(device) or to(self, device))
    net, x = _mlp(0), torch.randn(8, 12)
    y = torch.zeros(8, dtype=torch.long)
    lmclab.curve(net, _mlp(1), eval_data={"a": (x, y), "b": (x, y + 1)}, num_lambdas=3, device="cpu")
    assert len(moved) == 2 and all(torch.device(d) == torch.device("cpu") for d in moved)
