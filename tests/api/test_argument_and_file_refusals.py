"""The refusals of the public API's arguments and of the command's file readers, each reached from the
function a researcher calls and read in full, with the nearest accepted input beside it: a curve's
barrier names (``Curve.barrier``), streamed batches without targets or of dicts and the BatchNorm reset's arguments
(``lmclab.curve``), λ outside [0, 1] (``lmclab.merge``), empty data (``lmclab.as_split``, the traced spec
of ``lmclab.find_permutation``), and model files, factories and permutation files (``lmclab.api.files``)."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import lmclab
from lmclab.api.alignment import FORMAT, SPECLESS, Alignment, load_alignment
from lmclab.api.files import build_factory, load_model_file
from lmclab.core.spec import PermutationSpec, Segment

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(1))


def _whole(message: str) -> str:
    """A pattern matching exactly ``message``."""
    return f"^{re.escape(message)}$"


def _net(seed: int, norm: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    middle = [nn.BatchNorm1d(8)] if norm else []
    return nn.Sequential(nn.Linear(6, 8), *middle, nn.ReLU(), nn.Linear(8, 3)).eval()


@pytest.fixture(scope="module")
def measured() -> lmclab.Curve:
    return lmclab.curve(_net(0), _net(1), eval_data={"val": (X[:5], Y[:5]), "test": (X, Y)}, lambdas=[0, 0.3, 0.5, 1])


@pytest.mark.parametrize("quantity,kind", [("accuracy", "max"), ("loss", "min"), ("Loss", "mid")])
def test_a_barrier_of_an_unknown_quantity_or_kind_is_refused(measured, quantity: str, kind: str) -> None:
    expected = f"quantity must be one of ('loss', 'acc') and kind one of ('max', 'mid'), got {quantity!r}, {kind!r}"
    with pytest.raises(ValueError, match=_whole(expected)):
        measured.barrier(quantity, kind)
    table = measured.barriers()
    assert measured.barrier("acc", "mid", split="test") == table["test_acc_barrier_mid"]
    assert measured.barrier("loss", "max") == table["val_loss_barrier_max"]  # the first split


def test_streamed_batches_without_targets_are_refused_by_the_split_they_belong_to() -> None:
    message = "expected (input, target) batches to evaluate on, got input tensors alone"
    with pytest.raises(TypeError, match=_whole(f"eval_data: {message}")):
        lmclab.curve(_net(0), _net(1), eval_data=[X[:5], X[5:]], num_lambdas=3)
    with pytest.raises(TypeError, match=_whole(f"eval_data['val']: {message}")):
        lmclab.curve(_net(0), _net(1), eval_data={"test": (X, Y), "val": [X]}, num_lambdas=3)
    streamed = lmclab.curve(_net(0), _net(1), eval_data=[(X[:5], Y[:5]), (X[5:], Y[5:])], lambdas=[0, 0.3, 0.5, 1])
    held = lmclab.curve(_net(0), _net(1), eval_data=(X, Y), lambdas=[0, 0.3, 0.5, 1])
    for s, h in zip(streamed.rows, held.rows, strict=True):  # batches of 5 and 11 weighted by their size
        assert s["loss"] == pytest.approx(h["loss"], rel=1e-5) and s["acc"] == pytest.approx(h["acc"])


def test_streamed_dict_batches_are_refused_by_the_split_they_belong_to_with_the_wrapper_to_use() -> None:
    got = "expected (input, target) batches or input tensors, got dict"
    hint = "(wrap the data in lmclab.pairs(…, input_key=…, target_key=…))"
    dicts = [{"x": X[:5], "y": Y[:5]}, {"x": X[5:], "y": Y[5:]}]
    with pytest.raises(TypeError, match=_whole(f"eval_data['val']: {got} {hint}")):
        lmclab.curve(_net(0), _net(1), eval_data={"test": (X, Y), "val": dicts}, num_lambdas=3)
    wrapped = lmclab.curve(
        _net(0), _net(1), eval_data=lmclab.pairs(dicts, input_key="x", target_key="y"), num_lambdas=3
    )
    held = lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3)
    assert [r["loss"] for r in wrapped.rows] == pytest.approx([r["loss"] for r in held.rows], rel=1e-5)


@pytest.mark.parametrize(
    ("repair", "line"),
    [
        ("BN", "repair must be one of ['auto', 'none', 'bn', 'repair'], got 'BN'"),
        ("", "repair must be one of ['auto', 'none', 'bn', 'repair'], got ''"),
        (None, "repair must be one of ['auto', 'none', 'bn', 'repair'], got None"),
        ("repair", "repair: 'repair' does not fit this model; use bn: the model has BatchNorm"),
    ],
)
def test_a_repair_that_is_none_of_the_four_or_misfits_the_model_is_refused(repair: str | None, line: str) -> None:
    with pytest.raises(ValueError, match=_whole(line)):
        lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair=repair, repair_data=(X, Y))
    plain = lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair="none")
    reset = lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair="bn", repair_data=(X, Y))
    assert len(plain.rows) == len(reset.rows) == 3
    assert plain.rows[1]["loss"] != pytest.approx(reset.rows[1]["loss"])  # the midpoint's statistics re-estimated


def test_the_bn_reset_without_repair_data_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^repair_data: repair 'bn' needs training data, got None$"):
        lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair="bn")
    with pytest.raises(
        ValueError, match=_whole("repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm")
    ):
        lmclab.curve(_net(0, norm=False), _net(1, norm=False), eval_data=(X, Y), num_lambdas=3, repair="bn")
    assert (
        len(lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair="bn", repair_data=[(X, Y)]).rows)
        == 3
    )


@pytest.mark.parametrize("lam", [-0.25, 1.5, float("nan"), float("inf"), float("-inf")])
def test_merge_refuses_a_lambda_outside_the_unit_interval(lam: float) -> None:
    a, b = _net(0).state_dict(), _net(1).state_dict()
    with pytest.raises(ValueError, match=_whole(f"lam must be in [0, 1], got {lam}")):
        lmclab.merge(a, b, lam=lam)
    key = "0.weight"
    assert torch.equal(lmclab.merge(a, b, lam=0.0)[key], b[key])  # the closed interval's ends: θb and θa
    assert torch.equal(lmclab.merge(a, b, lam=1.0)[key], a[key])
    assert torch.allclose(lmclab.merge(a, b, lam=0.3)[key], 0.3 * a[key] + 0.7 * b[key])


class _Samples:
    """A map-style dataset of ``n`` samples (no ``__iter__``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return X[i], Y[i]


@pytest.mark.parametrize("empty", [[], iter([]), _Samples(0)], ids=["list", "iterator", "dataset"])
def test_empty_data_is_refused_by_name(empty) -> None:
    with pytest.raises(ValueError, match=r"^repair_data is empty$"):
        lmclab.as_split(empty, "repair_data")
    split = lmclab.as_split(_Samples(1))  # one sample: a batch of one
    assert torch.equal(split.x, X[:1]) and torch.equal(split.y, Y[:1])


def test_a_curve_refuses_empty_repair_data() -> None:
    with pytest.raises(ValueError, match=r"^repair_data is empty$"):
        lmclab.curve(_net(0), _net(1), eval_data=(X, Y), num_lambdas=3, repair="bn", repair_data=[])


def test_a_curve_refuses_an_empty_split_of_eval_data_by_its_name() -> None:
    with pytest.raises(ValueError, match=r"^eval_data\['val'\] is empty$"):
        lmclab.curve(_net(0), _net(1), eval_data={"test": (X, Y), "val": (X[:0], Y[:0])}, num_lambdas=3)
    with pytest.raises(ValueError, match=r"^eval_data is empty$"):
        lmclab.curve(_net(0), _net(1), eval_data=(X[:0], Y[:0]), num_lambdas=3)


def test_a_search_refuses_empty_eval_data_by_name() -> None:
    with pytest.raises(ValueError, match=r"^eval_data is empty$"):
        lmclab.find_permutation(_net(0), _net(1), data=(X, Y), eval_data=[])


@pytest.mark.parametrize("empty", [[], (), _Samples(0)], ids=["list", "tuple", "dataset"])
def test_tracing_the_spec_on_empty_data_is_refused(empty) -> None:
    with pytest.raises(ValueError, match=r"^data is empty$"):
        lmclab.find_permutation(_net(0), _net(1), data=empty)
    for data in ([(X[:1], Y[:1])], _Samples(1)):  # one batch, one sample: enough to trace
        found = lmclab.find_permutation(_net(0), _net(1), data=data)
        assert sorted(len(p) for p in found.perm.values()) == [8]


def _state() -> dict[str, torch.Tensor]:
    """A third net's state dict, without BatchNorm (tensors only)."""
    return _net(2, norm=False).state_dict()


def test_a_pickled_module_is_refused_with_the_state_dict_hint(tmp_path) -> None:
    hint = "holds pickled objects, not only tensors (save model.state_dict(), not the module)"
    for name, blob in {"module.pt": _net(2), "nested.pt": {"epoch": 3, "model": _net(2)}}.items():
        torch.save(blob, tmp_path / name)
        with pytest.raises(ValueError, match=_whole(f"{tmp_path / name}: {hint}")):
            load_model_file(tmp_path / name)
    torch.save(_state(), tmp_path / "state.pt")
    assert load_model_file(tmp_path / "state.pt").params.keys() == _state().keys()
    torch.save(_net(2), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)  # a bare pickle
    with pytest.raises(ValueError, match=_whole(f"{tmp_path / 'legacy.pt'}: {hint}")):
        load_model_file(tmp_path / "legacy.pt")


def test_a_pickled_module_is_refused_even_where_the_environment_turns_torchs_check_off(tmp_path, monkeypatch) -> None:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 unpickles any object where torch.load is not told weights_only=True."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    torch.save(_net(2), tmp_path / "module.pt")
    hint = "holds pickled objects, not only tensors (save model.state_dict(), not the module)"
    with pytest.raises(ValueError, match=_whole(f"{tmp_path / 'module.pt'}: {hint}")):
        load_model_file(tmp_path / "module.pt")


def test_a_foreign_file_is_not_called_a_pickle(tmp_path) -> None:
    (tmp_path / "notes.pt").write_bytes(b"garbage, not written by torch.save")
    expected = f"{tmp_path / 'notes.pt'}: not a PyTorch file (neither torch.save's zip archive nor a pickle)"
    with pytest.raises(ValueError, match=_whole(expected)):
        load_model_file(tmp_path / "notes.pt")


@pytest.mark.parametrize(
    "cut,reason",
    [
        (lambda blob: b"", "header too small"),
        (lambda blob: blob[:20], "invalid header length"),
        (lambda blob: blob[:-5], "incomplete metadata, file not fully covered"),
        (lambda blob: b"not a safetensors file at all", "header too large"),
    ],
    ids=["empty", "header-cut", "data-cut", "foreign"],
)
def test_a_corrupt_safetensors_file_is_refused_with_its_reason(tmp_path, cut, reason: str) -> None:
    save_file(_state(), tmp_path / "good.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(cut((tmp_path / "good.safetensors").read_bytes()))
    expected = (
        f"{bad}: not a readable safetensors file (truncated or corrupted? Error while deserializing header: {reason})"
    )
    with pytest.raises(ValueError, match=_whole(expected)):
        load_model_file(bad)
    loaded = load_model_file(tmp_path / "good.safetensors").params
    assert all(torch.equal(loaded[k], v) for k, v in _state().items())


def test_a_folder_without_config_json_or_a_missing_file_is_refused(tmp_path) -> None:
    save_file(_state(), tmp_path / "model.safetensors")  # weights, but no config.json beside them
    with pytest.raises(
        FileNotFoundError,
        match=_whole(f"{tmp_path}: a folder without config.json (not a Hugging Face checkpoint folder)"),
    ):
        load_model_file(tmp_path)
    for name in ("missing.pt", "missing.safetensors", "missing"):
        with pytest.raises(FileNotFoundError, match=_whole(f"{tmp_path / name}: file not found")):
            load_model_file(tmp_path / name)
    assert load_model_file(tmp_path / "model.safetensors").params.keys() == _state().keys()


@pytest.mark.parametrize(
    "blob",
    [{}, {"epoch": 3, "model": {"lr": 0.1}}, {"w": torch.ones(2), "step": 3}, [torch.ones(2)], torch.ones(2)],
    ids=["empty", "nested-numbers", "mixed", "list", "tensor"],
)
def test_a_file_that_holds_no_state_dict_is_refused(tmp_path, blob) -> None:
    torch.save(blob, tmp_path / "x.pt")
    with pytest.raises(
        ValueError, match=_whole(f"{tmp_path / 'x.pt'}: expected a state dict (a mapping of names to tensors)")
    ):
        load_model_file(tmp_path / "x.pt")
    state = _state()
    for i, nested in enumerate([state, {"epoch": 3, "model": state}, {"state_dict": {"model": state}, "step": 7}]):
        torch.save(nested, tmp_path / f"{i}.pt")
        loaded = load_model_file(tmp_path / f"{i}.pt").params
        assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], v) for k, v in state.items())


