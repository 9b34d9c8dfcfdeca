"""Merge/unmerge transforms (core/transform.py): permutations as transforms reproduce MergeMany's
merged model (torch.equal for N = 2 and 4, float64 rounding for N = 3) and the mean of the aligned
models for any permutations; which axis produces is read off the spec (weights, vectors, token tensors,
flattened conv features); invertible maps leave a linear network's function unchanged; a partial merge
shares exactly the zipped prefix and refuses what it cannot share; bad inputs are one-line errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.spec import PermutationSpec, apply_permutation, random_permutation
from lmclab.core.transform import (
    check_transforms,
    partial_merge,
    permutation_transforms,
    producing_axis,
    transform_merge,
    transformed,
)
from lmclab.search.merge_many import merge_many
from lmclab.search.universe import mean_params


def mlp(width: int = 6, hidden: int = 2, seed: int = 0, linear: bool = False):
    """A float64 MLP skeleton, its spec and one random state dict (``linear``: identity activations)."""
    config = make_config("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=hidden, width=width)
    model = build_model("mlp", config, seed=seed).double().eval()
    if linear:
        model.acts = nn.ModuleList(nn.Identity() for _ in range(hidden))
    return model, get_arch("mlp").permutation_spec(config), model.state_dict()


def noisy_copies(n: int, width: int = 6, hidden: int = 2):
    """``n`` different random MLPs (seeds 0…n−1) of one skeleton."""
    model, spec, _ = mlp(width, hidden)
    return model, spec, [mlp(width, hidden, seed=s)[2] for s in range(n)]


@pytest.mark.parametrize("n_models", [2, 3, 4])
def test_permutation_transforms_reproduce_merge_many(n_models):
    _, spec, params = noisy_copies(n_models)
    result = merge_many(spec, params)
    merges, unmerges = permutation_transforms(result.perms)
    merged = transform_merge(spec, params, merges, unmerges)
    assert merged.keys() == result.merged.keys()
    if n_models in (2, 4):  # x/2 and x/4 are exact, the sums run in the same order: bit for bit
        assert all(torch.equal(merged[k], result.merged[k]) for k in merged)
    else:  # x/3 rounds: Σ x_i/3 against (Σ x_i)/3
        diff = max(float((merged[k] - result.merged[k]).abs().max()) for k in merged)
        assert 0 < diff < 1e-15


def test_random_permutation_transforms_give_the_mean_of_the_aligned_models():
    """Independent of MergeMany: any permutations, N = 3, against apply_permutation then the mean."""
    _, spec, params = noisy_copies(3)
    gen = torch.Generator().manual_seed(3)
    perms = [random_permutation(spec.group_sizes(params[0]), gen) for _ in params]
    merged = transform_merge(spec, params, *permutation_transforms(perms))
    expected = mean_params([apply_permutation(spec, p, q) for p, q in zip(perms, params, strict=True)])
    assert max(float((merged[k] - expected[k]).abs().max()) for k in merged) < 1e-15


def test_producing_axes_read_off_the_spec():
    vit = get_arch("vit").permutation_spec(
        make_config("vit", input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=16, heads=4, depth=1)
    )
    assert producing_axis(vit.axes["embed.weight"]) == 0
    assert producing_axis(vit.axes["pos_embed"]) == 2  # (1, tokens, width): a token tensor of the stream
    assert producing_axis(vit.axes["cls_token"]) == 2
    assert producing_axis(vit.axes["head.weight"]) == 0  # consumes the stream on axis 1, produces logits
    assert producing_axis(vit.axes["norm.bias"]) == 0
    assert producing_axis(()) is None


def test_token_tensor_and_flattened_features_map_as_produced_and_consumed():
    """A hand-made spec: a token tensor (1, 2, 3) on group g produces (M on its last axis), a Linear reading
    g's 3 units flattened with 2 entries each (block 2) consumes (U on unit blocks), a BN's running_var
    gets |M|."""
    from lmclab.core.spec import PermutationSpec, Segment

    spec = PermutationSpec(
        axes={
            "tok": (None, None, "g"),
            "fc.weight": (None, (Segment("g", 6, 2),)),
            "bn.running_var": ("g",),
        }
    )
    gen = torch.Generator().manual_seed(0)
    params = {
        "tok": torch.randn(1, 2, 3, generator=gen, dtype=torch.float64),
        "fc.weight": torch.randn(4, 6, generator=gen, dtype=torch.float64),
        "bn.running_var": torch.rand(3, generator=gen, dtype=torch.float64),
    }
    m, u = torch.randn(3, 3, generator=gen, dtype=torch.float64), torch.randn(3, 3, generator=gen, dtype=torch.float64)
    out = transformed(spec, params, {"g": m}, {"g": u})
    assert torch.allclose(out["tok"], params["tok"] @ m.T)
    expected = torch.einsum("ojb,jk->okb", params["fc.weight"].reshape(4, 3, 2), u).reshape(4, 6)
    assert torch.allclose(out["fc.weight"], expected)
    assert torch.allclose(out["bn.running_var"], m.abs() @ params["bn.running_var"])


def test_invertible_maps_keep_a_linear_networks_function():
    """M = B, U = B⁻¹ on every group of a linear MLP: the transformed network computes the same logits
    (ReLU would not commute with B: the negative control)."""
    model, spec, params = mlp(linear=True)
    gen = torch.Generator().manual_seed(1)
    maps = {g: torch.randn(n, n, generator=gen, dtype=torch.float64) for g, n in spec.group_sizes(params).items()}
    out = transformed(spec, params, maps, {g: torch.linalg.inv(b) for g, b in maps.items()})
    x = torch.randn(5, 1, 4, 4, generator=gen, dtype=torch.float64)
    logits = functional_call(model, params, (x,))
    assert torch.allclose(functional_call(model, out, (x,)), logits, atol=1e-10)
    relu, _, _ = mlp()
    assert not torch.allclose(functional_call(relu, out, (x,)), functional_call(relu, params, (x,)), atol=1e-3)


def test_partial_merge_shares_the_zipped_prefix_and_keeps_each_models_tail():
    model, spec, params = noisy_copies(2, hidden=3)
    gen = torch.Generator().manual_seed(2)
    perms = [random_permutation(spec.group_sizes(params[0]), gen) for _ in params]
    merges, unmerges = permutation_transforms(perms)
    heads = partial_merge(spec, params, merges, unmerges, ["P_0"])
    full = transform_merge(spec, params, merges, unmerges)
    for k in ("layers.0.weight", "layers.0.bias"):
        assert torch.equal(heads[0][k], heads[1][k]) and torch.equal(heads[0][k], full[k])
    for i, head in enumerate(heads):
        assert torch.allclose(head["layers.1.weight"], params[i]["layers.1.weight"] @ unmerges[i]["P_0"])
        for k in ("layers.1.bias", "layers.2.weight", "out.weight", "out.bias"):
            assert torch.equal(head[k], params[i][k])
    # each head of an exact permuted copy computes its own model's function
    copies = [params[0], apply_permutation(spec, perms[1], params[0])]
    identity = {g: torch.arange(len(p)) for g, p in perms[0].items()}
    merges, unmerges = permutation_transforms([identity, {g: p.argsort() for g, p in perms[1].items()}])
    heads = partial_merge(spec, copies, merges, unmerges, ["P_0", "P_1"])
    x = torch.randn(4, 1, 4, 4, generator=gen, dtype=torch.float64)
    for head, p in zip(heads, copies, strict=True):
        assert torch.allclose(functional_call(model, head, (x,)), functional_call(model, p, (x,)), atol=1e-12)


def test_a_partial_merge_keeps_the_tail_of_unzipped_groups_without_copying_it():
    """Each model keeps its own tail: the tensors no zipped group touches are its own, not copies of them."""
    _, spec, params = noisy_copies(2, hidden=3)
    merges, unmerges = permutation_transforms([{g: torch.arange(6) for g in spec.groups}] * 2)
    heads = partial_merge(spec, params, merges, unmerges, ["P_0"])
    for head, own in zip(heads, params, strict=True):
        assert all(head[k].data_ptr() == own[k].data_ptr() for k in ("layers.1.bias", "layers.2.weight"))


def test_merged_and_partially_zipped_state_dicts_are_contiguous_as_safetensors_saves_them():
    """A map of a consuming axis (U on ``layers.1.weight``'s inputs) moves that axis back into place: a strided
    view there made ``lmclab.merge_many(…, method="zipit").merged`` a state dict ``save_file`` refuses."""
    from safetensors.torch import load, save

    _, spec, params = noisy_copies(2, hidden=3)
    gen = torch.Generator().manual_seed(4)
    merges, unmerges = permutation_transforms([random_permutation(spec.group_sizes(p), gen) for p in params])
    for state in (
        transform_merge(spec, params, merges, unmerges),
        *partial_merge(spec, params, merges, unmerges, ["P_0"]),
    ):
        assert all(torch.equal(v, state[k]) for k, v in load(save(state)).items())


def test_errors_are_one_line():
    _, spec, params = noisy_copies(2)
    merges, unmerges = permutation_transforms([{g: torch.arange(6) for g in spec.groups}] * 2)
    with pytest.raises(ValueError, match=r"^partial zip: 'layers.1.weight' produces zipped \['P_1'\] from unzipped"):
        partial_merge(spec, params, merges, unmerges, ["P_1"])
    bad = [dict(merges[0]), {**merges[1], "P_1": torch.eye(5, 6, dtype=torch.float64)}]
    with pytest.raises(ValueError, match=r"^model 1, group 'P_1': merge \(5, 6\) and unmerge \(6, 6\) must be"):
        check_transforms(spec, params, bad, unmerges)
    short = [params[0], {k: v for k, v in params[1].items() if k != "out.bias"}]
    with pytest.raises(ValueError, match=r"^params\[1\]: keys do not match the permutation spec \(missing \['out.bias"):
        check_transforms(spec, short, merges, unmerges)
    with pytest.raises(ValueError, match=r"^model 0: group 'P_0' has no merge or unmerge matrix$"):
        transform_merge(spec, params, [{}, {}], unmerges)
    with pytest.raises(ValueError, match=r"^weights must be 2 non-negative numbers summing to 1, got \[0.5, 0.6\]$"):
        transform_merge(spec, params, merges, unmerges, weights=[0.5, 0.6])
    vit_config = make_config("vit", input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=8, heads=2, depth=1)
    vit = build_model("vit", vit_config).state_dict()
    vit_spec = get_arch("vit").permutation_spec(vit_config)
    assert sorted(vit_spec.heads) == ["P_qk_0", "P_vo_0"]  # the first in order is named
    with pytest.raises(ValueError, match=r"^group 'P_qk_0' is headed: a general linear map would mix attention heads"):
        transform_merge(vit_spec, [vit, vit], [{}, {}], [{}, {}])


@pytest.mark.parametrize("weights", [None, [0.25, 0.75]], ids=["equal", "unequal"])
def test_a_floating_scalar_parameter_is_averaged_with_the_weights(weights):
    """A spec entry with no permuted axis (a learned temperature, a scalar layer scale) is ``Σ_i w_i s_i``
    like the logits, not one model's value; a permuted weight beside it is mapped as usual."""
    spec = PermutationSpec(axes={"w": ("P", None), "s": (), "t": (None,)})
    params = [
        {"w": torch.randn(3, 2), "s": torch.tensor(1.0), "t": torch.tensor([2.0, 4.0])},
        {"w": torch.randn(3, 2), "s": torch.tensor(5.0), "t": torch.tensor([6.0, 0.0])},
    ]
    eye = {"P": torch.eye(3)}
    merged = transform_merge(spec, params, [eye, eye], [eye, eye], weights=weights)
    w = weights or [0.5, 0.5]
    assert float(merged["s"]) == pytest.approx(w[0] * 1.0 + w[1] * 5.0)
    assert torch.allclose(merged["t"], w[0] * params[0]["t"] + w[1] * params[1]["t"])
    assert torch.allclose(merged["w"], params[0]["w"] + params[1]["w"])  # grouped: M θ U, not weighted


def test_a_segment_in_copies_is_refused_by_general_linear_maps_in_one_line() -> None:
    """Grouped queries' rows (2 copies of a key group) have no units of their own that a merge could map."""
    from lmclab.core.spec import Segment

    spec = PermutationSpec({"q": ((Segment("K", 4, 1, 2, 1),), None), "k": ("K", None)})
    params = {"q": torch.ones(4, 1), "k": torch.ones(2, 1)}
    with pytest.raises(
        ValueError, match=r"^group 'K' is read in copies \(grouped queries\): its units cannot be merged$"
    ):
        transformed(spec, params, {"K": torch.eye(2)}, {"K": torch.eye(2)})
