"""The public API on models lmclab has never seen: plain ``nn.Module``s and state dicts, specs traced
from the model, data as loaders, tensors or datasets; planted permutations must be recovered exactly."""

from __future__ import annotations

import copy
import doctest
import re
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lmclab
import lmclab.api.functions
from lmclab.core.spec import random_permutation
from lmclab.trace import trace_spec


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _planted(model: nn.Module, x: torch.Tensor, seed: int = 7) -> tuple[dict, dict]:
    """θb = π(θa) for a random π of the traced spec, and π."""
    spec = trace_spec(model, x)
    perm = random_permutation(spec.group_sizes(model.state_dict()), torch.Generator().manual_seed(seed))
    return lmclab.apply_permutation(spec, perm, model.state_dict()), perm


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_top_level_names_are_the_api() -> None:
    assert sorted(lmclab.__all__) == sorted([*lmclab.api.__all__, "__version__"])
    assert lmclab.find_permutation is lmclab.api.functions.find_permutation
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lmclab.nothing  # noqa: B018


def test_importing_one_module_does_not_load_the_api() -> None:
    """Lazy re-exports: a stage importing lmclab.core.spec depends on no more than it uses."""
    code = (
        "import sys, lmclab.core.spec; print(any(m.startswith(('lmclab.api', 'lmclab.search')) for m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


@pytest.mark.parametrize("method", ["wm", "wm_sinkhorn"])
def test_a_planted_permutation_of_an_mlp_is_recovered_data_free(method: str) -> None:
    a, x = _mlp(0), torch.randn(8, 12)
    b, _ = _planted(a, x)
    res = lmclab.find_permutation(a, b, method=method, example_inputs=x, device="cpu")
    assert _same(res.apply(b), a.state_dict())
    assert lmclab.l2_reduction(a, b, res) == pytest.approx(100.0)
    assert res.method == method and res.stats["seconds"] >= 0


def test_state_dicts_need_their_module_and_then_match_like_modules() -> None:
    a, x = _mlp(0), torch.randn(8, 12)
    b, _ = _planted(a, x)
    needs = (
        "model: tracing the permutation spec needs the nn.Module the state dicts belong to (pass model= or "
        "factory=, or model_a as a module, a Hugging Face folder or an lmclab checkpoint)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(needs)}$"):
        lmclab.find_permutation(a.state_dict(), b, example_inputs=x)
    spec = lmclab.trace_spec(a, x)  # no trace, but a method that runs the module
    with pytest.raises(
        ValueError, match=f"^{re.escape(needs.replace('tracing the permutation spec', 'this method'))}$"
    ):
        lmclab.find_permutation(a.state_dict(), b, spec=spec, method="am", data=(x, torch.zeros(8)))
    res = lmclab.find_permutation(a.state_dict(), b, model=_mlp(3), example_inputs=x, device="cpu")
    assert _same(res.apply(b), a.state_dict())


def test_activation_matching_takes_a_dataloader_and_recovers_the_planted_permutation() -> None:
    a, x = _mlp(0), torch.randn(256, 12)
    b, _ = _planted(a, x[:2])
    loader = DataLoader(TensorDataset(x, torch.randint(0, 3, (256,))), batch_size=64)
    res = lmclab.find_permutation(a, b, method="am", data=loader, device="cpu")  # spec traced on the first batch
    assert _same(res.apply(b), a.state_dict())


def test_a_torchvision_resnet18_is_traced_matched_and_measured() -> None:
    from torchvision.models import resnet18

    torch.manual_seed(0)
    a, x = resnet18(num_classes=10).eval(), torch.randn(4, 3, 32, 32)
    b, _ = _planted(a, x)
    res = lmclab.find_permutation(a, b, method="wm", example_inputs=x, device="cpu")
    pi_b = res.apply(b)
    assert _same(pi_b, a.state_dict())
    curve = lmclab.curve(a, pi_b, eval_data=TensorDataset(x, torch.arange(4)), num_lambdas=3, device="cpu")
    assert curve.barrier() == pytest.approx(0.0, abs=1e-5) and curve.barrier("acc", "mid") == pytest.approx(0.0)


def test_the_curve_of_two_different_models_has_the_barrier_of_its_own_rows() -> None:
    a, b = _mlp(0), _mlp(1)
    x, y = torch.randn(200, 12), torch.randint(0, 3, (200,))
    curve = lmclab.curve(
        a,
        b,
        eval_data={"test": (x, y), "train": DataLoader(TensorDataset(x, y), batch_size=50)},
        lambdas=[0, 0.25, 0.5, 0.75, 1],
        device="cpu",
    )
    assert curve.splits == ["test", "train"] and curve.lambdas == [0.0, 0.25, 0.5, 0.75, 1.0]
    test = {r["lam"]: r["loss"] for r in curve.rows if r["split"] == "test"}
    line = {lam: lam * test[1.0] + (1 - lam) * test[0.0] for lam in test}
    assert curve.barrier("loss", "max") == pytest.approx(max(test[v] - line[v] for v in test))
    assert curve.barrier("loss", "mid") == pytest.approx(test[0.5] - line[0.5])
    assert curve.barrier(split="train") == pytest.approx(curve.barrier())  # the same data, batched
    merged = lmclab.merge(a, b, lam=0.5)
    assert torch.equal(merged["1.weight"], (a.state_dict()["1.weight"] + b.state_dict()["1.weight"]) / 2)


def test_bn_repair_recomputes_the_statistics_of_the_interpolated_model() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(300, 6) * 3 + 1, torch.randint(0, 2, (300,))
    stale = lmclab.curve(net, net.state_dict(), eval_data=(x, y), num_lambdas=3, device="cpu")
    fixed = lmclab.curve(
        net, net.state_dict(), eval_data=(x, y), num_lambdas=3, repair="bn", repair_data=(x, y), device="cpu"
    )
    assert [r["loss"] for r in stale.rows] != pytest.approx([r["loss"] for r in fixed.rows])
    with pytest.raises(
        ValueError, match=r"^repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm$"
    ):
        lmclab.curve(_mlp(0), _mlp(1), eval_data=(torch.randn(4, 12), torch.zeros(4)), repair="bn", repair_data=(x, y))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"method": "nope"},
            "method: unknown method 'nope'; expected one of ['am', 'identity', 'ste', 'ste_sinkhorn', 'wm', "
            "'wm_sinkhorn']",
        ),
        ({"method": "am"}, "data: method 'am' needs training data (a DataLoader or (input, target) batches)"),
        ({"method": "wm"}, "example_inputs: needed to trace the permutation spec (or pass spec=)"),
        ({"method": "wm", "options": {"max_iter": 0}}, "options['max_iter'] must be a positive integer, got 0"),
        (
            {"method": "wm", "options": {"nonsense": 1}},
            "options: unknown option(s) ['nonsense']; expected some of ['lap_backend', 'max_iter', 'tol', 'restarts']",
        ),
        (  # no collision with the keyword seed=
            {"method": "wm", "options": {"seed": 1}},
            "options: unknown option(s) ['seed']; expected some of ['lap_backend', 'max_iter', 'tol', 'restarts']",
        ),
        (
            {"method": "wm", "options": [("max_iter", 1)]},
            "options must be a mapping of option names to values, got list",
        ),
    ],
)
def test_bad_arguments_are_one_line_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=f"^{re.escape(message)}$"):
        lmclab.find_permutation(_mlp(0), _mlp(1), **kwargs)