def test_a_factory_that_fails_on_its_arguments_is_refused_with_them() -> None:
    missing = "Linear.__init__() missing 1 required positional argument: 'out_features'"
    with pytest.raises(ValueError, match=_whole(f"factory: torch.nn:Linear(**{{'in_features': 2}}) failed: {missing}")):
        build_factory("torch.nn:Linear", {"in_features": 2})
    extra = "Linear.__init__() got an unexpected keyword argument 'bias_init'"
    kwargs = {"in_features": 2, "out_features": 5, "bias_init": 0}
    with pytest.raises(ValueError, match=_whole(f"factory: torch.nn:Linear(**{kwargs}) failed: {extra}")):
        build_factory("torch.nn:Linear", kwargs)
    net = build_factory("torch.nn:Linear", {"in_features": 2, "out_features": 5})
    assert isinstance(net, nn.Linear) and tuple(net.weight.shape) == (5, 2)


def test_a_factory_that_returns_no_module_is_refused() -> None:
    with pytest.raises(ValueError, match=_whole("factory: 'torch:zeros' returned Tensor, not an nn.Module")):
        build_factory("torch:zeros", {"size": [2, 3]})
    with pytest.raises(
        ValueError, match=_whole("factory: 'collections:OrderedDict' returned OrderedDict, not an nn.Module")
    ):
        build_factory("collections:OrderedDict", {})
    assert isinstance(build_factory("torch.nn:Identity", {}), nn.Identity)


