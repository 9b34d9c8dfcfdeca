"""Safetensors shards read one tensor at a time and written one shard at a time (lmclab.core.shards): what is read
equals what was written, shapes come from the headers alone, slices read only their rows, and every broken file
is one line naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lmclab.core.shards import INDEX, SINGLE, ShardedWeights, shard_files, shard_plan, write_shards

TENSORS = {
    "embed": torch.randn(40, 6, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16),
    "layer.weight": torch.randn(6, 6, generator=torch.Generator().manual_seed(1)),
    "layer.bias": torch.randn(6, generator=torch.Generator().manual_seed(2)).double(),
    "steps": torch.tensor([3, 4], dtype=torch.int64),
}


def written(folder: Path, max_shard_bytes: int) -> Path:
    folder.mkdir(exist_ok=True)
    sizes = {k: v.numel() * v.itemsize for k, v in TENSORS.items()}
    write_shards(folder, sizes, lambda name: TENSORS[name], max_shard_bytes=max_shard_bytes)
    return folder


@pytest.mark.parametrize("max_shard_bytes", [10**6, 100])
def test_what_is_read_is_what_was_written_in_the_compute_dtype(tmp_path: Path, max_shard_bytes: int) -> None:
    """One file or several shards with their index: every tensor back, floating ones in float32 (bfloat16's
    values exact), integers as stored; the headers give shapes and stored dtypes before any read."""
    folder = written(tmp_path, max_shard_bytes)
    files = shard_files(folder)
    assert len(set(files.values())) == (1 if max_shard_bytes > 1000 else 3)
    assert (folder / INDEX).is_file() == (max_shard_bytes < 1000) and (folder / SINGLE).is_file() != (
        folder / INDEX
    ).is_file()
    weights = ShardedWeights(files)
    assert weights.bytes_read == 0 and sorted(weights) == sorted(TENSORS) and len(weights) == 4
    assert weights.shapes == {k: v.shape for k, v in TENSORS.items()}
    assert weights.stored == {k: v.dtype for k, v in TENSORS.items()}
    for name, value in TENSORS.items():
        read = weights[name]
        assert read.dtype == (torch.int64 if name == "steps" else torch.float32)
        assert torch.equal(read, value.to(read.dtype))
    assert weights.bytes_read == weights.nbytes() == sum(v.numel() * v.itemsize for v in TENSORS.values())
    twice = weights.with_dtype(None)
    assert twice.bytes_read == 0 and twice["embed"].dtype == torch.bfloat16 and weights.dtype == torch.float32


def test_rows_reads_only_those_rows_and_an_alias_reads_its_source(tmp_path: Path) -> None:
    weights = ShardedWeights(shard_files(written(tmp_path, 100)), aliases={"head": "embed"})
    rows = weights.rows("embed", 7, 19)
    assert torch.equal(rows, TENSORS["embed"][7:19].float()) and weights.bytes_read == 12 * 6 * 2
    assert torch.equal(weights["head"], TENSORS["embed"].float()) and weights.shapes["head"] == (40, 6)
    assert torch.equal(weights.rows("head", 38, 40), TENSORS["embed"][38:].float())
    with pytest.raises(KeyError):
        weights["missing"]


def test_write_shards_holds_one_shard_at_a_time_and_plans_shards_within_the_bound(tmp_path: Path) -> None:
    """Each shard is written before the next one's first tensor is produced; no shard passes the bound unless one
    tensor alone does."""
    produced = []

    def produce(name: str) -> torch.Tensor:
        produced.append((name, sorted(p.name for p in tmp_path.iterdir())))
        return TENSORS[name]

    sizes = {k: v.numel() * v.itemsize for k, v in TENSORS.items()}
    total = write_shards(tmp_path, sizes, produce, max_shard_bytes=500)
    assert total == sum(sizes.values())
    plan = shard_plan(sizes, 500)
    assert plan == [["embed"], ["layer.weight", "layer.bias", "steps"]]  # embed alone: 480 bytes
    assert [files for name, files in produced if name == "layer.weight"] == [["model-00001-of-00002.safetensors"]]
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["metadata"]["total_size"] == total
    assert index["weight_map"] == {"embed": "model-00001-of-00002.safetensors"} | dict.fromkeys(
        ["layer.weight", "layer.bias", "steps"], "model-00002-of-00002.safetensors"
    )
    assert shard_plan({"a": 10, "b": 10, "c": 1}, 20) == [["a", "b"], ["c"]]  # at the bound: kept together
    assert shard_plan({"a": 10, "b": 11}, 20) == [["a"], ["b"]]
    with pytest.raises(ValueError, match=r"^max_shard_bytes: expected a positive number of bytes, got 0$"):
        shard_plan(sizes, 0)


def test_every_broken_folder_or_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(str(tmp_path))}: no safetensors weights"):
        shard_files(tmp_path)
    folder = written(tmp_path / "sharded", 100)
    index = json.loads((folder / INDEX).read_text())
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model-00002-of-00003.safetensors: file not found \(named by"):
        shard_files(folder)
    for text, why in (("{", "not a weight index"), ('{"weights": {}}', "not a weight index"), ("[1]", "not a weight")):
        (folder / INDEX).write_text(text)
        with pytest.raises(ValueError, match=f"{re.escape(str(folder / INDEX))}: {why}"):
            shard_files(folder)
    single = tmp_path / "single"
    single.mkdir()
    save_file({"a": torch.ones(3)}, str(single / SINGLE))
    data = (single / SINGLE).read_bytes()
    (single / SINGLE).write_bytes(data[:-5])  # truncated
    with pytest.raises(ValueError, match=r"model.safetensors: not a readable safetensors file \(truncated"):
        ShardedWeights(shard_files(single))
    (folder / INDEX).write_text(
        json.dumps(index | {"weight_map": {**index["weight_map"], "ghost": index["weight_map"]["embed"]}})
    )
    save_file({"layer.weight": TENSORS["layer.weight"]}, str(folder / "model-00002-of-00003.safetensors"))
    with pytest.raises(
        ValueError, match=r"model-0000\d-of-00003.safetensors: no tensor 'ghost' \(named by the folder's index\)$"
    ):
        ShardedWeights(shard_files(folder))


def test_folded_weights_are_fold_gains_of_each_entry_read_and_of_each_slice(tmp_path: Path) -> None:
    """A gain read as 1 + w (Gemma's) with a LayerNorm bias, read by an (out, in) weight and by an (in, out) one
    (GPT-2's Conv1D: the gain scales its rows): every entry and every slice of rows as fold_gains gives them."""
    from lmclab.core.canonical import FoldedWeights, fold_gains
    from lmclab.core.spec import PermutationSpec

    generator = torch.Generator().manual_seed(0)
    state = {
        "norm.weight": torch.rand(4, generator=generator),
        "norm.bias": torch.randn(4, generator=generator),
        "head.weight": torch.randn(9, 4, generator=generator),
        "conv.weight": torch.randn(4, 9, generator=generator),
    }
    spec = PermutationSpec(
        {"norm.weight": ("P",), "norm.bias": ("P",), "head.weight": (None, "P"), "conv.weight": ("P", None)},
        gains={"norm.weight": ("head.weight", "conv.weight")},
        gain_biases={"norm.weight": "norm.bias"},
        gain_offsets={"norm.weight": 1.0},
    )
    save_file(state, str(tmp_path / SINGLE))
    weights = ShardedWeights(shard_files(tmp_path))
    lazy, expected = FoldedWeights(weights, spec, "model_b"), fold_gains(spec, state)
    for name, value in expected.items():
        assert torch.allclose(lazy[name], value, atol=1e-6), name
        assert torch.allclose(lazy.rows(name, 1, 3), value[1:3], atol=1e-6), name
    assert torch.equal(lazy["norm.weight"], torch.zeros(4)) and lazy.bytes_read == weights.bytes_read > 0
    assert lazy.shapes == weights.shapes and isinstance(lazy, ShardedWeights)
    zero = tmp_path / "zero"
    zero.mkdir()
    save_file(state | {"norm.weight": torch.tensor([0.5, -1.0, 0.0, 2.0])}, str(zero / SINGLE))
    with pytest.raises(ValueError, match=r"^model_b: the gain 'norm.weight' has a zero entry; its bias 'norm.bias'"):
        FoldedWeights(ShardedWeights(shard_files(zero)), spec, "model_b")["norm.bias"]
