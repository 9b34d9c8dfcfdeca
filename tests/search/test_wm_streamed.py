"""Weight matching on checkpoints read lazily (lmclab.core.shards.ShardedWeights): the same permutation and
objective as in memory, no cost term kept, large entries read in slices along the axis no group acts on, and the
estimate of a sweep's cost (lmclab.search.wm_estimate) from the sizes alone."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import lmclab.search.weight_matching as wm
import lmclab.search.wm_costs as costs
from lmclab.core.progress import progress_bar
from lmclab.core.shards import ShardedWeights
from lmclab.core.spec import PermutationSpec, apply_permutation, identity_permutation, random_permutation
from lmclab.search.weight_matching import weight_matching
from lmclab.search.wm_estimate import Estimate, Rates, calibrate, estimate

# a token embedding and an output head (a vocabulary axis no group acts on), a layer between: P_0 the stream
SPEC = PermutationSpec(
    {"embed": (None, "P_0"), "w1": ("P_1", "P_0"), "b1": ("P_1",), "w2": ("P_0", "P_1"), "head": (None, "P_0")}
)
SHAPES = {"embed": (50, 8), "w1": (16, 8), "b1": (16,), "w2": (8, 16), "head": (50, 8)}


def params(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=generator) for k, s in SHAPES.items()}


def lazy(state: dict[str, torch.Tensor], folder: Path) -> ShardedWeights:
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    return ShardedWeights(dict.fromkeys(state, folder / "model.safetensors"))


@pytest.fixture
def sliced(monkeypatch: pytest.MonkeyPatch) -> int:
    """Slices of 64 entries: the (50, 8) entries are read 8 rows at a time."""
    monkeypatch.setattr(costs, "SLICE", 64)
    monkeypatch.setattr(wm, "SLICE", 64)
    return 64


def test_a_lazily_read_pair_is_matched_as_in_memory_with_no_term_kept(tmp_path: Path, sliced: int) -> None:
    a, b = params(0), params(1)
    found = weight_matching(SPEC, lazy(a, tmp_path / "a"), lazy(b, tmp_path / "b"))
    kept = weight_matching(SPEC, a, b)
    assert all(torch.equal(found.perm[g], kept.perm[g]) for g in kept.perm)
    assert found.stats["objective"] == pytest.approx(kept.stats["objective"], rel=1e-6)
    assert found.stats["products"]["kept"] == 0 < kept.stats["products"]["kept"]
    assert found.stats["products"]["recomputed"] > kept.stats["products"]["recomputed"]


def test_a_planted_copy_read_lazily_is_recovered_from_sliced_signatures(tmp_path: Path, sliced: int) -> None:
    a = params(0)
    perm = random_permutation(SPEC.group_sizes(a), torch.Generator().manual_seed(3))
    weights_a, weights_b = lazy(a, tmp_path / "a"), lazy(apply_permutation(SPEC, perm, a), tmp_path / "b")
    assert wm.is_relabelling(SPEC, weights_a, weights_b)
    found = weight_matching(SPEC, weights_a, weights_b)
    assert found.stats["first_start"] == "sorted signatures"
    restored = apply_permutation(SPEC, found.perm, apply_permutation(SPEC, perm, a))
    assert all(torch.equal(restored[k], a[k]) for k in a)


def test_a_value_changed_is_no_relabelling_read_in_slices(tmp_path: Path, sliced: int) -> None:
    """The change sits in the head's last slice, inside its range (the smallest and largest values unchanged)."""
    a = params(0)
    b = dict(a)
    b["head"] = a["head"].clone()
    b["head"][-1, 0] = (a["head"][-1, 0] + a["head"][-1, 1]) / 2
    assert not wm.is_relabelling(SPEC, lazy(a, tmp_path / "a"), lazy(b, tmp_path / "b"))
    assert wm.is_relabelling(SPEC, a, a) and not wm.is_relabelling(SPEC, a, b)


def test_entry_slices_cut_along_the_longest_free_axis_and_read_only_rows(tmp_path: Path, sliced: int) -> None:
    a, b = params(0), params(1)
    weights_a, weights_b = lazy(a, tmp_path / "a"), lazy(b, tmp_path / "b")
    parts = list(costs.entry_slices(SPEC, "embed", 1, weights_a, weights_b))
    assert [p.shape for p, _ in parts] == [(8, 8)] * 6 + [(2, 8)]  # 64 entries: 8 rows of 8
    assert torch.equal(torch.cat([p for p, _ in parts]), a["embed"]) and torch.equal(
        torch.cat([q for _, q in parts]), b["embed"]
    )
    assert weights_a.bytes_read == a["embed"].nbytes  # rows read, each once
    whole = list(costs.entry_slices(SPEC, "w1", 0, weights_a, weights_b))  # every axis acted on: whole
    assert len(whole) == 1 and torch.equal(whole[0][0], a["w1"])
    in_memory = list(costs.entry_slices(SPEC, "head", None, a, b))  # in memory: views of the tensors
    assert len(in_memory) == 7 and in_memory[0][0].data_ptr() == a["head"].data_ptr()


