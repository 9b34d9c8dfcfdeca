"""Matching and BatchNorm repair on trained conv nets (mnist5k digits, tiny widths, 1 thread).

WM on a permuted copy reaches L2 distance 0 and barrier 0 (exact recovery is not guaranteed on
residual nets, distance is); BN repair equals the closed form (mean and unbiased variance of each
BN's input over the repair batches) and makes eval mode reproduce train mode on its batch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm, repair_bn, repair_subset
from lmclab.core.data import Split, load_split, prepare
from lmclab.core.interpolation import measure_pair, measure_pair_with_repair
from lmclab.core.metrics import l2_distance
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.search import run_search
from lmclab.search.registered import search_problem
from lmclab.search.weight_matching import weight_matching
from lmclab.train.training import train

pytestmark = pytest.mark.slow  # module fixtures train two small conv nets (~30 s on a loaded CPU)

# small but trained: width ×½ ResNet20 and ×⅛ VGG11 on 1,000 digits, linear decay to lr 0
TRAINED = {
    "resnet20": ({"width_multiplier": 0.5}, dict(epochs=3, lr=2e-3, batch_size=50)),
    "vgg": ({"width_multiplier": 0.125}, dict(epochs=2, lr=3e-3, batch_size=64)),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two threads on a shared 2-core machine are ~10× slower than one (spin-waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict[str, Split]:
    root = tmp_path_factory.mktemp("digits")
    prepare("mnist5k", root / "raw", root / "prepared", max_train=1000)
    return {s: load_split(root / "prepared", s) for s in ("train", "test")}


@pytest.fixture(scope="module")
def trained(digits):
    out = {}
    for arch, (fields, options) in TRAINED.items():
        config = make_config(arch, input_shape=(1, 28, 28), num_classes=10, **fields)
        ckpt, history = train(
            arch, config, 0, digits["train"], digits["test"], schedule="linear", progress=False, **options
        )
        assert history[-1]["test_acc"] > 0.8, f"{arch} did not train: {history[-1]}"
        out[arch] = (config, ckpt.state_dict)
    return out


@pytest.mark.parametrize("arch", list(TRAINED))
def test_wm_on_permuted_copy_reaches_zero_distance_and_barrier(arch, trained, digits):
    config, params_a = trained[arch]
    spec = get_arch(arch).permutation_spec(config)
    planted = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3))
    params_b = apply_permutation(spec, planted, params_a)
    assert l2_distance(spec, params_a, params_b) > 1.0
    result = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    aligned = apply_permutation(spec, result.perm, params_b)
    assert l2_distance(spec, params_a, aligned) < 1e-5
    test = Split(digits["test"].x[:300], digits["test"].y[:300])
    _, summary = measure_pair(
        spec, build_model(arch, config), params_a, params_b, aligned, [0.0, 0.25, 0.5, 0.75, 1.0], {"test": test}
    )
    assert abs(summary["test_loss_barrier_max"]) < 1e-4 and summary["test_acc_barrier_max"] < 1e-9


def test_am_uses_residual_activation_points(trained, digits):
    config, params_a = trained["resnet20"]
    spec = get_arch("resnet20").permutation_spec(config)
    params_b = apply_permutation(
        spec, random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(4)), params_a
    )
    problem = search_problem(
        "resnet20",
        config,
        params_a,
        params_b,
        device=torch.device("cpu"),
        train=Split(digits["train"].x[:300], digits["train"].y[:300]),
    )
    result = run_search("am", problem, seed=0, options={})
    after = l2_distance(spec, params_a, apply_permutation(spec, result.perm, params_b))
    assert after < 0.05 * l2_distance(spec, params_a, params_b)


def _bn_inputs(model: nn.Module, params, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Input of every BN in a training-mode forward pass (batch statistics normalise)."""
    work = copy.deepcopy(model)
    work.load_state_dict(params)
    work.train()
    seen = {}
    for name, m in work.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_pre_hook(lambda _m, inp, name=name: seen.__setitem__(name, inp[0].detach()))
    with torch.no_grad():
        work(x)
    return seen