def test_a_factory_given_to_the_api_must_be_callable_and_return_a_module() -> None:
    a, b = _net(0, norm=False), _net(1, norm=False)
    with pytest.raises(TypeError, match=_whole("factory must be a callable or 'module:callable', got int")):
        lmclab.find_permutation(a.state_dict(), b.state_dict(), factory=3, example_inputs=X)
    with pytest.raises(ValueError, match=_whole("factory: returned Tensor, not an nn.Module")):
        lmclab.find_permutation(a.state_dict(), b.state_dict(), factory=lambda: torch.zeros(2), example_inputs=X)
    found = lmclab.find_permutation(
        a.state_dict(), b.state_dict(), factory=lambda: _net(5, norm=False), example_inputs=X
    )
    assert sorted(len(p) for p in found.perm.values()) == [8]


@pytest.mark.parametrize("which", ["model_a", "model_b"])
def test_a_checkpoint_path_that_does_not_exist_is_refused_naming_the_argument(tmp_path, which: str) -> None:
    torch.save(_state(), tmp_path / "net.pt")
    paths = {"model_a": tmp_path / "net.pt", "model_b": tmp_path / "net.pt"} | {which: tmp_path / "gone.pt"}
    expected = f"{which}: {tmp_path / 'gone.pt'}: no such file or folder"
    with pytest.raises(FileNotFoundError, match=_whole(expected)):
        lmclab.find_permutation(*paths.values(), model=_net(2, norm=False), example_inputs=X)
    with pytest.raises(FileNotFoundError, match=_whole(expected)):
        lmclab.merge(*paths.values())
    with pytest.raises(FileNotFoundError, match=_whole(expected)):
        lmclab.curve(*paths.values(), model=_net(2, norm=False), eval_data=(X, Y), num_lambdas=3)


