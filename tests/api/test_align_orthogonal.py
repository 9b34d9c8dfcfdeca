"""``lmclab.align(…, symmetry="orthogonal")`` on the project's ``gpt`` with RMSNorm: a copy whose residual stream
is rotated by a random orthogonal map, whose MLP units and heads are permuted and whose heads are turned inside
(queries and keys per rotary plane, values freely), built as a model of the original class, is aligned back
with no barrier along ``lmclab.curve``, while permutations alone leave one;
the alignment is saved with its matrices and kinds and read back; the refusals name their argument."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from torch import nn

import lmclab
from lmclab.archs import gpt
from lmclab.core.canonical import fold_gains
from lmclab.core.orthogonal import as_matrix
from lmclab.core.spec import apply_permutation, random_permutation

VOCAB, CONTEXT = 23, 8
NO_GROUP = (
    "symmetry: the tracer proves no group of {} orthogonal; P_0, the group on the most tensors, stays a permutation "
    "group: "
)
TIED_GAIN = "gain 'norm.weight' is read by 'head.weight', one tensor with another entry"
TIED = "; 'embed.weight' and 'head.weight' are one tensor: align the untied copies lmclab.canonicalize returns"


TIED_HEADS = (  # q/k turned per rotary plane and v/o inside the heads of 2 layers
    "symmetry: the tracer proves 4 groups of {} orthogonal, but P_0, the group on the most tensors, stays a "
    "permutation group: "
)


def _stream(spec) -> str:
    """The one group outside heads that ``spec`` marks (the residual stream); each headed group is orthogonal, or
    rotary (queries and keys under rotary positions, one per layer)."""
    (stream,) = (g for g in spec.kinds if g not in spec.heads)
    inside = [spec.kinds[g] for g in spec.kinds if g in spec.heads]
    assert set(inside) <= {"orthogonal", "rotary"} and 2 * inside.count("rotary") in (0, len(inside))
    return stream


def _whole(message: str) -> str:
    """A pattern matching exactly ``message``."""
    return f"^{re.escape(message)}$"


def _model(seed: int = 0, **options) -> torch.nn.Module:
    shapes = dict(width=12, depth=2, heads=2, mlp_ratio=2, norm="rmsnorm", position="rotary", tie_embeddings=False)
    cfg = gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, **(shapes | options))
    torch.manual_seed(seed)
    model = gpt.Model(cfg).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5) if "norm" in key else p.normal_(0, 0.3)
    return model


def _tokens(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, VOCAB, (n, CONTEXT), generator=g)
    return x, torch.roll(x, -1, dims=1)


@pytest.fixture(scope="module")
def planted():
    return _planted()


def _rotated_copies(model_a, spec):
    """θa's canonical form and three copies of it: θa, and the form moved by two random elements of every kind."""
    folded, copies = fold_gains(spec, model_a.state_dict()), [model_a]
    for seed in (4, 5):
        perm = random_permutation(spec.group_sizes(folded), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
        copies.append(apply_permutation(spec, perm, folded))
    return folded, copies


def _planted(**options):
    """θa with random gains; θb: its canonical form rotated and permuted, as a gpt of the same config."""
    model_a = _model(**options)
    spec = lmclab.trace_spec(model_a, _tokens()[0], symmetry="orthogonal")
    folded = fold_gains(spec, model_a.state_dict())
    perm = random_permutation(spec.group_sizes(folded), torch.Generator().manual_seed(3), spec.heads, spec.kinds)
    model_b = copy.deepcopy(model_a)
    model_b.load_state_dict(apply_permutation(spec, perm, folded))
    return model_a, model_b, spec


def test_a_rotated_and_permuted_copy_is_aligned_back_with_no_barrier(planted, tmp_path) -> None:
    model_a, model_b, spec = planted
    x, y = _tokens()
    res = lmclab.align(model_a, model_b, symmetry="orthogonal", example_inputs=x)
    assert res.spec.kinds == spec.kinds and res.perm[next(iter(spec.kinds))].shape == (12, 12)
    assert sorted(spec.kinds.values()).count("rotary") == 2  # each layer's queries and keys, turned per plane
    curve = lmclab.curve(model_a, model_b, alignment=res, eval_data=(x, y), num_lambdas=5)
    assert abs(curve.barrier()) <= 1e-6
    repaired = lmclab.curve(model_a, model_b, alignment=res, eval_data=(x, y), repair="repair", repair_data=(x, y))
    assert abs(repaired.barrier()) <= 1e-6  # REPAIR on the aligned pair, in the canonical form
    merged = lmclab.merge(model_a, model_b, res, lam=0.3)
    twin = copy.deepcopy(model_a)
    twin.load_state_dict(merged)  # the input's own architecture, in canonical form (gains 1)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model_a(x), rtol=1e-9, atol=1e-9)
    only = lmclab.find_permutation(model_a, model_b, example_inputs=x)
    assert lmclab.curve(model_a, model_b, alignment=only, eval_data=(x, y), num_lambdas=5).barrier() > 1e-2
    res.save(tmp_path / "rot.pt")
    back = lmclab.load_alignment(tmp_path / "rot.pt")
    assert back.spec == res.spec and back.spec.kinds == res.spec.kinds and back.spec.gains == res.spec.gains
    assert all(torch.equal(back.perm[g], p) for g, p in res.perm.items())
    torch.testing.assert_close(lmclab.merge(model_a, model_b, back, lam=0.3), merged, rtol=0, atol=0)


def test_grouped_queries_turned_with_their_key_heads_are_aligned_back_with_no_barrier() -> None:
    """4 query heads over 2 key/value heads: the query rows and W_O's columns are the key and value heads' features
    in 2 copies, turned and rotated alike; the planted copy comes back exactly, permutations alone do not."""
    model_a, model_b, spec = _planted(width=16, heads=4, kv_heads=2)
    read = (spec.axes["blocks.0.attn.q.weight"][0], spec.axes["blocks.0.attn.out.weight"][1])  # q rows, W_O columns
    assert [(e[0].copies, e[0].run) for e in read] == [(2, 4), (2, 4)]
    assert sorted(spec.kinds.values()).count("rotary") == 2
    x, y = _tokens()
    res = lmclab.align(model_a, model_b, symmetry="orthogonal", example_inputs=x)
    assert lmclab.l2_reduction(model_a, model_b, res) == pytest.approx(100.0, abs=1e-6)
    assert abs(lmclab.curve(model_a, model_b, alignment=res, eval_data=(x, y), num_lambdas=3).barrier()) <= 1e-6
    twin = copy.deepcopy(model_a)
    twin.load_state_dict(lmclab.merge(model_a, model_b, res, lam=0.3))
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model_a(x), rtol=1e-9, atol=1e-9)
    only = lmclab.find_permutation(model_a, model_b, example_inputs=x)
    assert lmclab.l2_reduction(model_a, model_b, only) < 50


