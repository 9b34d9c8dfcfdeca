"""WM's kept cost terms (lmclab.search.wm_costs.TermCache): a term updated by the slices that moved equals
the one recomputed from scratch, the objective is the same float as ``matching_objective``, and the
choice between keeping, updating and recomputing sits where ``update_at`` puts it."""

from __future__ import annotations

import pytest
import torch
from conftest import random_params
from test_heads import _vit
from torch import nn

from lmclab.archs import get_arch, make_config
from lmclab.core.spec import PermutationSpec, random_permutation
from lmclab.search.weight_matching import matching_objective, weight_matching
from lmclab.search.wm_costs import TermCache, group_cost
from lmclab.trace import trace


def _mlp(seed: int):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=3, width=12)
    params = {k: v.double() for k, v in random_params("mlp", config, seed).items()}
    return get_arch("mlp").permutation_spec(config), params


def _conv_flatten(seed: int):
    """Conv → BatchNorm → conv → flatten (8 channels × 2 × 2 positions, a composite axis) → linear → linear."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32, 10),
        nn.ReLU(),
        nn.Linear(10, 3),
    ).double()
    spec = trace(net, torch.randn(2, 3, 4, 4, dtype=torch.float64)).spec
    return spec, {k: v.clone() for k, v in net.state_dict().items()}


def _headed(seed: int):
    _, _, spec, params = _vit(seed)
    return spec, params


FACTORIES = {"mlp": _mlp, "conv_flatten": _conv_flatten, "vit": _headed}


def _walk(spec, params, generator: torch.Generator):
    """Permutations as coordinate descent visits them: one group at a time, two units swapped, now and
    then a whole new permutation."""
    sizes = spec.group_sizes(params)
    perm = {g: torch.arange(n) for g, n in sizes.items()}
    yield dict(perm)
    for step in range(12):
        group = sorted(sizes)[step % len(sizes)]
        if step % 5 == 4:  # every group at once (the headed groups of a tie move together)
            perm = random_permutation(sizes, generator, spec.heads)
        elif sizes[group] > 1 and group not in spec.heads:
            i, j = torch.randperm(sizes[group], generator=generator)[:2].tolist()
            p = perm[group].clone()
            p[i], p[j] = p[j].clone(), p[i].clone()
            perm[group] = p
        yield dict(perm)


@pytest.mark.parametrize("arch", sorted(FACTORIES))
def test_kept_and_updated_terms_equal_the_costs_recomputed_from_scratch(arch: str) -> None:
    spec, params_a = FACTORIES[arch](0)
    params_b = FACTORIES[arch](1)[1]
    cache = TermCache(spec, params_a, params_b, update_at=1.0)
    for perm in _walk(spec, params_a, torch.Generator().manual_seed(3)):
        for group in spec.groups:
            kept, fresh = cache.cost(group, perm), group_cost(spec, group, perm, params_a, params_b)
            assert torch.allclose(kept, fresh, rtol=1e-10, atol=1e-10 * float(fresh.abs().max())), group
        assert cache.objective(perm) == matching_objective(spec, perm, params_a, params_b)  # the same float
    assert min(cache.counts.values()) > 0, cache.counts  # each of the three ways was taken


def test_update_at_bounds_the_moved_fraction_that_is_updated_rather_than_recomputed() -> None:
    spec, params_a = _mlp(0)
    params_b = _mlp(1)[1]
    identity = {g: torch.arange(n) for g, n in spec.group_sizes(params_a).items()}
    for moved, way in ((3, "updated"), (4, "recomputed")):  # 3 of 12 units is update_at = ¼; 4 is past it
        cache = TermCache(spec, params_a, params_b, update_at=0.25)
        cache.cost("P_1", identity)
        p = identity["P_0"].clone()
        p[:moved] = p[:moved].roll(1)  # a cycle through the first `moved` units: each of them moves
        before = dict(cache.counts)
        changed = {**identity, "P_0": p}
        assert torch.allclose(cache.cost("P_1", changed), group_cost(spec, "P_1", changed, params_a, params_b))
        after = {k: cache.counts[k] - before[k] for k in before}
        # P_1's cost: layers.1.weight (its input axis moved) and the bias and layers.2.weight (unchanged)
        assert after == {"kept": 2, "updated": int(way == "updated"), "recomputed": int(way == "recomputed")}
    cache = TermCache(spec, params_a, params_b, update_at=0.0)  # 0: every changed term recomputed
    cache.cost("P_1", identity)
    cache.cost("P_1", {**identity, "P_0": identity["P_0"].roll(1)})
    assert cache.counts["updated"] == 0 and cache.counts["recomputed"] == 2 * 3 - 2


def test_by_default_up_to_half_the_units_moved_are_updated_and_every_update_is_counted() -> None:
    spec, params_a = _mlp(0)
    params_b = _mlp(1)[1]
    identity = {g: torch.arange(n) for g, n in spec.group_sizes(params_a).items()}
    cache = TermCache(spec, params_a, params_b)
    cache.cost("P_1", identity)
    for moved in (6, 2, 7):  # 6 of 12 units is the default update_at = ½; 7 is past it
        p = identity["P_0"].clone()
        p[:moved] = p[:moved].roll(1)
        changed = {**identity, "P_0": p}
        assert torch.allclose(cache.cost("P_1", changed), group_cost(spec, "P_1", changed, params_a, params_b))
        cache.cost("P_1", identity)  # back: each moved unit moves again
    # P_1's three terms computed once; layers.1.weight's then updated at 6 and 2 moved units (there and back)
    # and recomputed at 7, while the bias and layers.2.weight are kept at every call after the first
    assert cache.counts == {"kept": 2 * 6, "updated": 4, "recomputed": 3 + 2}


def test_a_term_with_two_moved_axes_is_recomputed_not_updated() -> None:
    spec, params_a = _mlp(0)
    params_b = _mlp(1)[1]
    sizes = spec.group_sizes(params_a)
    identity = {g: torch.arange(n) for g, n in sizes.items()}
    cache = TermCache(spec, params_a, params_b, update_at=1.0)
    cache.term("layers.1.bias", 0, "P_1", identity)
    cache.term("layers.1.weight", 1, "P_0", identity)  # other axis: P_1
    swap = torch.arange(12)
    swap[[0, 1]] = swap[[1, 0]]
    both = {**identity, "P_0": swap, "P_1": swap.flip(0)}
    cache.counts = dict.fromkeys(cache.counts, 0)
    term = cache.term("layers.1.weight", 1, "P_0", both)
    assert cache.counts == {"kept": 0, "updated": 1, "recomputed": 0}  # only P_1 is on its other axis
    assert torch.allclose(
        term, group_cost(spec, "P_0", both, params_a, params_b) - _rest(spec, both, params_a, params_b)
    )


def _rest(spec, perm, params_a, params_b) -> torch.Tensor:
    """P_0's cost without its layers.1.weight term: layers.0 weight and bias."""
    a = torch.cat([params_a["layers.0.weight"], params_a["layers.0.bias"][:, None]], 1)
    b = torch.cat([params_b["layers.0.weight"], params_b["layers.0.bias"][:, None]], 1)
    return a @ b.T


