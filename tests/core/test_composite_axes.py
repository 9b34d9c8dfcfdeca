"""Composite axes of a PermutationSpec: a flatten of a channel map onto the features of a
Linear (blocks) and a concatenation of channel groups (segments), in apply_permutation, the checks,
weight matching and the Sinkhorn relaxation."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from lmclab.core.spec import PermutationSpec, Segment, apply_permutation, build_spec, random_permutation
from lmclab.search.sinkhorn import soft_apply
from lmclab.search.weight_matching import weight_matching

# x (2 channels, 2 × 2) → conv a (3 channels, P), conv b (2 channels, Q) → cat → flatten (5 × 4) → head
SPEC = build_spec(
    {
        "a.weight": ("P", None, None, None),
        "a.bias": ("P",),
        "b.weight": ("Q", None, None, None),
        "head.weight": (None, (Segment("P", 12, 4), Segment("Q", 8, 4))),
        "head.bias": (None,),
    }
)


def params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "a.weight": (3, 2, 1, 1),
        "a.bias": (3,),
        "b.weight": (2, 2, 1, 1),
        "head.weight": (4, 20),
        "head.bias": (4,),
    }
    return {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}


def forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = torch.cat([F.conv2d(x, p["a.weight"], p["a.bias"]), F.conv2d(x, p["b.weight"])], 1)
    return F.linear(torch.flatten(torch.relu(h), 1), p["head.weight"], p["head.bias"])


def test_a_permutation_of_a_composite_spec_leaves_the_function_unchanged() -> None:
    p, x = params(), torch.randn(5, 2, 2, 2, dtype=torch.float64)
    perm = {"P": torch.tensor([2, 0, 1]), "Q": torch.tensor([1, 0])}
    permuted = apply_permutation(SPEC, perm, p)
    torch.testing.assert_close(forward(permuted, x), forward(p, x))
    # closed form: feature c·4 + k of the new head reads channel perm[c] of the old one
    columns = [perm["P"][c] * 4 + k for c in range(3) for k in range(4)] + [
        12 + perm["Q"][c] * 4 + k for c in range(2) for k in range(4)
    ]
    assert torch.equal(permuted["head.weight"], p["head.weight"][:, columns])


def test_composite_axes_are_checked_against_the_parameters() -> None:
    p = params()
    assert SPEC.group_sizes(p) == {"P": 3, "Q": 2}
    assert SPEC.groups["P"] == [("a.weight", 0), ("a.bias", 0), ("head.weight", 1)]
    with pytest.raises(ValueError, match=r"axis 1 of 'head.weight' has 24 entries, the spec's segments cover 20"):
        SPEC.check({**p, "head.weight": torch.zeros(4, 24)})
    lopsided = PermutationSpec(axes={**SPEC.axes, "head.weight": (None, (Segment("P", 15, 5), Segment("Q", 5, 5)))})
    with pytest.raises(
        ValueError,
        match=r"group 'P': axis 1 of 'head.weight' has 15 entries in blocks of 5, "
        r"expected 3 units|group 'Q'",
    ):
        lopsided.group_sizes(p)


def test_weight_matching_recovers_a_planted_permutation_through_blocks_and_segments() -> None:
    p = params(1)
    perm = random_permutation({"P": 3, "Q": 2}, torch.Generator().manual_seed(2))
    permuted = apply_permutation(SPEC, perm, p)
    found = weight_matching(SPEC, p, permuted)
    back = apply_permutation(SPEC, found.perm, permuted)
    assert all(torch.equal(back[k], v) for k, v in p.items())


def test_one_hot_soft_apply_equals_apply_permutation_on_composite_axes() -> None:
    p = params(3)
    perm = {"P": torch.tensor([1, 2, 0]), "Q": torch.tensor([1, 0])}
    soft = {g: torch.eye(len(q), dtype=torch.float64)[q] for g, q in perm.items()}
    expected = apply_permutation(SPEC, perm, p)
    for name, value in soft_apply(SPEC, soft, p).items():
        torch.testing.assert_close(value, expected[name], msg=name)
