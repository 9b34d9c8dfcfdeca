"""Two models in different precisions, through the API (lmclab.api.weights): each pair of float32, float16,
bfloat16 and float64 in both orders is compared in one dtype — float64 when either is float64, else float32 —
so that every search recovers a planted permutation (θb = π(θa) cast to the other dtype), merges and curves
return each model in its own dtype (a merge on the CPU), and the caller's models are left as they were;
weights that are not finite or have no values (``meta``) are refused naming the argument and the tensor."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from torch import nn

import lmclab
from lmclab.api.weights import compute_dtype
from lmclab.core.data import Split
from lmclab.core.spec import random_permutation
from lmclab.trace import trace_spec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
# every ordered pair of different dtypes, and the two half precisions with themselves
PAIRS = [(a, b) for a, b in itertools.product(DTYPES, DTYPES) if a != b] + [("fp16", "fp16"), ("bf16", "bf16")]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


NET, X, Y = _mlp(), torch.randn(64, 6, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 3
SPEC = trace_spec(NET, X[:2])
PERM = random_permutation(SPEC.group_sizes(NET.state_dict()), torch.Generator().manual_seed(2))


def _pair(dtype_a: str, dtype_b: str) -> tuple[dict, dict]:
    """θa in ``dtype_a`` and θb = π(θa) cast to ``dtype_b``."""
    a = NET.state_dict()
    return (
        {k: v.to(DTYPES[dtype_a]) for k, v in a.items()},
        {k: v.to(DTYPES[dtype_b]) for k, v in lmclab.apply_permutation(SPEC, PERM, a).items()},
    )


def _recovered(res: lmclab.Alignment) -> bool:
    """π found for θb undoes the planted one: π(θb) = θa."""
    return all(torch.equal(PERM[g][res.perm[g]], torch.arange(len(p))) for g, p in res.perm.items())


def test_the_compute_dtype_is_float64_with_a_float64_model_else_float32() -> None:
    for a, b in PAIRS:
        expected = torch.float64 if "f64" in (a, b) else torch.float32
        assert compute_dtype([{"w": torch.zeros(1, dtype=DTYPES[a])}, {"w": torch.zeros(1, dtype=DTYPES[b])}]) == (
            expected
        )


@pytest.mark.parametrize(("dtype_a", "dtype_b"), PAIRS)
def test_every_search_on_two_precisions_recovers_a_planted_permutation(dtype_a: str, dtype_b: str) -> None:
    a, b = _pair(dtype_a, dtype_b)
    kept = {k: v.clone() for k, v in b.items()}
    ste = {"epochs": 1, "batch_size": 16}
    for method, options in [("wm", None), ("wm_sinkhorn", None), ("am", None), ("ste", ste), ("ste_sinkhorn", ste)]:
        res = lmclab.find_permutation(
            a, b, method=method, model=NET, example_inputs=X[:2], data=(X, Y), options=options, device="cpu"
        )
        assert method == "ste_sinkhorn" or _recovered(res), (method, dtype_a, dtype_b)  # one epoch: a soft start
        assert sorted(res.perm) == sorted(PERM)
    assert all(torch.equal(v, kept[k]) and v.dtype == DTYPES[dtype_b] for k, v in b.items())  # the caller's


@pytest.mark.parametrize(("dtype_a", "dtype_b"), PAIRS)
def test_merge_and_curve_of_two_precisions_return_each_model_in_its_own_dtype(dtype_a: str, dtype_b: str) -> None:
    a, b = _pair(dtype_a, dtype_b)
    res = lmclab.find_permutation(a, b, model=NET, example_inputs=X[:2], device="cpu")
    assert all(v.dtype == DTYPES[dtype_b] for v in res.apply(b).values())  # π(θb) in θb's dtype
    merged = lmclab.merge(a, b, res, lam=0.5)
    assert all(v.dtype == DTYPES[dtype_a] for v in merged.values())  # the merge in θa's
    wide = compute_dtype([a, b])
    for k, v in merged.items():  # the average taken in the wide dtype, then cast: no rounding of either first
        pi_b = res.apply(b)[k].to(wide)
        assert torch.equal(v, (0.5 * a[k].to(wide) + 0.5 * pi_b).to(DTYPES[dtype_a]))
    tol = 1e-6 if {dtype_a, dtype_b} <= {"fp32", "f64"} else 5e-2  # π(θb) = θa up to the half rounding
    assert lmclab.curve(a, b, alignment=res, model=NET, eval_data=(X, Y), num_lambdas=3).barrier() == pytest.approx(
        0.0, abs=tol
    )
    assert isinstance(lmclab.curve(a, b, model=NET, eval_data=(X, Y), num_lambdas=3).barrier(), float)  # naive
    assert lmclab.l2_reduction(a, b, res) > 99.0


@pytest.mark.parametrize(("dtype_a", "dtype_b"), [("bf16", "fp32"), ("fp32", "f64"), ("f64", "fp16")])
def test_merge_many_and_repair_return_each_model_in_its_own_dtype(dtype_a: str, dtype_b: str) -> None:
    a, b = _pair(dtype_a, dtype_b)
    many = lmclab.merge_many([a, b], method="merge_many", model=NET, example_inputs=X[:2], device="cpu")
    assert all(v.dtype == DTYPES[dtype_a] for v in many.merged.values())
    assert [{v.dtype for v in p.values()} for p in many.aligned] == [{DTYPES[dtype_a]}, {DTYPES[dtype_b]}]
    fixed = lmclab.repair(NET, many.merged, [a, b], data=(X, Y), repair="repair", device="cpu")
    assert all(v.dtype == DTYPES[dtype_a] for v in fixed.values())


@pytest.mark.parametrize(("dtype_a", "dtype_b"), [("fp32", "f64"), ("f64", "bf16")])
def test_a_partial_zip_returns_each_models_network_in_its_own_dtype(dtype_a: str, dtype_b: str) -> None:
    a, b = _pair(dtype_a, dtype_b)
    zipped = lmclab.merge_many([a, b], method="zipit", model=NET, data=(X, Y), options={"partial_zip": 1}, device="cpu")
    assert zipped.merged is None and [set(h) for h in zipped.heads] == [set(a), set(a)]
    assert [{v.dtype for v in h.values()} for h in zipped.heads] == [{DTYPES[dtype_a]}, {DTYPES[dtype_b]}]


def test_a_bn_repair_of_a_state_dict_cast_whole_to_half_returns_its_floats_in_half_and_the_counter_whole() -> None:
    """``{k: v.half() …}`` casts the BatchNorm counter too: the repaired counter is the module's int64 again."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    fixed = lmclab.repair(net, {k: v.half() for k, v in net.state_dict().items()}, data=(X, Y), device="cpu")
    assert {k: v.dtype for k, v in fixed.items() if v.dtype != torch.float16} == {"1.num_batches_tracked": torch.int64}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("which", ["model_a", "model_b"])