def test_a_state_dict_of_another_model_is_refused_naming_it() -> None:
    other = nn.Sequential(nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3))
    differ = "model_b: tensor names differ from model_a's (missing {}, extra {})"
    with pytest.raises(ValueError, match=f"^{re.escape(differ.format(['5.bias', '5.weight'], []))}$"):
        lmclab.find_permutation(_mlp(0), other.state_dict(), example_inputs=torch.randn(2, 12))
    with pytest.raises(ValueError, match=f"^{re.escape(differ.format([], ['5.bias', '5.weight']))}$"):
        lmclab.find_permutation(other.state_dict(), _mlp(0), model=other, example_inputs=torch.randn(2, 12))


@pytest.mark.parametrize("method", ["wm", "am", "identity"])
def test_two_widths_are_aligned_by_embedding_the_narrower_and_its_state_dict_alone_is_refused(method: str) -> None:
    """Before: wm failed with 'start (0) + length (64) exceeds dimension size (32)', am in the cost matrix; now the
    narrower module is embedded in the wider one's widths (lmclab.api.widths), its state dict alone refused."""
    narrow = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x, wide = torch.randn(8, 12), _mlp(0)
    res = lmclab.find_permutation(wide, narrow, method=method, example_inputs=x, data=(x, torch.zeros(8).long()))
    assert list(res.widths.values()) == [8]
    twin = copy.deepcopy(wide)
    twin.load_state_dict(res.apply(narrow))
    with torch.no_grad():
        assert torch.allclose(twin(x), narrow(x), atol=1e-6)
    message = r"^model_b: tensor '1.weight' has shape \(8, 12\), model_a's \(16, 12\) \(a model of other widths: pass"
    with pytest.raises(ValueError, match=message):
        lmclab.find_permutation(
            wide, narrow.state_dict(), method=method, example_inputs=x, data=(x, torch.zeros(8).long())
        )


