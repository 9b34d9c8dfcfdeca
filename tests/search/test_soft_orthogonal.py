"""The Sinkhorn STE's orthogonal groups (:mod:`lmclab.search.soft_orthogonal`): each latent maps to an exact element
of its kind with the exact gradient, the soft element is the hard one once the head scores are a permutation, the
end takes the head order the scores favour and each orthogonal group's own blocks there, and ``init="wm"`` starts
at weight matching's element of the mixed group."""

from __future__ import annotations

import pytest
import torch
from test_align_orthogonal import _model, _tokens
from test_heads import _rotary_gpt

import lmclab
from lmclab.core.canonical import fold_gains
from lmclab.core.heads import split_headed
from lmclab.core.orthogonal import as_matrix
from lmclab.core.spec import apply_permutation, check_permutation, random_permutation
from lmclab.search.sinkhorn import soft_apply, tie_key
from lmclab.search.soft_orthogonal import exact_elements, hard_mixed, soft_mixed, start_mixed
from lmclab.search.weight_matching import weight_matching

SINKHORN = {"tau": 1.0, "n_iter": 20}


@pytest.fixture(scope="module", params=["rotary", "layernorm", "mixed ties"])
def problem(request):
    """A gpt's canonical form (RMSNorm and rotary heads; LayerNorm: a centred stream; or rotary queries and keys
    tied to values and outputs that are permuted inside their heads) and a copy moved by a random element of every
    group, each with the spec it was traced to (the mixed ties': built by hand)."""
    if request.param == "mixed ties":
        model, spec = _rotary_gpt("rotary")
        folded = model.state_dict()
    else:
        model = _model() if request.param == "rotary" else _model(norm="layernorm", position="learned")
        spec = lmclab.trace_spec(model, _tokens()[0], symmetry="orthogonal")
        folded = fold_gains(spec, model.state_dict())
    planted = random_permutation(spec.group_sizes(folded), torch.Generator().manual_seed(3), spec.heads, spec.kinds)
    return spec, folded, apply_permutation(spec, planted, folded), planted


def _random_latents(spec, params, seed: int):
    """Scores and random latents (std 0.5) of every group, at the identity start."""
    generator = torch.Generator().manual_seed(seed)
    scores, bases, latents = start_mixed(
        spec, params, params, init="identity", generator=generator, device="cpu", lap_backend="scipy"
    )
    latents = {g: 0.5 * torch.randn(v.shape, generator=generator, dtype=torch.float64) for g, v in latents.items()}
    return scores, bases, latents


def test_every_latent_is_an_element_of_its_kind(problem) -> None:
    """Random latents give orthogonal maps, centred ones fixing the all-ones vector, per head blocks turning each
    rotary plane alone; at zero latents the bases."""
    spec, folded, _, _ = problem
    scores, bases, latents = _random_latents(spec, folded, 0)
    hard = hard_mixed(spec, scores, bases, latents, **SINKHORN)
    check_permutation(hard, spec.group_sizes(folded), spec.heads, spec.kinds)
    elements = exact_elements(spec, bases, latents)
    assert set(elements) == set(spec.kinds) and all(not torch.equal(elements[g], bases[g]) for g in elements)
    for g in set(elements) - set(spec.heads):  # the stream: orthogonal, or centred under LayerNorm
        torch.testing.assert_close(hard[g], elements[g], rtol=0, atol=1e-12)
    single = exact_elements(spec, {g: b.float() for g, b in bases.items()}, {g: v.float() for g, v in latents.items()})
    for g, element in single.items():  # a float32 model's: its own dtype, the same maps
        assert element.dtype == torch.float32
        torch.testing.assert_close(element.double(), elements[g], rtol=0, atol=1e-5)
    zero = {g: torch.zeros_like(v) for g, v in latents.items()}
    for g, element in exact_elements(spec, bases, zero).items():
        torch.testing.assert_close(element, bases[g], rtol=0, atol=1e-15)