def test_non_finite_weights_are_refused_naming_the_argument_and_the_tensor(bad: float, which: str) -> None:
    a, b = _pair("fp32", "fp32")
    broken = {k: v.clone() for k, v in (a if which == "model_a" else b).items()}
    broken["2.weight"][1, 2] = bad
    a, b = (broken, b) if which == "model_a" else (a, broken)
    kind = "NaN" if bad != bad else ("+inf" if bad > 0 else "-inf")
    message = rf"^{which}: tensor '2.weight' has 1 {kind} entry; expected finite weights$"
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        lmclab.find_permutation(a, b, model=NET, example_inputs=X[:2])
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        lmclab.merge(a, b)  # the naive merge too: it would pass the NaN on
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        lmclab.curve(a, b, model=NET, eval_data=(X, Y), num_lambdas=3)
    many = message.replace("+", r"\+").replace(which, "models\\[0\\]" if which == "model_a" else "models\\[1\\]")
    with pytest.raises(ValueError, match=many):
        lmclab.merge_many([a, b], model=NET, example_inputs=X[:2])


def test_models_on_the_meta_device_are_refused_naming_the_argument() -> None:
    with torch.device("meta"):
        ghost = _mlp()
    unloaded = "tensor '0.weight' is on the meta device (shapes without values); load its weights first"
    with pytest.raises(ValueError, match=f"^{re.escape(f'model_b: {unloaded}')}$"):
        lmclab.find_permutation(NET, ghost, example_inputs=X[:2])
    with pytest.raises(ValueError, match=f"^{re.escape(f'model_a: {unloaded}')}$"):
        lmclab.merge(ghost, NET)
    with pytest.raises(ValueError, match=f"^{re.escape(f'model_b: {unloaded}')}$"):
        lmclab.merge(NET, ghost)
    run = "tensor '0.weight' is on the meta device (shapes without values); evaluating the models runs it"
    with pytest.raises(ValueError, match=f"^{re.escape(f'model: {run}')}$"):
        lmclab.curve(NET.state_dict(), NET.state_dict(), model=ghost, eval_data=(X, Y), num_lambdas=3)