def test_errors_of_the_functions_below_name_the_apis_own_arguments() -> None:
    data, bn = (torch.randn(8, 12), torch.zeros(8)), nn.Sequential(nn.Linear(12, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match=r"^num_lambdas must be at least 2 \(both endpoints\), got 1$"):
        lmclab.curve(_mlp(0), _mlp(1), eval_data=data, num_lambdas=1)
    with pytest.raises(ValueError, match=r"^repair_samples must be a positive number of images or null, got 0$"):
        lmclab.curve(bn, bn.state_dict(), eval_data=data, repair="bn", repair_data=data, repair_samples=0)


def test_lambdas_must_hold_both_endpoints_and_the_midpoint() -> None:
    with pytest.raises(ValueError, match=r"^lambdas must lie in \[0, 1\] and hold 0, 0\.5 and 1, got \[0\.0, 1\.0\]$"):
        lmclab.curve(_mlp(0), _mlp(1), eval_data=(torch.randn(4, 12), torch.zeros(4)), lambdas=[0, 1])


def test_lambdas_beyond_the_endpoints_are_refused_even_with_0_half_and_1() -> None:
    message = r"^lambdas must lie in \[0, 1\] and hold 0, 0.5 and 1, got \[0.0, 0.5, 1.0, 1.5\]$"
    with pytest.raises(ValueError, match=message):
        lmclab.curve(_mlp(0), _mlp(1), eval_data=(torch.randn(4, 12), torch.zeros(4)), lambdas=[0, 0.5, 1, 1.5])


def test_lambdas_of_just_both_endpoints_and_the_midpoint_are_a_curve_in_order() -> None:
    data = (torch.randn(4, 12), torch.zeros(4).long())
    assert lmclab.curve(_mlp(0), _mlp(1), eval_data=data, lambdas=[1, 0.5, 0, 1.0]).lambdas == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    "module",
    [
        "lmclab.api.functions",
        "lmclab.api.curves",
        "lmclab.api.many",
        "lmclab.api.inputs",
        "lmclab.api.alignment",
        "lmclab.api.weights",
        "lmclab.api.registry",
        "lmclab.core.spec_data",
        "lmclab.api",
        "lmclab.core.merge",
    ],
)
def test_the_docstring_examples_run(module: str) -> None:
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_create_model_is_initialised_from_its_seed_alone() -> None:
    config = dict(input_shape=(1, 4, 4), num_classes=3, hidden=1, width=8)
    torch.manual_seed(1)
    first = lmclab.create_model("mlp", seed=5, **config).state_dict()
    torch.manual_seed(2)  # another state of the global generator: the same model
    again = lmclab.create_model("mlp", seed=5, **config).state_dict()
    other = lmclab.create_model("mlp", seed=6, **config).state_dict()
    assert _same(first, again) and not any(torch.equal(first[k], other[k]) for k in first)


