"""Group elements of both kinds (lmclab.core.orthogonal): a permutation as its matrix acts as its index does,
orthogonal maps of a group whose operations are linear keep the function, inverse and composition."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from torch import Tensor

from lmclab.core.orthogonal import (
    act,
    as_matrix,
    check_centred,
    check_orthogonal,
    composed,
    inverse,
    ones_basis,
    polar,
    polar_centred,
    random_centred,
    random_orthogonal,
)
from lmclab.core.spec import (
    PermutationSpec,
    Segment,
    apply_permutation,
    check_permutation,
    compose,
    invert,
    random_permutation,
)

D, M, IN, OUT = 6, 5, 4, 3  # stream, hidden units, inputs, outputs


def _net_spec(kinds: dict[str, str]) -> PermutationSpec:
    """x → s = E x → s + D relu(U s + c) + d → H s: the stream S is read and written linearly only."""
    axes = {"E": ("S", None), "U": ("M", "S"), "c": ("M",), "D": ("S", "M"), "d": ("S",), "H": (None, "S")}
    return PermutationSpec(axes=axes, kinds=kinds)


def _params(seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"E": (D, IN), "U": (M, D), "c": (M,), "D": (D, M), "d": (D,), "H": (OUT, D)}
    return {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}


def _run(p: dict[str, Tensor], x: Tensor, stream_relu: bool = False) -> Tensor:
    s = x @ p["E"].T
    s = s + torch.relu(s @ p["U"].T + p["c"]) @ p["D"].T + p["d"]
    return (torch.relu(s) if stream_relu else s) @ p["H"].T


def _x() -> Tensor:
    return torch.randn(32, IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_an_orthogonal_map_of_a_linear_stream_keeps_the_function_and_a_nonlinearity_on_it_breaks_it() -> None:
    spec = _net_spec({"S": "orthogonal"})
    params, x = _params(), _x()
    perm = random_permutation({"S": D, "M": M}, torch.Generator().manual_seed(2), kinds=spec.kinds)
    assert perm["S"].shape == (D, D) and perm["M"].shape == (M,)
    moved = apply_permutation(spec, perm, params)
    torch.testing.assert_close(_run(moved, x), _run(params, x), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(moved["E"], params["E"])
    change = (_run(moved, x, stream_relu=True) - _run(params, x, stream_relu=True)).abs().max()
    assert change > 1e-2  # the negative control: a rotation does not commute with an elementwise ReLU


@pytest.mark.parametrize("block", [1, 3])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_a_permutation_as_its_matrix_acts_as_its_index_on_any_axis_and_block(axis: int, block: int) -> None:
    g = torch.Generator().manual_seed(axis + 10 * block)
    shape = [4, 5, 6]
    shape[axis] = 4 * block
    value = torch.randn(*shape, generator=g, dtype=torch.float64)
    perm = torch.randperm(4, generator=g)
    assert torch.equal(act(value, axis, as_matrix(perm), block), act(value, axis, perm, block))
    assert not torch.equal(act(value, axis, perm, block), value)


def test_an_index_acts_on_the_value_s_own_device() -> None:
    """The meta device stands in for a GPU: the index of a permutation of blocks is built where the value is."""
    value, perm = torch.zeros(6, 3, device="meta"), torch.tensor([2, 0, 1])
    for element in (perm, as_matrix(perm)):
        moved = act(value, 0, element, 2)
        assert moved.device.type == "meta" and moved.shape == (6, 3)


def test_composite_axes_with_a_matrix_act_segment_by_segment() -> None:
    """A flatten of 2 channels × 3 positions between 2 and 1 untouched features, read by a Linear (block 3)."""
    entry = (Segment(None, 2), Segment("C", 6, 3), Segment(None, 1))
    spec = PermutationSpec(axes={"W": ("O", entry), "b": ("O",)}, kinds={"C": "orthogonal"})
    params = _params_of({"W": (4, 9), "b": (4,)})
    index = {"C": torch.tensor([1, 0]), "O": torch.tensor([2, 0, 3, 1])}
    as_matrices = {"C": as_matrix(index["C"]), "O": index["O"]}
    assert torch.equal(apply_permutation(spec, as_matrices, params)["W"], apply_permutation(spec, index, params)["W"])
    rotated = apply_permutation(spec, {"C": random_orthogonal(2, torch.Generator()), "O": index["O"]}, params)
    untouched = [0, 1, 8]  # the segments before and after the channels
    assert torch.equal(rotated["W"][:, untouched], params["W"][index["O"]][:, untouched])


def _params_of(shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(5)
    return {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}


def test_inverse_and_composition_of_mixed_elements() -> None:
    spec, params = _net_spec({"S": "orthogonal"}), _params()
    g = torch.Generator().manual_seed(3)
    outer, inner = (random_permutation({"S": D, "M": M}, g, kinds=spec.kinds) for _ in range(2))
    twice = apply_permutation(spec, outer, apply_permutation(spec, inner, params))
    for k, v in apply_permutation(spec, compose(outer, inner), params).items():
        torch.testing.assert_close(v, twice[k], rtol=1e-12, atol=1e-12)
    back = apply_permutation(spec, invert(outer), apply_permutation(spec, outer, params))
    for k, v in back.items():
        torch.testing.assert_close(v, params[k], rtol=1e-12, atol=1e-12)
    perm = torch.randperm(5, generator=g)
    assert torch.equal(composed(perm, inverse(perm)), torch.arange(5))
    mixed = composed(perm, random_orthogonal(5, g))  # an index after a matrix: their product
    check_orthogonal("g", mixed, 5)


def test_random_orthogonal_is_orthogonal_and_haar_distributed() -> None:
    g = torch.Generator().manual_seed(4)
    draws = torch.stack([random_orthogonal(3, g) for _ in range(2000)])
    gram = draws.transpose(1, 2) @ draws
    torch.testing.assert_close(gram, torch.eye(3, dtype=torch.float64).expand_as(gram), rtol=0, atol=1e-12)
    # under the Haar measure every entry has mean 0 (an unsigned QR factor has O[0, 0] < 0 always)
    assert draws[:, 0, 0].mean().abs() < 0.05 and (draws[:, 0, 0] > 0).float().mean() > 0.4
    determinants = torch.linalg.det(draws)
    assert (determinants > 0).any() and (determinants < 0).any()


def test_polar_is_the_procrustes_optimum() -> None:
    g = torch.Generator().manual_seed(6)
    rotation = random_orthogonal(4, g)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    spd = a @ a.T + 0.1 * torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(polar(rotation @ spd), rotation, rtol=0, atol=1e-10)  # C = Q S: the optimum is Q
    cost = torch.randn(4, 4, generator=g, dtype=torch.float64)
    best = float((polar(cost) * cost).sum())
    assert best == pytest.approx(float(torch.linalg.svdvals(cost).sum()), rel=1e-12)  # ⟨O*, C⟩ = ‖C‖_*
    others = [float((random_orthogonal(4, g) * cost).sum()) for _ in range(200)]
    assert max(others) < best


def test_refusals_of_matrices() -> None:
    spec = _net_spec({"S": "orthogonal"})
    sizes = {"S": D, "M": M}
    perm = {"S": random_orthogonal(D, torch.Generator()), "M": torch.arange(M)}
    check_permutation(perm, sizes, kinds=spec.kinds)
    with pytest.raises(ValueError, match="'S' is a permutation group: an orthogonal map"):
        check_permutation(perm, sizes)
    with pytest.raises(ValueError, match=r"'S': the matrix is not orthogonal \(max \|OᵀO − I\| = 3 > 1e-06\)"):
        check_permutation({**perm, "S": 2 * perm["S"]}, sizes, kinds=spec.kinds)
    with pytest.raises(ValueError, match=r"'S': expected an orthogonal 6×6 matrix, got shape \(5, 5\)"):
        check_permutation({**perm, "S": perm["S"][:5, :5]}, sizes, kinds=spec.kinds)
    with pytest.raises(ValueError, match="expected an orthogonal"):
        check_orthogonal("S", torch.eye(3, dtype=torch.long), 3)
    nan = perm["S"].clone()
    nan[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not orthogonal"):
        check_orthogonal("S", nan, D)
    for kinds, bad in (({"S": "rotation"}, "'rotation' of 'S'"), ({"Z": "orthogonal"}, "'orthogonal' of 'Z'")):
        with pytest.raises(ValueError, match=f"kind {bad}: expected one of"):
            _net_spec(kinds).check(_params())


def test_centred_maps_fix_the_all_ones_vector_and_polar_centred_is_their_procrustes_optimum() -> None:
    g = torch.Generator().manual_seed(8)
    ones = torch.ones(5, dtype=torch.float64)
    draws = [random_centred(5, g) for _ in range(200)]
    for o in draws[:20]:
        check_centred("g", o, 5)
        torch.testing.assert_close(o @ ones, ones, rtol=0, atol=1e-12)
    cost = torch.randn(5, 5, generator=g, dtype=torch.float64)
    best = polar_centred(cost)
    check_centred("g", best, 5)
    value = float((best * cost).sum())
    assert value > max(float((o * cost).sum()) for o in draws)
    assert value < float((polar(cost) * cost).sum())  # the unconstrained optimum moves the all-ones vector
    check_centred("g", as_matrix(torch.randperm(5, generator=g)), 5)  # every permutation is centred
    check_centred("g", torch.eye(5), 5, atol=0.0)  # an error equal to atol is within it (‖O1 − 1‖ ≤ atol)
    with pytest.raises(ValueError, match=r"'g': the matrix moves the all-ones vector \(max \|O1 − 1\|"):
        check_centred("g", random_orthogonal(5, g), 5)


def test_a_centred_map_is_checked_to_the_tolerance_asked_by_default_one_in_a_million() -> None:
    """A rotation by 0.1 in one plane moves the all-ones vector by 0.105: refused; a centred map off orthogonal by
    1e-5 passes a tolerance of 1e-3 asked for, which both of its checks take."""
    turn = torch.eye(4, dtype=torch.float64)
    turn[:2, :2] = torch.tensor([[math.cos(0.1), -math.sin(0.1)], [math.sin(0.1), math.cos(0.1)]])
    check_orthogonal("g", turn, 4)
    with pytest.raises(
        ValueError, match=r"^group 'g': the matrix moves the all-ones vector \(max \|O1 − 1\| = 0\.1 > 1e-06\)$"
    ):
        check_centred("g", turn, 4)
    loose = (1 + 1e-5) * torch.eye(4, dtype=torch.float64)
    check_centred("g", loose, 4, atol=1e-3)
    with pytest.raises(
        ValueError, match=r"^group 'g': the matrix is not orthogonal \(max \|OᵀO − I\| = 2e-05 > 1e-06\)$"
    ):
        check_centred("g", loose, 4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_ones_basis_is_an_orthogonal_reflection_onto_the_all_ones_direction_in_the_dtype_asked(dtype) -> None:
    h = ones_basis(4, dtype)
    assert h.dtype == dtype
    torch.testing.assert_close(h[:, 0].double(), torch.full((4,), 0.5, dtype=torch.float64), rtol=0, atol=1e-2)
    torch.testing.assert_close((h @ h).double(), torch.eye(4, dtype=torch.float64), rtol=0, atol=2e-2)
    assert ones_basis(1, dtype).tolist() == [[1.0]] and ones_basis(1, dtype).dtype == dtype  # n = 1: the identity


def test_a_spec_s_gains_biases_and_offsets_survive_its_plain_data_and_older_data_reads_without_them() -> None:
    from lmclab.core.spec import PermutationSpec
    from lmclab.core.spec_data import spec_from_data, spec_to_data

    axes = {"norm.weight": (None,), "norm.bias": ("P_0",), "head.weight": (None, "P_0"), "g": (None,)}
    spec = PermutationSpec(
        axes,
        kinds={"P_0": "orthogonal"},
        gains={"norm.weight": ("head.weight",), "g": ("head.weight",)},
        gain_biases={"norm.weight": "norm.bias"},
        gain_offsets={"g": 1.0},
        kind_reasons={"P_1": "node 'gelu': GELU does not commute with rotations of its units"},
    )
    back = spec_from_data(spec_to_data(spec))
    assert back == spec and back.gain_offsets == {"g": 1.0} and back.gain_biases == {"norm.weight": "norm.bias"}
    assert back.kind_reasons == spec.kind_reasons
    assert spec == dataclasses.replace(spec, kind_reasons={})  # a report, like the pinned units: not the symmetry
    older = {k: v for k, v in spec_to_data(spec).items() if k not in ("gain_offsets", "kind_reasons")}
    assert spec_from_data(older).gain_offsets == {} and spec_from_data(older).gains == spec.gains
    assert spec_from_data(older).kind_reasons == {}


def test_a_segment_in_copies_survives_the_spec_s_plain_data_and_its_sizes_are_checked() -> None:
    """A query projection's rows as 2 copies of 2 key heads of 3 features (grouped queries): its plain data keeps
    the copies, a segment of another length is refused in one line, and rows that do not hold whole copies are
    named with the group's size."""
    from lmclab.core.spec_data import spec_from_data, spec_to_data

    rows = (Segment("K", 12, 1, 2, 3),)
    spec = PermutationSpec({"q": (rows, None), "k": ("K", None)}, kinds={"K": "orthogonal"})
    data = spec_to_data(spec)
    assert data["axes"]["q"][0] == [["K", 12, 1, 2, 3]] and spec_from_data(data) == spec
    assert spec.group_sizes({"q": torch.zeros(12, 2), "k": torch.zeros(6, 2)}) == {"K": 6}
    data["axes"]["q"][0] = [["K", 12, 1, 2]]
    with pytest.raises(ValueError, match=r"^spec: not a permutation spec .*\(and copies, run\), got \['K', 12, 1, 2\]"):
        spec_from_data(data)
    bad = PermutationSpec({"q": ((Segment("K", 10, 1, 2, 3),), None), "k": ("K", None)})
    expected = "group 'K': axis 0 of 'q' has 10 entries, not whole units of 1 (2 copies in runs of 3 units)"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        bad.group_sizes({"q": torch.zeros(10, 2), "k": torch.zeros(6, 2)})
    other = PermutationSpec({"q": (rows, None), "k": ("K", None)})
    expected = "group 'K': axis 0 of 'k' has 4 entries in blocks of 1, expected 6 units"  # q's 12 are 6 units
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        other.group_sizes({"q": torch.zeros(12, 2), "k": torch.zeros(4, 2)})