def test_a_module_run_with_a_buffer_on_the_meta_device_is_refused_naming_the_argument_that_gave_it() -> None:
    """A non-persistent buffer is outside the state dict: only the module that is run shows it."""
    net = _mlp()
    net.register_buffer("scale", torch.empty(3, device="meta"), persistent=False)
    run = "tensor 'scale' is on the meta device (shapes without values); tracing the permutation spec runs it"
    with pytest.raises(ValueError, match=f"^{re.escape(f'model_a: {run}')}$"):
        lmclab.find_permutation(net, NET, example_inputs=X[:2])
    with pytest.raises(ValueError, match=f"^{re.escape(f'model: {run}')}$"):
        lmclab.find_permutation(NET, NET, model=net, example_inputs=X[:2])


def test_a_module_is_copied_to_the_device_it_runs_on_and_left_where_it_was() -> None:
    from lmclab.api.inputs import on_device

    net = _mlp()
    moved = on_device(net, torch.device("meta"))
    assert all(t.is_meta for t in (*moved.parameters(), *moved.buffers()))
    assert not any(t.is_meta for t in net.parameters()) and on_device(net, torch.device("cpu")) is net


def test_the_weights_are_read_on_the_device_asked_for() -> None:
    from lmclab.api.inputs import read_weights

    a, b = _pair("fp32", "f64")
    read = read_weights([a, b], ["model_a", "model_b"], torch.device("meta"))
    assert all(v.is_meta for p in read.params for v in p.values()) and not any(v.is_meta for v in a.values())


def test_a_merge_takes_no_device_and_reads_both_models_on_the_cpu(monkeypatch) -> None:
    """Models on a GPU, or on two devices, are merged on the CPU: the device the weights are read on is recorded."""
    import lmclab.api.functions as functions

    asked, read = [], functions.read_weights

    def recording(models, names, device, **keywords):
        asked.append(device)
        return read(models, names, device, **keywords)

    monkeypatch.setattr(functions, "read_weights", recording)
    merged = lmclab.merge(*_pair("fp32", "f64"), lam=0.5)
    assert asked == [torch.device("cpu")] and {v.device.type for v in merged.values()} == {"cpu"}


def test_a_merge_of_two_shapes_and_an_alignment_of_another_model_are_named() -> None:
    a, _ = _pair("fp32", "fp32")
    wide = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"^model_b: tensor '0.weight' has shape \(16, 6\), model_a's \(8, 6\)$"):
        lmclab.merge(a, wide)
    res = lmclab.find_permutation(NET, NET, example_inputs=X[:2])
    other = "alignment: found for another model than {0}: group 'P_0' has 16 units in {0}, 8 in the alignment"
    with pytest.raises(ValueError, match=f"^{re.escape(other.format('model_b'))}$"):
        lmclab.merge(wide, wide, res)
    with pytest.raises(ValueError, match=f"^{re.escape(other.format('params_b'))}$"):
        res.apply(wide)
    keys = (
        "alignment: found for another model than model_b: keys do not match the permutation spec (missing "
        "['0.bias', '0.weight', '2.bias'], unexpected ['w'])"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(keys)}$"):
        lmclab.curve(
            {"w": torch.ones(3)}, {"w": torch.ones(3)}, alignment=res, model=NET, eval_data=(X, Y), num_lambdas=3
        )


@pytest.mark.parametrize("eval_data", [(X[:0], Y[:0]), Split(X[:0], Y[:0]), []], ids=["tensors", "split", "list"])
def test_a_curve_on_no_samples_names_eval_data(eval_data) -> None:
    with pytest.raises(ValueError, match=r"^eval_data( is empty|: a DataLoader yielded no batches)$"):
        lmclab.curve(NET, NET, eval_data=eval_data, num_lambdas=3)
