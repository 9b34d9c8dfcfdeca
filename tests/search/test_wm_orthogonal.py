"""Weight matching with orthogonal groups (lmclab.search.wm_orthogonal): on the project's ``gpt`` with RMSNorm
in canonical form (unit gains), an orthogonal map of the residual stream keeps the logits, a planted copy
whose stream is rotated and whose MLP units and heads are permuted is brought back exactly, the objective
never decreases, and permutations alone cannot undo the rotation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.func import functional_call

from lmclab.archs import gpt
from lmclab.core.assignment import solve_assignment
from lmclab.core.heads import tie_sets
from lmclab.core.orthogonal import as_matrix
from lmclab.core.spec import PermutationSpec, apply_permutation, compose, invert, random_permutation
from lmclab.search.weight_matching import matching_objective, weight_matching
from lmclab.search.wm_orthogonal import constant_start
from lmclab.trace import trace_spec

VOCAB, CONTEXT = 29, 8


def _model(
    position: str, gains: bool = False, seed: int = 0, kv_heads: int | None = None
) -> tuple[torch.nn.Module, PermutationSpec]:
    """gpt with RMSNorm and an untied head in float64; unit norm gains (the canonical form) unless ``gains``.
    Its spec with the stream ``P_res`` orthogonal: the norms' gains are left out of the group (held at 1)."""
    cfg = gpt.Config(
        input_shape=(CONTEXT,), num_classes=VOCAB, width=12, depth=2, heads=2, mlp_ratio=2,
        norm="rmsnorm", position=position, tie_embeddings=False, kv_heads=kv_heads,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = gpt.Model(cfg).double().eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            norm_gain = "norm" in key and key.endswith("weight")
            p.copy_(torch.rand_like(p) + 0.5 if gains else torch.ones_like(p)) if norm_gain else p.normal_(0, 0.3)
    spec = gpt.permutation_spec(cfg)
    axes = {k: ((None,) if "norm" in k else v) for k, v in spec.axes.items()}
    return model, dataclasses.replace(spec, axes=axes, kinds={gpt.STREAM: "orthogonal"})


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, CONTEXT), generator=torch.Generator().manual_seed(1))


def _logits(model: torch.nn.Module, params: dict) -> torch.Tensor:
    x = _tokens()
    with torch.no_grad():
        return functional_call(model, params, (x,))


def _planted(model, spec, seed: int = 2):
    params = model.state_dict()
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(seed), spec.heads, spec.kinds)
    return params, perm, apply_permutation(spec, perm, params)


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_a_rotated_stream_keeps_the_logits_in_canonical_form_and_changes_them_with_gains(position: str) -> None:
    model, spec = _model(position)
    params, perm, moved = _planted(model, spec)
    assert perm[gpt.STREAM].shape == (12, 12)
    torch.testing.assert_close(_logits(model, moved), _logits(model, params), rtol=1e-10, atol=1e-10)
    gained, _ = _model(position, gains=True)  # the negative control: the gains do not commute with O
    change = _logits(gained, apply_permutation(spec, perm, gained.state_dict())) - _logits(gained, gained.state_dict())
    assert change.abs().max() > 1e-2


@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_wm_recovers_a_rotated_and_permuted_copy_exactly(position: str) -> None:
    model, spec = _model(position)
    params, perm, params_b = _planted(model, spec)
    result = weight_matching(spec, params, params_b)
    back = apply_permutation(spec, result.perm, params_b)
    for k, v in params.items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=1e-10, msg=k)
    identity = compose(result.perm, perm)  # π⁻¹ found: composed with π it is the identity
    torch.testing.assert_close(identity[gpt.STREAM], torch.eye(12, dtype=torch.float64), rtol=0, atol=1e-10)
    assert result.stats["first_start"] == "constant terms"
    only_permutations = dataclasses.replace(spec, kinds={})
    plain = weight_matching(only_permutations, params, params_b).perm
    gap = sum(float((apply_permutation(spec, plain, params_b)[k] - v).square().sum()) for k, v in params.items())
    assert gap > 1.0  # a rotation is no permutation: the permutation-only search cannot undo it


