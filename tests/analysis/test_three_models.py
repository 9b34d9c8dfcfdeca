"""Three-model connectivity, the landscape plane and MergeMany."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from lmclab.analysis.landscape import landscape, plane_frame, plane_grid, plane_point
from lmclab.analysis.three_models import connect_triple
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.bn_repair import repair_subset
from lmclab.core.evaluate import evaluate, evaluate_ensemble
from lmclab.core.metrics import l2_distance, lambda_grid
from lmclab.core.options import OptionError
from lmclab.core.repair import RepairAt, repair_interpolated
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.search import run_search
from lmclab.search.merge_many import merge_many
from lmclab.search.registered import search_problem
from lmclab.search.result import SearchResult
from lmclab.search.universe import summed_distance
from lmclab.search.weight_matching import weight_matching


def _copies(ckpt, n: int) -> list[dict]:
    """``n`` randomly permuted copies of one model (the first is the model itself)."""
    spec = get_arch(ckpt.arch).permutation_spec(ckpt.config)
    sizes = spec.group_sizes(ckpt.state_dict)
    gen = torch.Generator().manual_seed(42)
    return [dict(ckpt.state_dict)] + [
        apply_permutation(spec, random_permutation(sizes, gen), ckpt.state_dict) for _ in range(n - 1)
    ]


def test_wm_makes_every_barrier_of_three_permuted_copies_zero(trained, splits) -> None:
    ckpt = trained(0)
    a, b, c = (Checkpoint(ckpt.arch, ckpt.config, s, p) for s, p in enumerate(_copies(ckpt, 3)))
    result = connect_triple(
        "wm",
        {"a": a, "b": b, "c": c},
        splits["train"],
        splits["test"],
        options={},
        seed=0,
        lams=lambda_grid(5),
        resolution=3,
        margin=0.0,
        device=torch.device("cpu"),
    )
    assert [e["edge"] for e in result.edges] == ["a-b", "a-c", "b-c"]
    for edge in result.edges:
        assert edge["l2"] == pytest.approx(0.0, abs=1e-6)
        assert edge["R_0.3"] == pytest.approx(1.0, abs=1e-5)  # identical models are perfectly aligned
        for key in ("test_loss_barrier_max", "test_acc_barrier_max", "train_loss_barrier_max"):
            assert edge[key] == pytest.approx(0.0, abs=1e-5), (edge["edge"], key)
    naive = connect_triple(
        "identity",
        {"a": a, "b": b, "c": c},
        splits["train"],
        splits["test"],
        options={},
        seed=0,
        lams=lambda_grid(5),
        resolution=3,
        margin=0.0,
        device=torch.device("cpu"),
    )
    naive_bc = next(e for e in naive.edges if e["edge"] == "b-c")
    assert naive_bc["test_loss_barrier_max"] > 0.1 and abs(naive_bc["R_0.3"]) < 0.5


def test_a_given_alignment_of_b_is_used_instead_of_a_search_and_checked(trained, splits) -> None:
    ckpt = trained(0)
    a, b, c = (Checkpoint(ckpt.arch, ckpt.config, s, p) for s, p in enumerate(_copies(ckpt, 3)))
    ckpts, cpu = {"a": a, "b": b, "c": c}, torch.device("cpu")
    args = dict(options={}, seed=0, lams=lambda_grid(3), resolution=2, margin=0.0, device=cpu)

    def triple(**kw):
        return connect_triple("wm", ckpts, splits["train"], splits["test"], **args, **kw)

    searched = triple()
    found = run_search("wm", search_problem(a.arch, a.config, a.state_dict, b.state_dict, device=cpu), seed=0)
    reused = triple(aligned={"b": SearchResult(found.perm, {"given": True})})
    assert reused.search["b"] == {"given": True}
    assert all(torch.equal(reused.perms[k][g], searched.perms[k][g]) for k in "bc" for g in searched.perms[k])
    assert reused.edges == searched.edges  # the pipeline's reuse of permute's θb → θa changes nothing
    sizes = get_arch(a.arch).permutation_spec(a.config).group_sizes(a.state_dict)
    naive = {g: torch.arange(n) for g, n in sizes.items()}  # a wrong but valid alignment is taken as given
    wrong = triple(aligned={"b": SearchResult(naive, {})})
    assert all(torch.equal(wrong.perms["b"][g], naive[g]) for g in sizes)
    assert next(e for e in wrong.edges if e["edge"] == "a-b")["l2"] > 1.0
    short = {g: p[:-1] for g, p in naive.items()}
    with pytest.raises(ValueError, match=r"^aligned\['b'\]: permutation of group .* is not a bijection"):
        triple(aligned={"b": SearchResult(short, {})})
    with pytest.raises(ValueError, match=r"^aligned: expected keys among 'b', 'c', got \['a'\]"):
        triple(aligned={"a": SearchResult(naive, {})})


def test_plane_grid_reproduces_the_three_models_exactly(trained, splits) -> None:
    a, b, c = trained(0).state_dict, trained(1).state_dict, trained(2).state_dict
    grid = plane_grid(4, 0.25)
    assert {0.0, 1.0} <= set(grid) and min(grid) == -0.25 and max(grid) == 1.25
    for (u, v), expected in (((0.0, 0.0), a), ((1.0, 0.0), b), ((0.0, 1.0), c)):
        point = plane_point(a, b, c, u, v)
        assert all(torch.equal(point[k], expected[k]) for k in a), (u, v)
    model = build_model("mlp", trained(0).config)
    rows = landscape(model, a, b, c, grid, splits["test"], keys=sorted(a))
    at = {(r["u"], r["v"]): r for r in rows}
    for (u, v), params in (((0.0, 0.0), a), ((1.0, 0.0), b), ((0.0, 1.0), c)):
        assert at[(u, v)]["acc"] == evaluate(model, params, splits["test"]).acc
    assert len(rows) == len(grid) ** 2
    with pytest.raises(ValueError, match="^resolution must be at least 2"):
        plane_grid(1, 0.1)


def test_plane_frame_gives_true_lengths_and_angle() -> None:
    a = {"w": torch.zeros(2)}
    b = {"w": torch.tensor([3.0, 0.0])}
    c = {"w": torch.tensor([1.0, 2.0])}
    norm_b, along, perp = plane_frame(a, b, c, ["w"])
    assert (norm_b, along, perp) == pytest.approx((3.0, 1.0, 2.0))


def test_merge_many_returns_the_original_up_to_permutation(trained) -> None:
    ckpt = trained(0)
    spec = get_arch("mlp").permutation_spec(ckpt.config)
    result = merge_many(spec, _copies(ckpt, 3), generator=torch.Generator().manual_seed(0))
    assert result.stats["distance"][-1] == pytest.approx(0.0, abs=1e-6)
    back = weight_matching(spec, ckpt.state_dict, result.merged)
    aligned = apply_permutation(spec, back.perm, result.merged)
    assert l2_distance(spec, ckpt.state_dict, aligned) == pytest.approx(0.0, abs=1e-5)


def test_merge_many_distance_never_increases_and_stops_at_the_cap(trained) -> None:
    params = [trained(s).state_dict for s in (0, 1, 2, 3)]
    spec = get_arch("mlp").permutation_spec(trained(0).config)
    result = merge_many(spec, params, max_iter=10, tol=0.0, generator=torch.Generator().manual_seed(1))
    d = result.stats["distance"]
    assert d[0] == pytest.approx(summed_distance(spec, params))
    assert d[-1] < d[0] and all(later <= earlier * (1 + 1e-9) for earlier, later in zip(d, d[1:], strict=False))
    capped = merge_many(spec, params, max_iter=1, tol=0.0)
    assert capped.stats["iterations"] == 1 and len(capped.stats["distance"]) == 2
    with pytest.raises(ValueError, match="^params must name at least 2 models"):
        merge_many(spec, params[:1])


def test_ensemble_of_identical_models_is_the_model(trained, splits) -> None:
    ckpt = trained(0)
    model = build_model("mlp", ckpt.config)
    single = evaluate(model, ckpt.state_dict, splits["test"])
    both = evaluate_ensemble(model, [ckpt.state_dict, ckpt.state_dict], splits["test"])
    assert both.acc == single.acc and math.isclose(both.loss, single.loss, rel_tol=1e-5)


def test_repair_measures_every_edge_with_and_without_it(trained, splits) -> None:
    """REPAIR in three-model connectivity: the plain barriers are kept as norepair_* (equal to a run
    without it), each repaired curve point is repair_interpolated()'s θ(λ) between the aligned pair, and REPAIR moves
    the b–c midpoint."""
    ckpts = {k: trained(s) for k, s in zip("abc", (0, 1, 2), strict=True)}
    model, data, cpu = build_model("mlp", ckpts["a"].config), repair_subset(splits["train"], 200), torch.device("cpu")
    args = dict(options={}, seed=0, lams=lambda_grid(3), resolution=2, margin=0.0, device=cpu)
    plain = connect_triple("wm", ckpts, splits["train"], splits["test"], **args)
    fixed = connect_triple("wm", ckpts, splits["train"], splits["test"], repair_at=RepairAt(model, data), **args)
    for p, f in zip(plain.edges, fixed.edges, strict=True):
        assert f["ln_repair"] and not p["ln_repair"] and not f["bn_repair"]
        barriers = [k for k in p if "barrier" in k]
        assert barriers and all(f[f"norepair_{k}"] == p[k] for k in barriers)
    curves = pd.DataFrame(fixed.curves)
    assert set(curves["repair"]) == {False, True} and not pd.DataFrame(plain.curves)["repair"].any()
    spec = get_arch("mlp").permutation_spec(ckpts["a"].config)
    b, c = (apply_permutation(spec, fixed.perms[k], ckpts[k].state_dict) for k in "bc")
    mid = curves[(curves["edge"] == "b-c") & curves["repair"] & (curves["split"] == "test") & (curves["lam"] == 0.5)]
    assert mid["loss"].item() == pytest.approx(
        evaluate(model, repair_interpolated(model, b, c, 0.5, data), splits["test"]).loss
    )
    bc = next(e for e in fixed.edges if e["edge"] == "b-c")
    assert bc["test_loss_mid"] != bc["norepair_test_loss_mid"]
    with pytest.raises(ValueError, match="^repair, repair_at: expected at most one of them"):
        connect_triple(
            "wm", ckpts, splits["train"], splits["test"], repair=lambda p: p, repair_at=RepairAt(model, data), **args
        )


def test_three_model_barriers_take_one_repair_at_most():
    """Refused before any work: the models and splits here are never read."""
    from lmclab.analysis.three_models import three_model_barriers

    with pytest.raises(ValueError, match=r"^repair, repair_at: expected at most one of them$"):
        three_model_barriers(None, None, {}, [0.0, 0.5, 1.0], {}, repair=object(), repair_at=object())


def test_the_edges_train_curves_read_a_fixed_subset(trained, splits) -> None:
    """With ``train_samples`` the a–b edge's train loss at λ = 1 is θa's loss on that subset, not on the split."""
    ckpt = trained(0)
    a, b, c = (Checkpoint(ckpt.arch, ckpt.config, s, p) for s, p in enumerate(_copies(ckpt, 3)))
    args = dict(options={}, seed=0, lams=lambda_grid(3), resolution=2, margin=0.0, device=torch.device("cpu"))
    result = connect_triple("wm", {"a": a, "b": b, "c": c}, splits["train"], splits["test"], train_samples=7, **args)
    at_a = next(r for r in result.curves if r["edge"] == "a-b" and r["split"] == "train" and r["lam"] == 1.0)
    model = get_arch(a.arch).Model(a.config)
    subset = repair_subset(splits["train"], 7)
    assert at_a["loss"] == pytest.approx(evaluate(model, a.state_dict, subset).loss, rel=1e-6)
    assert at_a["loss"] != pytest.approx(evaluate(model, a.state_dict, splits["train"]).loss, rel=1e-6)
    with pytest.raises(OptionError, match=r"^train_samples must be a positive number of images or null, got 0$"):
        connect_triple("wm", {"a": a, "b": b, "c": c}, splits["train"], splits["test"], train_samples=0, **args)
