"""The streamed path (lmclab.api.folders, lmclab.api.streamed): two Hugging Face folders of safetensors matched,
measured and merged one tensor at a time — the same spec, permutation, L2 reduction and merged tensors as the
in-memory path, the merge a folder of shards with its index that ``from_pretrained`` loads, a tied head written
once, the path chosen by size, and every refusal in one line naming the argument."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

import lmclab
import lmclab.api.folders as folders
import lmclab.search.weight_matching as wm
import lmclab.search.wm_costs as costs
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
from test_cli import lmclab as command  # noqa: E402  (tests/cli is on the import path)

LLAMA = {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2}
LLAMA |= {"intermediate_size": 32, "vocab_size": 300, "max_position_embeddings": 16}


def saved(model: torch.nn.Module, folder: Path, state: dict | None = None) -> Path:
    """``model`` (with ``state``) saved in bfloat16 in shards of about 4 KB: several files and an index."""
    twin = copy.deepcopy(model).to(torch.bfloat16)
    if state is not None:
        twin.load_state_dict(state)
    twin.save_pretrained(folder, max_shard_size="4KB")
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a``, ``b`` (independent), ``p`` (a planted copy of ``a``), ``g``/``gp`` (a tied GPT-2 and its copy)."""
    work = tmp_path_factory.mktemp("streamed")
    config = transformers.LlamaConfig(**LLAMA)
    torch.manual_seed(0)
    a, b = transformers.LlamaForCausalLM(config).eval(), transformers.LlamaForCausalLM(config).eval()
    spec = trace_spec(a, torch.randint(0, 300, (2, 8)))
    state = a.to(torch.bfloat16).state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(1), spec.heads)
    saved(a, work / "a"), saved(b, work / "b"), saved(a, work / "p", apply_permutation(spec, perm, state))
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=300)).eval()
    with torch.no_grad():
        for key, p in gpt.named_parameters():
            if key.startswith("transformer.ln_f"):  # the gain folded into the head: off 1
                p.uniform_(0.5, 1.5)
    spec = trace_spec(gpt, torch.randint(0, 300, (2, 8)))
    perm = random_permutation(spec.group_sizes(gpt.state_dict()), torch.Generator().manual_seed(2), spec.heads)
    saved(gpt, work / "g"), saved(gpt, work / "gp", apply_permutation(spec, perm, gpt.to(torch.bfloat16).state_dict()))
    return work