def test_an_alignment_file_keeps_its_spec_and_must_be_one_lmclab_wrote(tmp_path) -> None:
    spec = PermutationSpec({"w": ("P_0", (Segment("P_1", 4, 2), Segment(None, 3))), "b": ("P_0",)}, frozenset({"b"}))
    perm = {"P_0": torch.tensor([2, 0, 1]), "P_1": torch.tensor([1, 0])}
    Alignment("wm", spec, perm, {"seconds": 0.5, "curve": [1.0]}).save(tmp_path / "p.pt")
    loaded = load_alignment(tmp_path / "p.pt")
    assert loaded.spec == spec and loaded.method == "wm" and loaded.stats == {"seconds": 0.5}  # numbers kept
    assert loaded.perm.keys() == perm.keys() and all(torch.equal(loaded.perm[g], p) for g, p in perm.items())
    with pytest.raises(ValueError, match=_whole(f"spec: differs from the spec stored in {tmp_path / 'p.pt'}")):
        load_alignment(tmp_path / "p.pt", spec=PermutationSpec({"w": ("P_0", "P_1")}))
    torch.save({"format": SPECLESS, "method": "wm", "stats": {}, "perm": perm}, tmp_path / "old.pt")  # no spec
    specless = (
        f"spec: {tmp_path / 'old.pt'} was written without its spec (an earlier lmclab); pass the spec it permutes by"
    )
    with pytest.raises(ValueError, match=_whole(specless)):
        load_alignment(tmp_path / "old.pt")
    assert load_alignment(tmp_path / "old.pt", spec=spec).spec == spec
    torch.save({"format": SPECLESS, "perm": perm}, tmp_path / "bare.pt")  # a permutation alone, written by hand
    bare = load_alignment(tmp_path / "bare.pt", spec=spec)
    assert (bare.method, bare.stats) == ("", {}) and all(torch.equal(bare.perm[g], p) for g, p in perm.items())
    wrong = PermutationSpec({"w": ("P_0", "P_2")})
    with pytest.raises(
        ValueError, match=_whole(f"{tmp_path / 'old.pt'}: its permutation's groups ['P_0', 'P_1'] are not the spec's")
    ):
        load_alignment(tmp_path / "old.pt", spec=wrong)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")  # a Hugging Face folder is no alignment either
    expected = f"expected an alignment written by `lmclab match` or Alignment.save (format {FORMAT})"
    for folder in (tmp_path, tmp_path / "folder"):
        with pytest.raises(ValueError, match=_whole(f"{folder}: a folder; {expected}")):
            load_alignment(folder)
    with pytest.raises(FileNotFoundError, match=_whole(f"{tmp_path / 'q.pt'}: file not found")):
        load_alignment(tmp_path / "q.pt")
    for i, blob in enumerate([_state(), {"format": "lmclab-permutation-0", "perm": perm}, [perm]]):
        torch.save(blob, tmp_path / f"{i}.pt")
        with pytest.raises(ValueError, match=_whole(f"{tmp_path / f'{i}.pt'}: {expected}")):
            load_alignment(tmp_path / f"{i}.pt")
    torch.save({"format": FORMAT, "perm": perm, "spec": {"axes": {"w": [7]}}}, tmp_path / "bad.pt")
    unreadable = (
        f"{tmp_path / 'bad.pt'}: not a permutation spec as lmclab saves one (TypeError: an axis entry must be a group "
        "name, null or a list of segments, got 7)"
    )
    with pytest.raises(ValueError, match=_whole(unreadable)):
        load_alignment(tmp_path / "bad.pt")
