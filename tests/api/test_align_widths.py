"""lmclab.align on two models of different widths (lmclab.api.widths): planted semi-permutations and maps with
orthonormal columns recovered, the aligned narrower model loadable in the wider one's module with its own
function, merges and curves through the alignment, saved and read back, and every refusal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lmclab
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.core.widths import widened
from lmclab.trace import trace


class Net(nn.Module):
    """Two hidden layers (ReLU) around a linear bottleneck of ``k`` units: permutation groups of ``hidden``
    units and, for ``symmetry="orthogonal"``, an orthogonal bottleneck."""

    def __init__(self, hidden: int, k: int, scale: float = 1.0) -> None:
        super().__init__()
        self.inp, self.down = nn.Linear(5, hidden), nn.Linear(hidden, k)
        self.up, self.out, self.scale = nn.Linear(k, hidden), nn.Linear(hidden, 3), scale

    def forward(self, x):
        return self.out(torch.relu(self.up(self.down(torch.relu(self.inp(x))) * self.scale)))


def net(hidden, k, seed, scale=1.0):
    torch.manual_seed(seed)
    return Net(hidden, k, scale).double().eval()


X = torch.randn(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def planted(symmetry: str):
    """θb narrow; θa its embedding moved by a random element of θa's group, the empty units then filled at random
    (small: the planted copies are the best matches; an orthogonal bottleneck keeps its empty directions empty)."""
    small = net(6, 3, 1)
    traced = trace(net(9, 5, 0), X[:2], symmetry=symmetry)
    spec, sizes = traced.spec, {"P_0": 9, "P_1": 5, "P_2": 9}
    wide = widened(spec, small.state_dict(), sizes, {"P_0": 6, "P_1": 3, "P_2": 6})
    if symmetry == "orthogonal":
        wide = {**wide, **{k: v + 0.1 * (v == 0) * torch.randn_like(v) for k, v in wide.items() if "inp" in k}}
    else:
        wide = {k: v + 0.1 * (v == 0) * torch.randn_like(v) for k, v in wide.items()}
    perm = random_permutation(sizes, torch.Generator().manual_seed(3), kinds=spec.kinds)
    big = net(9, 5, 2)
    big.load_state_dict(apply_permutation(spec, perm, wide))
    return big, small, perm


@pytest.mark.parametrize("symmetry", ["permutation", "orthogonal"])
def test_a_planted_embedding_is_recovered_and_loads_with_the_narrow_models_function(symmetry):
    big, small, perm = planted(symmetry)
    res = lmclab.align(big, small, symmetry=symmetry, example_inputs=X[:2])
    assert res.widths == {"P_0": 6, "P_1": 3, "P_2": 6}
    aligned = res.apply(small)
    twin = net(9, 5, 4)
    twin.load_state_dict(aligned)
    with torch.no_grad():
        assert torch.allclose(twin(X), small(X), rtol=1e-10, atol=1e-12)
    placed = aligned["inp.weight"].abs().sum(1) > 0  # θb's units land where the plant put them
    assert torch.allclose(aligned["inp.weight"][placed], big.state_dict()["inp.weight"][placed], atol=1e-9)
    if symmetry == "orthogonal":  # Q = O[:, :3], orthonormal columns: the bottleneck's writer as planted
        assert res.spec.kinds == {"P_1": "orthogonal"}
        assert torch.allclose(aligned["down.weight"], big.state_dict()["down.weight"], atol=1e-9)
    assert lmclab.l2_reduction(big, small, res) > 20
    for group, n in res.widths.items():  # π ∘ ι: orthonormal columns; a permutation group's one 1 per column
        q = res.matrix(group)
        assert q.shape == (len(res.perm[group]), n) and torch.allclose(q.T @ q, torch.eye(n, dtype=q.dtype))
        assert symmetry == "orthogonal" and group == "P_1" or set(q.unique().tolist()) == {0.0, 1.0}
    with pytest.raises(ValueError, match="group: 'P_9' is not a group of the alignment"):
        res.matrix("P_9")


def test_merges_and_curves_run_through_the_embedding():
    big, small = net(9, 5, 0), net(6, 3, 1)
    res = lmclab.align(big, small, example_inputs=X[:2])
    at_b, at_a = lmclab.merge(big, small, res, lam=0.0), lmclab.merge(big, small, res, lam=1.0)
    mid = lmclab.merge(big, small, res, lam=0.3)
    aligned = res.apply(small)
    assert all(torch.allclose(mid[k], 0.3 * big.state_dict()[k] + 0.7 * aligned[k]) for k in mid)
    twin = net(9, 5, 2)
    with torch.no_grad():
        twin.load_state_dict(at_b)
        assert torch.allclose(twin(X), small(X), rtol=1e-10, atol=1e-12)
        twin.load_state_dict(at_a)
        assert torch.allclose(twin(X), big(X))
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(1))
    curve = lmclab.curve(big, small, alignment=res, eval_data=(X, y), lambdas=[0.0, 0.5, 1.0])
    loss = {r["lam"]: r["loss"] for r in curve.rows}
    with torch.no_grad():
        assert loss[0.0] == pytest.approx(float(nn.functional.cross_entropy(small(X), y)), rel=1e-9)
        assert loss[1.0] == pytest.approx(float(nn.functional.cross_entropy(big(X), y)), rel=1e-9)


def test_an_alignment_of_other_widths_is_saved_and_read_back(tmp_path):
    big, small = net(9, 5, 0), net(6, 3, 1)
    res = lmclab.align(big, small, example_inputs=X[:2])
    res.save(tmp_path / "perm.pt")
    back = lmclab.load_alignment(tmp_path / "perm.pt")
    assert back.widths == res.widths and "θb narrower in 3" in repr(back)
    assert all(torch.equal(a, b) for a, b in zip(back.apply(small).values(), res.apply(small).values(), strict=True))
    with pytest.raises(ValueError, match="alignment: found for another model than params_b: group 'P_0' has 7"):
        back.apply(net(7, 3, 1))
    blob = torch.load(tmp_path / "perm.pt", weights_only=False)
    for bad in ({"P_0": 9}, {"P_0": 0}, {"P_0": "6"}):
        torch.save({**blob, "widths": bad}, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match="bad.pt: its widths are not fewer units than its groups'"):
            lmclab.load_alignment(tmp_path / "bad.pt")


class Normed(Net):
    def forward(self, x):
        h = nn.functional.layer_norm(self.inp(x), (self.inp.out_features,))
        return self.out(torch.relu(self.up(self.down(h))))


class Skip(Net):
    def forward(self, x):  # the same tensors, one more residual add: P_0 and P_2 one group
        h = torch.relu(self.inp(x))
        return self.out(torch.relu(self.up(self.down(h)) + h))


def test_refusals_name_the_argument():
    big, small = net(9, 5, 0), net(6, 3, 1)
    with pytest.raises(ValueError, match="group 'P_0' has 9 units, more than the reference model's 6"):
        lmclab.align(small, big, example_inputs=X[:2])
    with pytest.raises(
        ValueError,
        match=r"model_b: tensor 'inp.weight' has shape \(6, 5\), model_a's \(9, 5\) \(a model of other widths",
    ):
        lmclab.align(big, small.state_dict(), example_inputs=X[:2])
    spec = trace(big, X[:2]).spec
    with pytest.raises(ValueError, match="spec: model_b differs from model_a in width"):
        lmclab.align(big, small, spec=spec, example_inputs=X[:2])
    with pytest.raises(ValueError, match=r"model_b: node 'mul' computes with 0\.5, model_a's with 1: a number"):
        lmclab.align(big, net(6, 3, 1, scale=0.5), example_inputs=X[:2])
    torch.manual_seed(0)
    normed_big, normed_small = Normed(9, 5).double(), Normed(6, 5).double()
    with pytest.raises(ValueError, match="model_b: group 'P_0' differs in width, which changes the function: node"):
        lmclab.align(normed_big, normed_small, example_inputs=X[:2])
    with pytest.raises(ValueError, match="model_b: its symmetry groups are not model_a's"):
        lmclab.align(big, Skip(6, 3).double(), example_inputs=X[:2])
    with pytest.raises(ValueError, match="model_b: tensor 'inp.weight' has shape"):
        lmclab.merge(big, small)


@pytest.mark.parametrize("method", ["merge_many", "c2m3", "sync", "star"])
def test_the_universe_methods_embed_every_narrower_model_in_the_first_ones_widths(method):
    models = [net(9, 5, 0), net(6, 3, 1), net(9, 5, 2), net(4, 5, 3)]  # the last: narrower outside the bottleneck
    res = lmclab.merge_many(models, method=method, example_inputs=X[:2])
    assert res.widths == [{}, {"P_0": 6, "P_1": 3, "P_2": 6}, {}, {"P_0": 4, "P_2": 4}]
    twin = net(9, 5, 4)
    for model, aligned in zip(models, res.aligned, strict=True):
        twin.load_state_dict(aligned)
        with torch.no_grad():
            assert torch.allclose(twin(X), model(X), rtol=1e-10, atol=1e-12)
    mean = {k: sum(a[k] for a in res.aligned) / 4 for k in res.merged}
    assert all(torch.allclose(res.merged[k], mean[k]) for k in mean)


def test_merge_many_refusals_name_the_model():
    big, small = net(9, 5, 0), net(6, 3, 1)
    with pytest.raises(
        ValueError,
        match=r"models\[1\]: tensor 'inp.weight' has shape \(6, 5\), models\[0\]'s \(9, 5\) \(a model of other",
    ):
        lmclab.merge_many([big, small.state_dict()], example_inputs=X[:2])
    with pytest.raises(ValueError, match=r"models\[1\]: group 'P_0' has 9 units, more than the reference model's 6"):
        lmclab.merge_many([small, big], example_inputs=X[:2])
    with pytest.raises(ValueError, match=r"models\[2\]: node 'mul' computes with 0\.5, models\[0\]'s with 1: a number"):
        lmclab.merge_many([big, small, net(6, 3, 2, scale=0.5)], example_inputs=X[:2])
    with pytest.raises(ValueError, match="spec: the models differ in width"):
        lmclab.merge_many([big, small], spec=trace(big, X[:2]).spec, example_inputs=X[:2])
    assert lmclab.merge_many([big, net(9, 5, 1)], example_inputs=X[:2]).widths == []  # one width: nothing embedded