def test_activation_matching_finds_the_rotation_by_procrustes_on_the_cross_moment() -> None:
    model_a, model_b, spec = _planted(position="learned")  # every group with activation points
    x, y = _tokens(64)
    res = lmclab.align(model_a, model_b, method="am", symmetry="orthogonal", data=(x, y))
    stream = next(iter(spec.kinds))
    assert res.perm[stream].shape == (12, 12)
    assert abs(lmclab.curve(model_a, model_b, alignment=res, eval_data=(x, y), num_lambdas=3).barrier()) <= 1e-6
    assert lmclab.l2_reduction(model_a, model_b, res) == pytest.approx(100.0, abs=1e-6)


def test_ste_trains_latent_maps_projected_to_the_mixed_group_from_weight_matching_s_start(planted) -> None:
    """STE over orthogonal groups (Theus et al. 2025, Algorithm 1): each projection is an element of the mixed
    group (an orthogonal matrix on the stream, orthogonal maps inside heads, index permutations of the MLP
    units). On the planted copy the first projection, weight matching's data-free start, is the planted element
    (kept: a small step only raises the held-out loss); on an independent pair one epoch of training lowers
    the held-out midpoint loss below that start's."""
    model_a, model_b, spec = planted
    x, y = _tokens(64)
    options = {"epochs": 1, "batch_size": 16, "lr": 0.01}
    res = lmclab.align(model_a, model_b, method="ste", symmetry="orthogonal", data=(x, y), options=options)
    assert res.stats["best_epoch"] == 0 and lmclab.l2_reduction(model_a, model_b, res) == pytest.approx(100, abs=1e-6)
    other = _model(seed=1)
    res = lmclab.align(model_a, other, method="ste", symmetry="orthogonal", data=(x, y), options=options | {"lr": 0.05})
    start, trained = (row["heldout_loss"] for row in res.stats["curve"])
    assert res.stats["best_epoch"] == 1 and trained < start - 0.05
    sizes = spec.group_sizes(fold_gains(spec, other.state_dict()))
    lmclab.core.spec.check_permutation(res.perm, sizes, spec.heads, spec.kinds)
    stream = _stream(spec)
    assert res.perm[stream].shape == (12, 12) and not torch.equal(
        res.perm[stream].abs().round(), res.perm[stream].abs()
    )
    assert all(res.perm[g].dim() == 1 for g in set(res.perm) - set(spec.kinds))  # the MLP units: permutations