def test_a_term_of_an_entry_with_three_permuted_axes_is_updated_on_the_one_that_moved() -> None:
    """``t`` is permuted on all three axes: the term of axis 0 has two other axes, one of them moved; the
    change's slices must still be permuted on the other (C)."""
    gen = torch.Generator().manual_seed(0)
    spec = PermutationSpec(axes={"t": ("A", "B", "C"), "u": ("B", None)})
    params_a, params_b = (
        {
            "t": torch.randn(4, 5, 6, generator=gen, dtype=torch.float64),
            "u": torch.randn(5, 3, generator=gen, dtype=torch.float64),
        }
        for _ in range(2)
    )
    sizes = spec.group_sizes(params_a)
    start = random_permutation(sizes, gen)
    cache = TermCache(spec, params_a, params_b, update_at=1.0)
    cache.cost("A", start)
    moved = {**start, "B": start["B"][[1, 0, 2, 3, 4]]}
    assert torch.allclose(cache.cost("A", moved), group_cost(spec, "A", moved, params_a, params_b))
    assert cache.counts == {"kept": 0, "updated": 1, "recomputed": 1}
    assert cache.objective(moved) == matching_objective(spec, moved, params_a, params_b)


def test_the_constant_terms_are_those_whose_other_axes_are_all_unpermuted() -> None:
    """A conv kernel (out, in, kh, kw) permuted on its input axis has unpermuted spatial axes: its term for
    the output group moves with the input's permutation, so it is no constant; the first conv's (its input
    is the image) is. The cost with the constants equals the cost computed from scratch."""
    from lmclab.search.wm_costs import constant_terms

    spec, params_a = _conv_flatten(0)
    _, params_b = _conv_flatten(1)
    constants = constant_terms(spec, params_a, params_b)
    assert ("3.weight", 0, spec.axes["3.weight"][0]) not in constants  # (8, 6, 3, 3): its input is permuted
    assert ("0.weight", 0, spec.axes["0.weight"][0]) in constants  # (6, 3, 3, 3): its input is the image
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(2))
    for group in spec.groups:
        with_constants = group_cost(spec, group, perm, params_a, params_b, constants)
        assert torch.allclose(with_constants, group_cost(spec, group, perm, params_a, params_b), rtol=1e-12), group


def test_weight_matching_reports_every_cost_term_it_asked_for_once() -> None:
    spec, params_a = _mlp(0)
    found = weight_matching(spec, params_a, _mlp(1)[1])
    assert all(len(spec.groups[g]) == 3 for g in spec.groups)  # a layer's weight and bias, the next weight
    assert sum(found.stats["products"].values()) == 3 * found.stats["assignments"]
    assert min(found.stats["products"].values()) > 0