@pytest.mark.parametrize("batch_size", [200, 100])
def test_bn_repair_equals_closed_form(trained, digits, batch_size):
    config, params = trained["resnet20"]
    model = build_model("resnet20", config)
    data = Split(digits["train"].x[:200], digits["train"].y[:200])
    snapshot = {k: v.clone() for k, v in params.items()}
    repaired = repair_bn(model, params, data, batch_size=batch_size)
    assert all(torch.equal(params[k], snapshot[k]) for k in params)  # inputs untouched
    halves = [_bn_inputs(model, params, data.x[i : i + batch_size]) for i in range(0, 200, batch_size)]
    for name in halves[0]:
        means = torch.stack([h[name].mean((0, 2, 3)) for h in halves]).mean(0)
        variances = torch.stack([h[name].var((0, 2, 3), unbiased=True) for h in halves]).mean(0)
        assert torch.allclose(repaired[f"{name}.running_mean"], means, atol=1e-5, rtol=1e-4)
        assert torch.allclose(repaired[f"{name}.running_var"], variances, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(repaired[f"{name}.running_var"], params[f"{name}.running_var"])
    for k in params:
        if not k.endswith(("running_mean", "running_var", "num_batches_tracked")):
            assert torch.equal(repaired[k], params[k])


def test_bn_repair_makes_eval_mode_reproduce_train_mode_on_the_repair_batch(trained, digits):
    """Closed form instead of a bound on a trained model's accuracy (that bound, 0.01, failed on
    another CPU at 0.012): repaired from one batch, each BN's running stats are that batch's, so
    the eval-mode network computes what the train-mode network computes on the same batch (up to
    the unbiased/biased variance factor n/(n−1), n = 200·H·W ≥ 200·64)."""
    config, params = trained["resnet20"]
    model = build_model("resnet20", config)
    x = digits["train"].x[:200]
    repaired = repair_bn(model, params, Split(x, digits["train"].y[:200]), batch_size=200)
    work = copy.deepcopy(model)
    work.load_state_dict(repaired)
    with torch.no_grad():
        eval_logits = work.eval()(x)
        train_logits = work.train()(x)
        work.load_state_dict(params)
        stale_logits = work.eval()(x)
    assert torch.allclose(eval_logits, train_logits, rtol=1e-3, atol=1e-3)
    assert not torch.allclose(stale_logits, train_logits, rtol=1e-3, atol=1e-3)  # the check can fail


def test_measure_with_repair_reports_both_curves(trained, digits):
    config, params_a = trained["vgg"]
    model = build_model("vgg", config)
    assert has_batchnorm(model) and not has_batchnorm(
        build_model("mlp", make_config("mlp", input_shape=(1, 28, 28), num_classes=10))
    )
    params_b = train(
        "vgg",
        config,
        1,
        Split(digits["train"].x[:200], digits["train"].y[:200]),
        Split(digits["test"].x[:50], digits["test"].y[:50]),
        epochs=1,
        lr=3e-3,
        batch_size=50,
        progress=False,
    )[0].state_dict
    spec = get_arch("vgg").permutation_spec(config)
    test = Split(digits["test"].x[:300], digits["test"].y[:300])
    repair = bn_repair_hook(model, digits["train"], repair_samples=300)
    rows, summary = measure_pair_with_repair(
        spec, model, params_a, params_b, params_b, [0.0, 0.5, 1.0], {"test": test}, repair=repair
    )
    assert {r["repair"] for r in rows} == {False, True} and len(rows) == 6
    assert summary["bn_repair"] and "norepair_test_loss_barrier_mid" in summary
    # interpolating two different nets: the repaired midpoint beats stale statistics
    mid = {r["repair"]: r["acc"] for r in rows if r["lam"] == 0.5}
    assert mid[True] > mid[False]
    assert len(repair_subset(digits["train"], 300)) == 300
    with pytest.raises(ValueError, match=r"^repair_samples must be a positive number of images or null, got 0$"):
        repair_subset(digits["train"], 0)