def test_sinkhorn_ste_trains_exact_orthogonal_maps_beside_soft_permutations_from_weight_matching_s_element(
    planted,
) -> None:
    """The paper's Sinkhorn STE over the mixed group: with learning rates too small to move, ``init="wm"`` returns
    weight matching's element — the planted one: every distance removed — and the default start the identity;
    on an independent pair two epochs (λ drawn from U(0.4, 0.6)) end at an element of the mixed group whose merge
    at λ = ½ has a lower loss than its start's, the orthogonal maps moved off weight matching's."""
    model_a, model_b, spec = planted
    x, y = _tokens(64)
    still = {"epochs": 1, "batch_size": 32, "lr": 1e-12, "orthogonal_lr": 1e-12}
    options = still | {"init": "wm"}
    res = lmclab.align(model_a, model_b, method="ste_sinkhorn", symmetry="orthogonal", data=(x, y), options=options)
    assert lmclab.l2_reduction(model_a, model_b, res) == pytest.approx(100, abs=1e-6)
    res = lmclab.align(model_a, model_b, method="ste_sinkhorn", symmetry="orthogonal", data=(x, y), options=still)
    ident = lmclab.align(model_a, model_b, method="identity", symmetry="orthogonal", example_inputs=x)
    assert all(torch.allclose(as_matrix(res.perm[g]), as_matrix(p), atol=1e-9) for g, p in ident.perm.items())
    other = _model(seed=1)
    start = lmclab.align(model_a, other, symmetry="orthogonal", example_inputs=x)
    options = {"epochs": 2, "batch_size": 16, "lam_spread": 0.1, "init": "wm"}
    res = lmclab.align(model_a, other, method="ste_sinkhorn", symmetry="orthogonal", data=(x, y), options=options)
    sizes = spec.group_sizes(fold_gains(spec, other.state_dict()))
    lmclab.core.spec.check_permutation(res.perm, sizes, spec.heads, spec.kinds)
    stream = _stream(spec)
    assert float((res.perm[stream] - start.perm[stream]).abs().max()) > 0.05
    mid = {}
    for found in (start, res):
        rows = lmclab.curve(model_a, other, alignment=found, eval_data=(x, y), num_lambdas=3).rows
        mid[found.method] = next(row["loss"] for row in rows if row["lam"] == 0.5)
    assert mid["ste_sinkhorn"] < mid["wm"] - 0.05, mid


def test_merge_many_brings_rotated_copies_back_to_one_function_and_independent_models_closer_than_permutations(
    planted,
) -> None:
    """MergeMany over orthogonal groups (each model's step is weight matching over the mixed group): three copies
    of one model, two rotated and permuted by other elements, merge back to its function; three independent
    models end closer to their mean, Σ‖π_i(θ_i) − θ̄‖², than permutations bring their canonical copies; a
    method without orthogonal steps is refused in one line."""
    model_a, _, spec = planted
    x = _tokens()[0]
    folded, copies = _rotated_copies(model_a, spec)
    res = lmclab.merge_many(copies, symmetry="orthogonal", model=model_a, example_inputs=x)
    assert res.stats["distance"][-1] < 1e-20 and res.perms[1][_stream(spec)].shape == (12, 12)
    for method in ("star", "sync"):  # each copy matched to the first's frame; sync: every pair, synchronised
        found = lmclab.merge_many(copies, method=method, symmetry="orthogonal", model=model_a, example_inputs=x)
        torch.testing.assert_close(found.merged, folded, rtol=0, atol=1e-9)
    twin = copy.deepcopy(model_a)
    twin.load_state_dict(res.merged)  # MergeMany's frame: one of the group's, the function the same
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model_a(x), rtol=1e-9, atol=1e-9)
    models = [model_a, _model(seed=1), _model(seed=2)]
    rotated = lmclab.merge_many(models, symmetry="orthogonal", example_inputs=x).stats["distance"]
    canonical = [lmclab.canonicalize(m, x) for m in models]
    permuted = lmclab.merge_many(canonical, example_inputs=x).stats["distance"]
    assert rotated[0] == pytest.approx(permuted[0], rel=1e-12) and rotated[-1] < 0.9 * permuted[-1]
    expected = "method: 'zipit' seeks permutations only; symmetry orthogonal by ('merge_many', 'star', 'sync', 'c2m3')"
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.merge_many(models, method="zipit", symmetry="orthogonal", example_inputs=x)