def test_a_term_summed_over_slices_is_the_whole_product(sliced: int) -> None:
    a, b = params(0), params(1)
    perm = random_permutation(SPEC.group_sizes(a), torch.Generator().manual_seed(5))
    moved = apply_permutation(SPEC, perm, b)
    for name, axis, group in (("embed", 1, "P_0"), ("head", 1, "P_0"), ("w1", 1, "P_0")):
        term = costs._term(SPEC, perm, name, axis, group, a, b)
        rows_a = a[name].movedim(axis, 0).reshape(a[name].shape[axis], -1)
        # the other axes of θb permuted: the same as π(θb) but with this axis left as it is
        undone = moved[name].index_select(axis, torch.argsort(perm[group]))
        rows_b = undone.movedim(axis, 0).reshape(a[name].shape[axis], -1)
        assert torch.allclose(term, rows_a @ rows_b.T, atol=1e-5)
    assert costs.matching_objective(SPEC, perm, a, b) == pytest.approx(
        sum(float(torch.dot(a[k].flatten(), moved[k].flatten())) for k in a), rel=1e-6
    )


def test_the_term_cache_keeps_terms_within_its_bound(sliced: int) -> None:
    a, b = params(0), params(1)
    perm = identity_permutation(SPEC.group_sizes(a))
    one = costs._term(SPEC, perm, "w1", 1, "P_0", a, b).nbytes  # an 8 × 8 float32 term: 256 bytes
    cache = costs.TermCache(SPEC, a, b, keep_bytes=one)
    first = cache.cost("P_0", perm)
    assert cache.kept_bytes <= one and len(cache.terms) == 1
    assert torch.allclose(cache.cost("P_0", perm), first) and cache.counts["kept"] == 1
    assert torch.allclose(first, costs.TermCache(SPEC, a, b).cost("P_0", perm))
    nothing = costs.TermCache(SPEC, a, b, keep_bytes=0)
    nothing.cost("P_0", perm)
    nothing.cost("P_0", perm)
    assert nothing.terms == {} and nothing.kept_bytes == 0 and nothing.counts["kept"] == 0


def test_the_progress_bar_names_the_group_and_the_bytes_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    weights_a, weights_b = lazy(params(0), tmp_path / "a"), lazy(params(1), tmp_path / "b")
    with progress_bar("wm", "sweep", True):
        weight_matching(SPEC, weights_a, weights_b)
    shown = capsys.readouterr().err
    assert "group=1/2" in shown and "read=0.00 GB" in shown


def test_the_estimate_is_the_closed_form_of_the_sweeps_products() -> None:
    """2·n_g·|W| per term, 2·|θ| for the objective; at 1e12 flops per second and 1 s per 1,024² assignment,
    two groups of 8 and 16 units."""
    shapes = {k: torch.Size(s) for k, s in SHAPES.items()}
    flops = 2 * 8 * (400 + 128 + 128 + 400) + 2 * 16 * (128 + 16 + 128) + 2 * sum(s.numel() for s in shapes.values())
    found = estimate(SPEC, shapes, rates=Rates(1e12, 1.0, 1e11, 3.0))
    assert found.groups == 2 and found.flops == flops
    assert found.seconds == pytest.approx(flops / 1e12 + (8 / 1024) ** 2.5 + (16 / 1024) ** 2.5)
    assert found.bytes == 16 * 400 + 16 * 16**2  # the largest entry whole (none sliced), the widest group's costs
    line = Estimate(33, 7.1e11, 9.2, 1.9e8).line()
    assert line == "estimated: 33 groups, 0.71 TFLOP and 9 s per sweep on this machine, 0.19 GB beyond the process's"
    rates = calibrate(64)
    assert all(r > 0 and math.isfinite(r) for r in rates) and rates.flops64 < 2 * rates.flops


def test_the_estimate_of_orthogonal_maps_counts_their_float64_products_and_svds() -> None:
    """P_0 orthogonal (8 units): each term and objective entry with a P_0 axis besides its own pays 2·8·|W| float64
    flops to move θb, and P_0's step is an SVD (t_256·(8/256)³) instead of an assignment."""
    spec, shapes = dataclasses.replace(SPEC, kinds={"P_0": "orthogonal"}), {k: torch.Size(s) for k, s in SHAPES.items()}
    flops32 = 2 * 8 * (400 + 128 + 128 + 400) + 2 * 16 * (128 + 16 + 128) + 2 * sum(s.numel() for s in shapes.values())
    flops64 = 16 * (128 + 128) + 16 * (400 + 128 + 128 + 400)  # P_1's terms of w1 and w2; the objective
    found = estimate(spec, shapes, rates=Rates(1e12, 1.0, 1e11, 3.0))
    assert found.flops == flops32 + flops64
    assert found.seconds == pytest.approx(flops32 / 1e12 + flops64 / 1e11 + 3.0 * (8 / 256) ** 3 + (16 / 1024) ** 2.5)