@pytest.fixture
def sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 512 entries: the (300, 16) embedding and head are read 32 rows at a time."""
    monkeypatch.setattr(costs, "SLICE", 512)
    monkeypatch.setattr(wm, "SLICE", 512)


@pytest.mark.parametrize("pair", ["p", "b"])
def test_the_streamed_alignment_is_the_in_memory_one(work: Path, pair: str, sliced: None) -> None:
    streamed = lmclab.align(work / "a", work / pair, stream=True)
    kept = lmclab.align(work / "a", work / pair, stream=False)
    assert streamed.spec == kept.spec  # traced on the meta device
    assert all(torch.equal(streamed.perm[g], kept.perm[g]) for g in kept.perm)
    assert streamed.stats["bytes_read"] > 0 and streamed.stats["estimated_gb"] > 0 and "bytes_read" not in kept.stats
    reduction = lmclab.l2_reduction(work / "a", work / pair, streamed, stream=True)
    assert reduction == pytest.approx(lmclab.l2_reduction(work / "a", work / pair, kept), rel=1e-9)
    assert (reduction == pytest.approx(100.0)) == (pair == "p")


def test_the_merge_written_shard_by_shard_is_the_in_memory_merge(work: Path, tmp_path: Path, sliced: None) -> None:
    res = lmclab.align(work / "a", work / "b", stream=True)
    out = tmp_path / "merged"
    written = lmclab.merge_folders(work / "a", work / "b", out, res, lam=0.3, max_shard_bytes=3000)
    merged = lmclab.merge(work / "a", work / "b", res, lam=0.3)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and index["metadata"]["total_size"] == written == sum(v.nbytes for v in merged.values())
    assert all((out / f).stat().st_size < 3000 + 1000 for f in files if len(_names(index, f)) > 1)
    loaded = transformers.LlamaForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == torch.bfloat16 for k, v in merged.items())
    assert (out / "config.json").read_text() == (work / "a" / "config.json").read_text()
    assert (out / "generation_config.json").is_file() and not list(tmp_path.glob(".merged.*"))


def _names(index: dict, file: str) -> list[str]:
    return [k for k, v in index["weight_map"].items() if v == file]


def test_a_tied_head_is_read_from_the_embedding_and_written_once(work: Path, tmp_path: Path) -> None:
    res = lmclab.align(work / "g", work / "gp", stream=True)
    assert lmclab.l2_reduction(work / "g", work / "gp", res, stream=True) == pytest.approx(100.0)
    lmclab.merge_folders(work / "g", work / "gp", tmp_path / "m", res, lam=0.5)
    assert json.loads((tmp_path / "m" / "config.json").read_text()).get("tie_word_embeddings", True)
    assert "lm_head.weight" not in lmclab.api.folders.shard_files(tmp_path / "m")  # written once, as θa has it
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m")
    original = transformers.GPT2LMHeadModel.from_pretrained(work / "g")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert all(torch.equal(v, original.state_dict()[k]) for k, v in loaded.state_dict().items())


def test_the_path_is_chosen_by_size(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "bytes_read" not in lmclab.align(work / "a", work / "b").stats  # a few KB: in memory
    monkeypatch.setattr(folders, "STREAM_FROM", folders.folder_bytes(work / "a"))
    assert "bytes_read" in lmclab.align(work / "a", work / "b").stats  # at the bound: streamed
    monkeypatch.setattr(folders, "STREAM_FROM", folders.folder_bytes(work / "a") + 1)
    assert "bytes_read" not in lmclab.align(work / "a", work / "b").stats
    monkeypatch.setattr(folders, "STREAM_FROM", 0)
    loss = lmclab.align(work / "a", work / "b", method="identity", loss_fn=lambda out, target: out.sum())
    assert "bytes_read" not in loss.stats  # a loss: in memory


def test_every_refusal_is_one_line_naming_the_argument(work: Path, tmp_path: Path) -> None:
    a, b = work / "a", work / "b"
    cases = [
        (
            dict(method="am", data=[]),
            r"^stream: method 'am' is matched in memory; the streamed path matches weights \(identity, wm\)$",
        ),
        (dict(model=torch.nn.Linear(2, 2)), r"^stream: builds the module from the folder's config.json"),
    ]
    for keywords, message in cases:
        with pytest.raises(ValueError, match=message):
            lmclab.align(a, b, stream=True, **keywords)
    with pytest.raises(ValueError, match=r"^stream: reads Hugging Face folders of safetensors weights"):
        lmclab.align({"w": torch.zeros(2)}, b, stream=True)
    with pytest.raises(TypeError, match=r"^stream: expected True, False or None \(by size\), got str$"):
        lmclab.align(a, b, stream="yes")
    other = saved(
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA | {"intermediate_size": 24})), tmp_path / "w"
    )
    shape = r"has shape \(24, 16\), LlamaForCausalLM's is \(32, 16\) \(models of other widths are aligned in memory"
    with pytest.raises(
        ValueError, match=rf"^model_b: {re.escape(str(other))}: tensor 'model.layers.0.mlp.gate_proj.weight' {shape}"
    ):
        lmclab.align(a, other, stream=True)
    with pytest.raises(
        ValueError,
        match=rf"^model_b: {re.escape(str(work / 'g'))} describes GPT2LMHeadModel, model_a LlamaForCausalLM$",
    ):
        lmclab.align(a, work / "g", stream=True)


def test_a_tensor_under_another_name_is_refused_in_one_line(work: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_text((work / "a" / "config.json").read_text())
    state = {k: v for f in sorted((work / "a").glob("*.safetensors")) for k, v in load_file(f).items()}
    state["model.norm.gamma"] = state.pop("model.norm.weight")  # an older name from_pretrained renames
    save_file(state, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    message = r"^model_b: .*: no tensor 'model.norm.weight', an entry of the LlamaForCausalLM it describes \(an older "
    message += r"naming\? read in memory with stream off: from_pretrained renames it\)$"
    with pytest.raises(ValueError, match=message):
        lmclab.align(work / "a", renamed, stream=True)


def test_the_merge_refuses_before_any_work_and_leaves_nothing_half_written(
    work: Path, tmp_path: Path, monkeypatch
) -> None:
    import lmclab.api.streamed as streamed

    res = lmclab.align(work / "a", work / "b", stream=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError, match=r"^out: .*full exists; expected a new folder or an empty one$"):
        lmclab.merge_folders(work / "a", work / "b", tmp_path / "full", res)
    with pytest.raises(FileNotFoundError, match=r"^out: the folder .*nowhere does not exist$"):
        lmclab.merge_folders(work / "a", work / "b", tmp_path / "nowhere" / "m", res)
    with pytest.raises(ValueError, match=r"lam"):
        lmclab.merge_folders(work / "a", work / "b", tmp_path / "m", res, lam=1.5)
    other = lmclab.align(work / "g", work / "gp", stream=True)
    with pytest.raises(ValueError, match=r"^alignment: found for another model than model_b: keys do not match"):
        lmclab.merge_folders(work / "a", work / "b", tmp_path / "m", other)
    calls, real = [], streamed.write_shards

    def failing(folder, sizes, produce, **keywords):
        def fifth(name):
            calls.append(name)
            if len(calls) == 5:  # two shards written by then
                raise RuntimeError("disk full")
            return produce(name)

        return real(folder, sizes, fifth, **keywords)

    monkeypatch.setattr(streamed, "write_shards", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        lmclab.merge_folders(work / "a", work / "b", tmp_path / "m", res, max_shard_bytes=3000)
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.*"))


def test_the_commands_stream_and_name_their_flag(work: Path, tmp_path: Path) -> None:
    out = command(tmp_path, "match", str(work / "a"), str(work / "p"), "--stream", "--out", "perm.pt", "--progress")
    assert "streamed (" in out.stdout and "L2 reduction 100.00 %" in out.stdout and "estimated: " in out.stderr
    merged = command(
        tmp_path, "merge", str(work / "a"), str(work / "p"), "--alignment", "perm.pt", "--out", "m", "--stream"
    )
    assert "streamed" in merged.stdout
    command(tmp_path, "merge", str(work / "a"), str(work / "p"), "--alignment", "perm.pt", "--out", "n", "--no-stream")
    loaded = [transformers.LlamaForCausalLM.from_pretrained(tmp_path / f).state_dict() for f in ("m", "n")]
    assert all(torch.equal(v, loaded[1][k]) for k, v in loaded[0].items())
    refused = command(tmp_path, "match", str(work / "a"), str(work / "p"), "--stream", "--method", "am", "--data",
                      "mnist5k", "--out", "q.pt", ok=False, shell=False)  # fmt: skip
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: --stream: --method 'am' is matched in memory; the streamed path matches weights (identity, wm)"
    )
    rotated = command(tmp_path, "match", str(work / "a"), str(work / "p"), "--symmetry", "orthogonal", "--stream",
                      "--out", "r.pt", shell=False)  # fmt: skip
    assert "orthogonal)" in rotated.stdout and "streamed (" in rotated.stdout


@pytest.fixture(scope="module")
def rotated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a``: a Llama with gains off 1 (float32); ``b``: its canonical form moved by a random element of every
    group the tracer proves (the stream orthogonal, heads rotary inside)."""
    from lmclab.core.canonical import fold_gains

    work = tmp_path_factory.mktemp("rotated")
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                p.uniform_(0.5, 1.5)
    spec = trace_spec(model, torch.randint(0, 300, (2, 8)), symmetry="orthogonal")
    state = fold_gains(spec, model.state_dict())
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    model.save_pretrained(work / "a", max_shard_size="8KB")
    twin.save_pretrained(work / "b", max_shard_size="8KB")
    return work