def test_c2m3_over_orthogonal_groups_lands_on_rotated_copies_as_close_as_its_gap_allows(planted) -> None:
    """C2M3's Frank–Wolfe over the hull of each kind (spectral-norm balls, inside heads per head and plane): three
    copies of one model, two rotated and permuted, merge back to its parameters; the relaxed objective never
    decreases. A map is not snapped by its rounding as a permutation is, so the merge lands as close as the gap it
    stops at allows (a gap ε leaves parameters about √ε off)."""
    model_a, _, spec = planted
    x = _tokens()[0]
    folded, copies = _rotated_copies(model_a, spec)
    options = {"tol": 1e-15, "max_iter": 200}
    found = lmclab.merge_many(
        copies, method="c2m3", symmetry="orthogonal", model=model_a, example_inputs=x, options=options
    )
    torch.testing.assert_close(found.merged, folded, rtol=0, atol=1e-6)
    trace = found.stats["objective"]
    assert all(b >= a - 1e-12 * abs(a) for a, b in zip(trace, trace[1:], strict=False))
    assert found.stats["iterations"] < 200 and found.perms[1][_stream(spec)].shape == (12, 12)


@pytest.mark.parametrize("method", ["wm", "am"])
def test_a_layernorm_copy_rotated_about_the_all_ones_vector_is_aligned_back(method: str) -> None:
    model_a, model_b, spec = _planted(norm="layernorm", position="learned")
    stream = _stream(spec)
    assert spec.kinds[stream] == "centred" and len(spec.kinds) == 5  # and q/k, v/o inside the heads of 2 layers
    x, y = _tokens(64)
    res = lmclab.align(model_a, model_b, method=method, symmetry="orthogonal", example_inputs=x[:2], data=(x, y))
    ones = torch.ones(12, dtype=torch.float64)
    torch.testing.assert_close(res.perm[stream] @ ones, ones, rtol=0, atol=1e-10)
    assert abs(lmclab.curve(model_a, model_b, alignment=res, eval_data=(x, y), num_lambdas=3).barrier()) <= 1e-6


def test_the_refusals_name_their_argument(planted) -> None:
    model_a, model_b, _ = planted
    x = _tokens()[0]
    with pytest.raises(
        ValueError, match=_whole("symmetry: expected one of ('permutation', 'orthogonal'), got 'rotation'")
    ):
        lmclab.align(model_a, model_b, symmetry="rotation", example_inputs=x)
    with pytest.raises(
        ValueError,
        match=r"^method: 'wm_sinkhorn' seeks permutations only; "
        r"symmetry orthogonal by \('identity', 'wm', 'am', 'ste', 'ste_sinkhorn'\)$",
    ):
        lmclab.align(model_a, model_b, method="wm_sinkhorn", symmetry="orthogonal", example_inputs=x)
    pearson = (
        "statistic: 'pearson' normalises each unit, which an orthogonal map mixes; orthogonal groups are matched on "
        "the cross moment E[a bᵀ] (cross_moment)"
    )
    with pytest.raises(ValueError, match=_whole(pearson)):
        options = {"statistic": "pearson"}
        lmclab.align(model_a, model_b, method="am", symmetry="orthogonal", data=_tokens(), options=options)
    tied = _model(tie_embeddings=True)
    with pytest.raises(ValueError, match=_whole(TIED_HEADS.format("Model") + TIED_GAIN + TIED)):
        lmclab.align(tied, tied, symmetry="orthogonal", example_inputs=x)
    refusal = "find_permutation() seeks permutations: call lmclab.align(..., symmetry=...) for other kinds"
    with pytest.raises(TypeError, match=_whole(refusal)):
        lmclab.find_permutation(model_a, model_b, symmetry="orthogonal", example_inputs=x)
    res = lmclab.align(model_a, model_b, symmetry="orthogonal", example_inputs=x)
    with pytest.raises(
        ValueError,
        match=_whole("group 'P_0' is a permutation group: an orthogonal map of its units changes the function"),
    ):
        lmclab.apply_permutation(dataclasses.replace(res.spec, kinds={}), res.perm, model_b.state_dict())
    moved = lmclab.apply_permutation(res.spec, res.perm, model_b.state_dict())  # folds θb's gains (all 1 here)
    twin = copy.deepcopy(model_a)
    twin.load_state_dict(lmclab.apply_permutation(res.spec, res.perm, model_a.state_dict()))  # θa's are not
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model_a(x), rtol=1e-9, atol=1e-9)
    assert set(moved) == set(model_b.state_dict())