def test_merge_weighs_model_a_by_lam_off_the_midpoint() -> None:
    """``merge(a, b, alignment, lam=0.3)`` is 0.3·θa + 0.7·π(θb) on a pair that is no permuted copy."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    b = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    found = lmclab.find_permutation(a, b, example_inputs=torch.zeros(2, 6))
    pi_b, theta_a = found.apply(b), a.state_dict()
    assert not all(torch.equal(pi_b[k], b.state_dict()[k]) for k in pi_b)
    merged = lmclab.merge(a, b, found, lam=0.3)
    assert all(torch.allclose(merged[k], 0.3 * theta_a[k] + 0.7 * pi_b[k]) for k in theta_a)
    naive = lmclab.merge(a, b, lam=0.8)
    assert all(torch.allclose(naive[k], 0.8 * theta_a[k] + 0.2 * b.state_dict()[k]) for k in theta_a)


def test_a_curve_with_an_alignment_is_the_curve_of_the_aligned_model() -> None:
    """``curve(a, b, alignment=res)`` measures θa to π(θb) — the path ``curve(a, res.apply(b))`` measures — and
    without one the naive path; the alignment is applied to a checkpoint path alike."""
    a, b, x = _mlp(0), _mlp(1), torch.randn(64, 12)
    data = (x, torch.randint(0, 3, (64,)))
    res = lmclab.find_permutation(a, b, example_inputs=x, device="cpu")
    aligned = lmclab.curve(a, b, alignment=res, eval_data=data, lambdas=[0, 0.3, 0.5, 1], device="cpu")
    assert aligned.rows == lmclab.curve(a, res.apply(b), eval_data=data, lambdas=[0, 0.3, 0.5, 1], device="cpu").rows
    naive = lmclab.curve(a, b, eval_data=data, lambdas=[0, 0.3, 0.5, 1], device="cpu")
    assert naive.rows[1]["loss"] != pytest.approx(aligned.rows[1]["loss"])  # λ = 0.3: another path


def test_checkpoint_paths_are_models_with_their_factory(tmp_path, monkeypatch) -> None:
    """``.pt`` and ``.safetensors`` state dicts with ``factory=`` (a callable or ``"module:callable"``) find the
    alignment of the modules themselves; ``kwargs`` without a factory, or a factory beside a model, is refused."""
    from safetensors.torch import save_file

    a, b, x = _mlp(0), _mlp(1), torch.randn(8, 12)
    torch.save(a.state_dict(), tmp_path / "a.pt")
    save_file({k: v.contiguous() for k, v in b.state_dict().items()}, str(tmp_path / "b.safetensors"))
    truth = lmclab.find_permutation(a, b, example_inputs=x, device="cpu")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "api_path_nets.py").write_text(
        "from torch import nn\n\n\ndef mlp(width=16):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 16), nn.ReLU(), "
        "nn.Linear(16, 3))\n"
    )
    for factory in (lambda: _mlp(5), "api_path_nets:mlp"):
        res = lmclab.find_permutation(
            str(tmp_path / "a.pt"), tmp_path / "b.safetensors", factory=factory, example_inputs=x
        )
        assert all(torch.equal(res.perm[g], truth.perm[g]) for g in truth.perm)
    narrow = "api_path_nets:mlp"
    with pytest.raises(
        ValueError, match=r"^model_a: tensor '1\.weight' has shape \(16, 12\), the module of factory's \(8, 12\)$"
    ):
        lmclab.find_permutation(tmp_path / "a.pt", b, factory=narrow, kwargs={"width": 8}, example_inputs=x)
    with pytest.raises(ValueError, match=r"^kwargs: keyword arguments of factory=, which is not given$"):
        lmclab.find_permutation(a, b, kwargs={"width": 3}, example_inputs=x)
    with pytest.raises(ValueError, match=r"^factory: give the module as model= or its factory as factory=, not both$"):
        lmclab.find_permutation(a, b, model=a, factory=lambda: a, example_inputs=x)
    needs = (
        "model: tracing the permutation spec needs the nn.Module the state dicts belong to (pass model= or factory=, "
        "or model_a as a module, a Hugging Face folder or an lmclab checkpoint)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(needs)}$"):
        lmclab.find_permutation(tmp_path / "a.pt", tmp_path / "b.safetensors", example_inputs=x)


def test_lmclab_checkpoint_paths_are_aligned_in_their_architectures_spec_with_no_example_inputs(tmp_path) -> None:
    from lmclab.archs import build_model, get_arch, make_config
    from lmclab.archs.checkpoint import Checkpoint, save_checkpoint

    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, width=8, hidden=2)
    for seed in (0, 1):
        state = build_model("mlp", config, seed=seed).state_dict()
        save_checkpoint(tmp_path / f"{seed}.pt", Checkpoint("mlp", config, seed, state))
    res = lmclab.find_permutation(tmp_path / "0.pt", tmp_path / "1.pt", device="cpu")
    assert res.spec == get_arch("mlp").permutation_spec(config)
    data = (torch.randn(20, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.arange(20) % 3)
    am = lmclab.find_permutation(tmp_path / "0.pt", tmp_path / "1.pt", method="am", data=data, device="cpu")
    assert am.spec == res.spec and set(am.perm) == set(res.perm)  # at the architecture's own activation points


def test_a_curve_repairs_every_lambda_with_repair_as_the_pipeline_does() -> None:
    """``repair="repair"`` (and ``auto`` on a net without BatchNorm) is REPAIR of each θ(λ) on ``repair_samples``
    inputs: the pipeline's ``RepairAt`` on the same fixed subset, λ by λ."""
    from lmclab.core.bn_repair import repair_subset
    from lmclab.core.data import Split
    from lmclab.core.repair import RepairAt

    a, b = _mlp(0), _mlp(1)
    x, y = torch.randn(200, 12), torch.randint(0, 3, (200,))
    grid = [0.0, 0.25, 0.5, 1.0]
    fixed = lmclab.curve(a, b, eval_data=(x, y), lambdas=grid, repair="repair", repair_data=(x, y), repair_samples=50)
    assert (
        fixed.rows
        == lmclab.curve(a, b, eval_data=(x, y), lambdas=grid, repair="auto", repair_data=(x, y), repair_samples=50).rows
    )
    at = RepairAt(a, repair_subset(Split(x, y), 50))
    for row, lam in zip(fixed.rows, grid, strict=True):
        params = at(a.state_dict(), b.state_dict(), lam)
        logits = torch.func.functional_call(a, params, (x,))
        assert row["loss"] == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    plain = lmclab.curve(a, b, eval_data=(x, y), lambdas=grid)
    assert plain.rows[2]["loss"] != pytest.approx(fixed.rows[2]["loss"])


def test_a_calls_options_are_validated_once_on_their_way_down(monkeypatch) -> None:
    """The API validates ``options`` once; run_search and the method's own wrapper trust the validated model."""
    model = lmclab.search.METHODS["wm"].options
    calls, check = [], model.check.__func__

    def counted(cls, values):
        calls.append(dict(values))
        return check(cls, values)

    monkeypatch.setattr(model, "check", classmethod(counted))
    a, b = _mlp(0), _mlp(1)
    lmclab.find_permutation(a, b, options={"max_iter": 3}, example_inputs=torch.zeros(2, 12), device="cpu")
    assert calls == [{"max_iter": 3}]