def test_orthogonal_maps_are_found_and_merged_streamed_as_in_memory(
    rotated: Path, tmp_path: Path, sliced: None
) -> None:
    """Both models folded as read: the planted element recovered (L2 reduction 100 %), the same maps as in memory,
    and the merge (in the canonical form) the in-memory one, loaded by from_pretrained."""
    a, b = rotated / "a", rotated / "b"
    streamed = lmclab.align(a, b, symmetry="orthogonal", stream=True)
    kept = lmclab.align(a, b, symmetry="orthogonal", stream=False)
    assert streamed.spec == kept.spec and streamed.spec.kinds and streamed.spec.gains
    assert all(torch.allclose(streamed.perm[g].double(), kept.perm[g].double(), atol=1e-5) for g in kept.perm)
    given = lmclab.align(a, b, symmetry="orthogonal", spec=kept.spec, stream=True, method="identity")
    assert given.spec == kept.spec  # a spec given is taken in the symmetry asked for: a rotary group refused below
    with pytest.raises(ValueError, match=r"^spec: group '.*' is rotary, which no permutation inside its heads keeps$"):
        lmclab.align(a, b, spec=kept.spec, stream=True)
    assert lmclab.l2_reduction(a, b, streamed, stream=True) == pytest.approx(100.0, abs=1e-3)
    lmclab.merge_folders(a, b, tmp_path / "m", streamed, lam=0.3)
    merged = lmclab.merge(a, b, streamed, lam=0.3)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "m").state_dict()
    assert all(torch.allclose(loaded[k], v, atol=1e-6) for k, v in merged.items())
    ids = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        expected = transformers.LlamaForCausalLM.from_pretrained(a).eval()(ids).logits
        found = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "m").eval()(ids).logits
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)  # a planted copy: the merge is θa's function


def test_a_tied_head_is_untied_by_an_orthogonal_merge(work: Path, tmp_path: Path) -> None:
    """GPT-2's head reads the final LayerNorm's gain: folded into the head alone, which the merge writes apart,
    the config untied; the function of θa kept (a planted copy)."""
    res = lmclab.align(work / "g", work / "gp", symmetry="orthogonal", stream=True)
    lmclab.merge_folders(work / "g", work / "gp", tmp_path / "m", res, lam=0.5)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in lmclab.api.folders.shard_files(tmp_path / "m")
    ids = torch.randint(0, 300, (2, 8))
    with torch.no_grad():
        expected = transformers.GPT2LMHeadModel.from_pretrained(work / "g").float().eval()(ids).logits
        found = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").float().eval()(ids).logits
    torch.testing.assert_close(found, expected, rtol=0.05, atol=0.05)  # bfloat16 folders