def test_the_latents_gradients_are_exact(problem) -> None:
    """gradcheck of ``Σ W ⊙ element`` through the exponential (every kind) against finite differences."""
    spec, folded, _, _ = problem
    _, bases, latents = _random_latents(spec, folded, 1)
    for g, latent in latents.items():
        weights = torch.randn(exact_elements(spec, bases, {g: latent})[g].shape, dtype=torch.float64)

        def value(x, g=g, weights=weights):
            return (exact_elements(spec, bases, {g: x})[g] * weights).sum()

        assert torch.autograd.gradcheck(value, (latent.clone().requires_grad_(),), eps=1e-6, atol=1e-6)


def test_the_soft_element_is_the_hard_one_once_the_head_scores_are_a_permutation(problem) -> None:
    """Head scores far apart at a swapped head order and every permutation group's scores at a permutation: the
    soft elements move θ exactly as the hard ones do (float64, 1e-10), and the hard head order is the swap with
    each orthogonal group's blocks ``R[h, σ(h)]``."""
    spec, folded, _, _ = problem
    scores, bases, latents = _random_latents(spec, folded, 2)
    scores = {g: 60.0 * torch.eye(s.shape[-1], dtype=torch.float64).flip(0).expand_as(s) for g, s in scores.items()}
    soft = soft_mixed(spec, scores, bases, latents, **SINKHORN)
    hard = hard_mixed(spec, scores, bases, latents, **SINKHORN)
    moved, expected = soft_apply(spec, soft, folded), apply_permutation(spec, hard, folded)
    for key, value in expected.items():
        torch.testing.assert_close(moved[key], value, rtol=0, atol=1e-10)
    blocks = exact_elements(spec, bases, latents)
    for g in set(spec.heads) & set(latents):
        sigma, rotations = split_headed(hard[g], spec.heads[g].count)
        assert sigma.tolist() == [1, 0]
        torch.testing.assert_close(rotations, blocks[g][torch.arange(2), sigma], rtol=0, atol=1e-12)
    assert all(torch.equal(hard[g], torch.arange(len(hard[g])).flip(0)) for g in hard if g not in spec.kinds)


def test_the_head_order_weighs_orthogonal_blocks_by_their_head_scores_alone(problem) -> None:
    """Each orthogonal member contributes ``d · log sinkhorn(S_t)[h, h']`` to σ, whatever its blocks: with the
    permutation members' block scores uniform (every head pair worth the same), head scores slightly favouring the
    swap decide it; against them, the identity order."""
    spec, folded, _, _ = problem
    scores, bases, latents = _random_latents(spec, folded, 3)
    scores |= {g: torch.zeros_like(scores[g]) for g in spec.heads if g not in latents}  # the mixed ties' members
    for swap, order in ((0.1, [1, 0]), (-0.1, [0, 1])):
        scores |= {tie_key(h.tie): torch.tensor([[0.0, swap], [swap, 0.0]]).double() for h in spec.heads.values()}
        hard = hard_mixed(spec, scores, bases, latents, **SINKHORN)
        assert all(split_headed(as_matrix(hard[g]), 2)[0].tolist() == order for g in spec.heads)


def test_init_wm_starts_at_weight_matching_s_element_of_the_mixed_group(problem) -> None:
    """The start's hard element is weight matching's over the mixed group (here the planted element: its
    data-free start is exact), drawn from the same generator; the soft permutations' head scores moved to its σ."""
    spec, folded, moved, planted = problem
    start = start_mixed(
        spec, folded, moved, init="wm", generator=torch.Generator().manual_seed(0), device="cpu", lap_backend="scipy"
    )
    hard = hard_mixed(spec, *start, **SINKHORN)
    found = weight_matching(spec, folded, moved, generator=torch.Generator().manual_seed(0), restarts=1).perm
    for g in spec.group_sizes(folded):
        torch.testing.assert_close(as_matrix(hard[g]), as_matrix(found[g]), rtol=0, atol=1e-10)
        torch.testing.assert_close(as_matrix(hard[g]), as_matrix(planted[g]).T, rtol=0, atol=1e-8)