def test_the_refusal_of_no_orthogonal_group_says_which_node_keeps_the_widest_group_a_permutation_group() -> None:
    x = torch.randn(3, 4)
    mlp = nn.Sequential(nn.Linear(4, 5, bias=False), nn.Identity(), nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2))
    spec = lmclab.trace_spec(mlp, x, symmetry="orthogonal")  # P_0 on two tensors, P_1 on three
    relu = "node '_3': ReLU does not commute with rotations of its units"
    assert spec.kinds == {"P_0": "orthogonal"} and spec.kind_reasons == {"P_1": relu}
    mlp[1] = nn.GELU()
    spec = lmclab.trace_spec(mlp, x, symmetry="orthogonal")
    gelu = "node '_1': GELU does not commute with rotations of its units"
    assert spec.kinds == {} and spec.kind_reasons == {"P_0": gelu, "P_1": relu}
    expected = (
        "symmetry: the tracer proves no group of Sequential orthogonal; P_1, the group on the most tensors, "
        f"stays a permutation group: {relu}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        lmclab.align(mlp, mlp, symmetry="orthogonal", example_inputs=x)
    given = (
        "symmetry: the tracer proves no group of Sequential orthogonal (the spec marks none: "
        "trace_spec(..., symmetry='orthogonal') marks those it proves)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(given)}$"):
        lmclab.align(mlp, mlp, symmetry="orthogonal", example_inputs=x, spec=lmclab.trace_spec(mlp, x))
    linear = nn.Linear(4, 2)
    no_group = "symmetry: the tracer proves no group of Linear orthogonal: it has no group of units"
    with pytest.raises(ValueError, match=f"^{re.escape(no_group)}$"):
        lmclab.align(linear, linear, symmetry="orthogonal", example_inputs=x)


def test_the_refusal_of_state_dicts_names_the_class_of_their_module() -> None:
    tied, x = _model(tie_embeddings=True), _tokens()[0]
    with pytest.raises(ValueError, match=_whole(TIED_HEADS.format("Model") + TIED_GAIN + TIED)):
        lmclab.align(tied.state_dict(), tied.state_dict(), model=tied, symmetry="orthogonal", example_inputs=x)


def test_a_model_without_tied_tensors_is_refused_without_the_untying_hint() -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    relu = "node '_1': ReLU does not commute with rotations of its units"
    with pytest.raises(ValueError, match=_whole(NO_GROUP.format("Sequential") + relu)):
        lmclab.align(mlp, mlp.state_dict(), symmetry="orthogonal", example_inputs=torch.randn(2, 4))


def test_the_refusal_of_a_given_spec_names_the_class_of_model_a_not_of_model_b() -> None:
    """With a spec given, weight matching runs no module: the refusal names model_a's class, a module here,
    though model_b is a state dict."""
    x = torch.randn(2, 4)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    given = (
        "symmetry: the tracer proves no group of Sequential orthogonal (the spec marks none: "
        "trace_spec(..., symmetry='orthogonal') marks those it proves)"
    )
    with pytest.raises(ValueError, match=_whole(given)):
        lmclab.align(mlp, mlp.state_dict(), symmetry="orthogonal", spec=lmclab.trace_spec(mlp, x))


@pytest.mark.parametrize("which", [0, 1], ids=["model_a", "model_b"])
def test_a_zero_gain_beside_a_bias_is_refused_naming_the_model_it_belongs_to(which: int) -> None:
    models = [_model(norm="layernorm"), _model(norm="layernorm")]
    with torch.no_grad():
        models[which].blocks[0].norm1.weight[0] = 0.0
    expected = (
        f"model_{'ab'[which]}: the gain 'blocks.0.norm1.weight' has a zero entry; its bias 'blocks.0.norm1.bias' "
        "cannot be folded"
    )
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.align(*models, symmetry="orthogonal", example_inputs=_tokens()[0][:2])


@pytest.fixture(scope="module")
def layernorm_alignment() -> lmclab.Alignment:
    x = _tokens()[0][:2]
    return lmclab.align(_model(norm="layernorm"), _model(1, norm="layernorm"), symmetry="orthogonal", example_inputs=x)


@pytest.mark.parametrize("which", [0, 1], ids=["model_a", "model_b"])
def test_a_merge_by_an_orthogonal_alignment_names_the_model_whose_zero_gain_cannot_be_folded(
    layernorm_alignment, which: int
) -> None:
    found = layernorm_alignment
    models = [_model(norm="layernorm"), _model(1, norm="layernorm")]
    with torch.no_grad():
        models[which].blocks[0].norm1.weight[0] = 0.0
    zero = "the gain 'blocks.0.norm1.weight' has a zero entry; its bias 'blocks.0.norm1.bias' cannot be folded"
    expected = f"{('model_a', 'model_b')[which]}: {zero}"  # the model's own weights, not the alignment
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.merge(*models, found)
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.l2_reduction(*models, found)


def test_find_permutation_keeps_the_default_path_and_lists_every_keyword_of_align_but_symmetry(planted) -> None:
    import inspect

    align, find = (inspect.signature(f).parameters for f in (lmclab.align, lmclab.find_permutation))
    assert list(find) == [p for p in align if p != "symmetry"]
    model = _model()
    res = lmclab.find_permutation(model, model, example_inputs=_tokens()[0])
    assert res.spec.kinds == {} and all(p.dim() == 1 for p in res.perm.values())
    model_a, model_b, rotatable = _planted(position="learned")  # a spec given with its kinds: permutations all the same
    given = lmclab.find_permutation(model_a, model_b, spec=rotatable, options={"max_iter": 1})
    assert rotatable.kinds and given.spec.kinds == {} and all(p.dim() == 1 for p in given.perm.values())
    assert given.spec.gains == rotatable.gains  # the gains it folds stay folded
    model_a, model_b, rotary = planted  # but not with queries and keys turned per rotary plane
    refusal = f"spec: group {min(g for g, k in rotary.kinds.items() if k == 'rotary')!r} is rotary, which no "
    with pytest.raises(ValueError, match=_whole(refusal + "permutation inside its heads keeps")):
        lmclab.find_permutation(model_a, model_b, spec=rotary)


def test_canonicalize_folds_the_gains_into_a_copy_with_the_same_function() -> None:
    model, x = _model(), _tokens()[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = lmclab.canonicalize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-12, atol=1e-12)
    assert all(bool((p == 1).all()) for k, p in folded.state_dict().items() if "norm" in k)
    assert not torch.equal(folded.state_dict()["head.weight"], before["head.weight"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the caller's model kept


@pytest.mark.parametrize(("norm", "kind"), [("rmsnorm", "orthogonal"), ("layernorm", "centred")])
def test_canonicalize_unties_a_head_tied_to_the_embeddings_and_keeps_the_function(norm: str, kind: str) -> None:
    model, x = _model(tie_embeddings=True, norm=norm), _tokens()[0]
    folded = lmclab.canonicalize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-12, atol=1e-12)
    assert folded.head.weight is not folded.embed.weight and model.head.weight is model.embed.weight
    assert not torch.equal(folded.head.weight, folded.embed.weight)  # the final norm's gain: in the head alone
    assert torch.equal(folded.embed.weight, model.embed.weight)
    spec = lmclab.trace_spec(folded, x, symmetry="orthogonal")
    assert spec.kinds[_stream(spec)] == kind


def test_a_tied_model_is_refused_naming_the_shared_tensors_and_its_canonical_copies_are_aligned_back() -> None:
    x, y = _tokens()
    model_a = _model(tie_embeddings=True, norm="layernorm")
    with pytest.raises(ValueError, match=_whole(TIED_HEADS.format("Model") + TIED_GAIN + TIED)):
        lmclab.align(model_a, model_a, symmetry="orthogonal", example_inputs=x)
    canonical = lmclab.canonicalize(model_a, x)
    spec = lmclab.trace_spec(canonical, x, symmetry="orthogonal")
    perm = random_permutation(
        spec.group_sizes(canonical.state_dict()), torch.Generator().manual_seed(5), spec.heads, spec.kinds
    )
    model_b = copy.deepcopy(canonical)
    model_b.load_state_dict(apply_permutation(spec, perm, canonical.state_dict()))
    res = lmclab.align(canonical, model_b, symmetry="orthogonal", example_inputs=x)
    assert abs(lmclab.curve(canonical, model_b, alignment=res, eval_data=(x, y), num_lambdas=3).barrier()) <= 1e-6
    midpoint, naive = copy.deepcopy(canonical), copy.deepcopy(canonical)
    midpoint.load_state_dict(lmclab.merge(canonical, model_b, res))
    naive.load_state_dict(lmclab.merge(canonical, model_b))
    with torch.no_grad():
        torch.testing.assert_close(midpoint(x), model_a(x), rtol=1e-9, atol=1e-9)
        assert float((naive(x) - model_a(x)).abs().max()) > 1e-2


def test_canonicalize_unties_a_tied_head_whose_gain_reads_one_so_that_align_takes_the_copy() -> None:
    """A freshly built model's gains are ones: folding changes no value, yet the tracer folds the final gain
    into the head, so the canonical copy stays untied (tied again, the stream would be no orthogonal group)."""
    x = _tokens()[0]
    torch.manual_seed(0)
    model = gpt.Model(
        gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, width=12, depth=2, heads=2, norm="rmsnorm")
    ).double()
    assert all(bool((p == 1).all()) for k, p in model.named_parameters() if "norm" in k)
    folded = lmclab.canonicalize(model, x)
    assert folded.head.weight is not folded.embed.weight and torch.equal(folded.head.weight, folded.embed.weight)
    res = lmclab.align(folded, folded, symmetry="orthogonal", example_inputs=x)
    assert set(res.spec.kinds.values()) == {"orthogonal"}


class _SharedAfterANonlinearity(torch.nn.Module):
    """A gain on the stem's units read by ``first``; the two layers of ``pair`` (nested names, ``pair.0.weight``)
    share one weight that no gain reaches."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm, self.first = torch.nn.Linear(6, 6), torch.nn.RMSNorm(6), torch.nn.Linear(6, 6)
        self.pair = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))
        self.pair[2].weight = self.pair[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pair(torch.relu(self.first(self.norm(self.stem(x)))))


def test_canonicalize_keeps_a_shared_weight_that_no_gain_reads_tied() -> None:
    torch.manual_seed(0)
    model, x = _SharedAfterANonlinearity().double(), torch.randn(5, 6, dtype=torch.float64)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    folded = lmclab.canonicalize(model, x)
    assert folded.pair[2].weight is folded.pair[0].weight and bool((folded.norm.weight == 1).all())
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-12, atol=1e-12)


class _SharedMLPOnTheStream(torch.nn.Module):
    """One MLP applied twice to a residual stream under two names (ALBERT's shared layers): its tensors are
    shared, none of them is the stream's alone, so the stream stays orthogonal."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Linear(5, 8), torch.nn.Linear(8, 3)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 8))
        self.again = self.mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.mlp(h)
        return self.head(h + self.again(h))


def test_a_model_sharing_tensors_off_its_orthogonal_stream_is_aligned_back() -> None:
    """Shared tensors refuse the orthogonal symmetry only when they keep the widest group a permutation group."""
    torch.manual_seed(0)
    model_a, x = _SharedMLPOnTheStream().double().eval(), torch.randn(7, 5, dtype=torch.float64)
    spec = lmclab.trace_spec(model_a, x, symmetry="orthogonal")
    assert _stream(spec) == spec.axes["embed.weight"][0] and spec.axes["again.0.weight"] == spec.axes["mlp.0.weight"]
    perm = random_permutation(spec.group_sizes(model_a.state_dict()), torch.Generator().manual_seed(4), {}, spec.kinds)
    model_b = copy.deepcopy(model_a)
    model_b.load_state_dict(apply_permutation(spec, perm, model_a.state_dict()))
    assert model_b.again[0].weight is model_b.mlp[0].weight
    res = lmclab.align(model_a, model_b, symmetry="orthogonal", example_inputs=x)
    back = res.apply(model_b)
    for key, value in model_a.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=1e-10, atol=1e-10)