def test_the_objective_never_decreases_from_any_start_on_an_independent_pair() -> None:
    model, spec = _model("rotary")
    other, _ = _model("rotary", seed=5)
    params_a, params_b = model.state_dict(), other.state_dict()
    start = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3), spec.heads, spec.kinds)
    for init in (None, start):
        result = weight_matching(spec, params_a, params_b, restarts=3, init_perm=init)
        for stats_objective in (result.stats["objective"],):
            steps = torch.tensor(stats_objective).diff()
            assert (steps >= -1e-9 * abs(stats_objective[-1])).all() and len(stats_objective) > 2
        best = max(result.stats["restart_objectives"])
        assert result.stats["objective"][-1] == best
        assert matching_objective(spec, result.perm, params_a, params_b) == pytest.approx(best, rel=1e-12)
        naive = matching_objective(
            spec, {g: torch.arange(n) for g, n in spec.group_sizes(params_a).items()}, params_a, params_b
        )
        assert best > naive


@pytest.mark.parametrize("kv_heads", [None, 1])
@pytest.mark.parametrize("position", gpt.POSITIONS)
def test_the_data_free_start_is_the_planted_element(position: str, kv_heads: int | None) -> None:
    """The stream solved on its constant terms (the embedding and the head, of full rank), then every other group
    once on its cost, exact once the stream is: the start is the planted element before any sweep. With one
    key/value head the values are a plain orthogonal group whose only constant term is its bias (rank 1): solved
    on it alone, it would be wrong."""
    model, _ = _model(position, kv_heads=kv_heads)
    spec = trace_spec(model, _tokens(), symmetry="orthogonal")  # gains of 1: already canonical
    assert len(spec.kinds) == (3 if kv_heads else 5)  # rotary positions: q/k turned per plane, v/o orthogonal
    assert sorted(spec.kinds.values()).count("rotary") == (2 if position == "rotary" and not kv_heads else 0)
    params, perm, params_b = _planted(model, spec)
    start = constant_start(spec, params, params_b, solve_assignment)
    for g, p in invert(perm).items():
        torch.testing.assert_close(as_matrix(start[g]), as_matrix(p), rtol=0, atol=1e-10, msg=g)


def test_with_no_constant_terms_of_full_rank_the_start_is_the_identity() -> None:
    model, spec = _model("learned")
    heads_only = dataclasses.replace(spec, kinds=dict.fromkeys(spec.heads, "orthogonal"))
    params, _, params_b = _planted(model, heads_only)
    start = constant_start(heads_only, params, params_b, solve_assignment)
    assert all(torch.equal(as_matrix(p), torch.eye(len(p), dtype=torch.float64)) for p in start.values())


def test_orthogonal_matching_stops_at_max_iter_or_tol_and_keeps_the_best_of_its_starts() -> None:
    model, spec = _model("rotary")
    params_a, params_b = model.state_dict(), _model("rotary", seed=5)[0].state_dict()
    once = weight_matching(spec, params_a, params_b, max_iter=1)
    assert once.stats["sweeps"] == 1 and len(once.stats["objective"]) == 2
    assert weight_matching(spec, params_a, params_b, max_iter=2).stats["sweeps"] == 2
    gain = once.stats["objective"][1] / once.stats["objective"][0] - 1  # the first sweep's relative gain
    assert weight_matching(spec, params_a, params_b, tol=1.01 * gain, max_iter=2).stats["sweeps"] == 1
    assert weight_matching(spec, params_a, params_b, tol=0.99 * gain, max_iter=2).stats["sweeps"] == 2
    two = weight_matching(spec, params_a, params_b, restarts=2, max_iter=1, generator=torch.Generator().manual_seed(4))
    by_hand = torch.Generator().manual_seed(4)
    first = weight_matching(spec, params_a, params_b, max_iter=1, generator=by_hand)
    identity = {g: torch.arange(n) for g, n in spec.group_sizes(params_a).items()}
    second = weight_matching(spec, params_a, params_b, max_iter=1, generator=by_hand, init_perm=identity)
    finals = two.stats["restart_objectives"]
    assert finals == [first.stats["objective"][-1], second.stats["objective"][-1]] and finals[0] != finals[1]
    assert two.stats["objective"][-1] == max(finals) == finals[two.stats["kept_start"]]
    assert (first.stats["first_start"], second.stats["first_start"]) == ("constant terms", "init_perm")
    units = len(tie_sets(spec.group_sizes(params_a), spec.heads))  # each solved once a sweep (each has a cost)
    assert (once.stats["assignments"], two.stats["assignments"]) == (units, 2 * units)
