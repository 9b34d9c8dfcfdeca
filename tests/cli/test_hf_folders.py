"""Hugging Face checkpoint folders (lmclab.api.hf) through the command: ``lmclab match`` on two folders written by
``save_pretrained`` (GPT-2 with its head tied to the embedding; a Llama with grouped-query attention), each
B a planted permutation of A; ``lmclab merge`` writing a folder ``from_pretrained`` loads; the weight
layouts transformers writes (one safetensors file, ``pytorch_model.bin``, shards with an index); and every
bad folder refused in one line before any work."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from lmclab.api.files import load_model_file
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
from test_cli import lmclab  # noqa: E402  (tests/cli is on the import path)

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50, "n_positions": 16, "bos_token_id": 0}
LLAMA = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
LLAMA |= {"intermediate_size": 64, "vocab_size": 50, "max_position_embeddings": 16}
SMALL = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 50}


def planted_pair(model: torch.nn.Module, a: Path, b: Path, seed: int) -> None:
    """``model`` saved to ``a`` and a random permutation of every group of it to ``b``."""
    model.eval()
    x = torch.randn(2, 3, 16, 16) if model.main_input_name == "pixel_values" else torch.randint(0, 50, (2, 8))
    spec, state = trace_spec(model, x), model.state_dict()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("bias"):
                p.normal_(0, 0.1)
    state = model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(seed), spec.heads)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    model.save_pretrained(a)
    twin.save_pretrained(b)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    planted_pair(
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2, eos_token_id=0)), work / "a", work / "b", 1
    )
    planted_pair(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)), work / "la", work / "lb", 2)
    bert = transformers.BertConfig(**SMALL, hidden_size=32, max_position_embeddings=16)
    planted_pair(transformers.BertForMaskedLM(bert), work / "ba", work / "bb", 3)
    vit = transformers.ViTConfig(**SMALL, hidden_size=32, image_size=16, patch_size=4, num_labels=5)
    planted_pair(transformers.ViTForImageClassification(vit), work / "va", work / "vb", 4)
    return work


def states(folder: Path) -> dict[str, torch.Tensor]:
    return transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()


def test_match_finds_the_planted_permutation_of_gpt2_and_merge_writes_a_folder(work: Path) -> None:
    out = lmclab(work, "match", "a", "b", "--out", "p.pt").stdout
    assert "L2 reduction 100.00 %" in out
    lmclab(work, "merge", "a", "b", "--alignment", "p.pt", "--lam", "0.3", "--out", "merged", shell=False)
    a, merged = states(work / "a"), states(work / "merged")
    assert merged.keys() == a.keys() and all(torch.allclose(merged[k], v, atol=1e-6) for k, v in a.items())
    lmclab(work, "merge", "a", "b", "--lam", "0.3", "--out", "naive", shell=False)  # no permutation: 0.3·θa + 0.7·θb
    b, naive = states(work / "b"), states(work / "naive")
    assert all(torch.allclose(naive[k], 0.3 * v + 0.7 * b[k], atol=1e-6) for k, v in a.items())


@pytest.mark.parametrize("pair", ["l", "b", "v"], ids=["llama-gqa", "bert", "vit"])
def test_match_recovers_a_planted_permutation_from_folders(work: Path, pair: str) -> None:
    assert (
        "L2 reduction 100.00 %"
        in lmclab(work, "match", f"{pair}a", f"{pair}b", "--out", f"{pair}p.pt", shell=False).stdout
    )


@pytest.mark.parametrize("layout", ["bin", "shards"])
def test_every_weight_layout_reads_the_same_tensors(work: Path, layout: str) -> None:
    model = transformers.GPT2LMHeadModel.from_pretrained(work / "a")
    folder = work / f"a-{layout}"
    if layout == "shards" and not folder.exists():
        model.save_pretrained(folder, max_shard_size="20KB")
    elif not folder.exists():  # transformers 5 writes safetensors only; older ones, and other tools, this
        folder.mkdir()
        (folder / "config.json").write_text((work / "a" / "config.json").read_text())
        torch.save({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, folder / "pytorch_model.bin")
    expected = {"bin": "pytorch_model.bin", "shards": "model.safetensors.index.json"}[layout]
    assert (folder / expected).is_file()
    loaded, reference = load_model_file(folder).params, load_model_file(work / "a").params
    assert loaded.keys() == reference.keys() and all(torch.equal(loaded[k], v) for k, v in reference.items())
    assert torch.equal(loaded["lm_head.weight"], loaded["transformer.wte.weight"])  # tied: written once


def broken(work: Path, name: str) -> Path:
    """A copy of folder ``a`` with one thing wrong."""
    folder = work / f"broken-{name}"
    if folder.exists():
        return folder
    folder.mkdir()
    for f in (work / "a").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    if name == "no-config":
        (folder / "config.json").unlink()
    elif name == "bad-json":
        (folder / "config.json").write_text("{not json")
    elif name == "unknown-class":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchModel"]}))
    elif name == "no-weights":
        (folder / "model.safetensors").unlink()
    elif name == "truncated":
        blob = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    elif name == "other-width":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"n_inner": 64}))
    return folder


@pytest.mark.parametrize(
    "name,message",
    [
        ("no-config", "{folder}: a folder without config.json (not a Hugging Face checkpoint folder)"),
        (
            "bad-json",
            "{folder}/config.json: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
            "(char 1))",
        ),
        ("unknown-class", "{folder}/config.json: architecture 'NoSuchModel' is not a class of transformers"),
        (
            "no-weights",
            "{folder}: no weights beside config.json (expected one of model.safetensors, pytorch_model.bin, "
            "model.safetensors.index.json, pytorch_model.bin.index.json)",
        ),
        (
            "truncated",
            "{folder}/model.safetensors: not a readable safetensors file (truncated or corrupted? Error while "
            "deserializing header: incomplete metadata, file not fully covered)",
        ),
        (
            "other-width",
            "{folder}: tensor 'transformer.h.0.mlp.c_fc.bias' has shape (128,), GPT2LMHeadModel's is (64,)",
        ),
    ],
)
def test_a_bad_folder_is_one_line(work: Path, name: str, message: str) -> None:
    folder = broken(work, name)
    proc = lmclab(work, "match", str(folder), "b", "--out", "x.pt", ok=False, shell=False)
    assert proc.stderr == f"error: {message.format(folder=folder)}\n", proc.stderr
    assert not (work / "x.pt").exists()


def test_merge_refuses_an_existing_output_folder_before_any_work(work: Path) -> None:
    (work / "full").mkdir(exist_ok=True)
    (work / "full" / "keep.txt").write_text("mine")
    proc = lmclab(work, "merge", "a", "b", "--out", "full", ok=False, shell=False)
    assert (
        proc.stderr == "error: --out: full exists; expected a new or empty folder for the merged Hugging Face model\n"
    )
    assert [p.name for p in (work / "full").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(("a", "b", "dtype"), [("a", "b", "float16"), ("a", "b", "bfloat16")])
def test_match_takes_folders_in_two_precisions_in_both_orders(work: Path, a: str, b: str, dtype: str) -> None:
    """One folder saved in float32, the other in half precision (either one): the permutation found is the
    float32 pair's, and the merge is a folder in θa's dtype."""
    for name in (a, b):
        if not (work / f"{name}-{dtype}").exists():
            model = transformers.GPT2LMHeadModel.from_pretrained(work / name)
            model.to(getattr(torch, dtype)).save_pretrained(work / f"{name}-{dtype}")
    lmclab(work, "match", a, b, "--out", "p32.pt", shell=False)
    reference = torch.load(work / "p32.pt")["perm"]
    for pair in ((a, f"{b}-{dtype}"), (f"{a}-{dtype}", b)):
        lmclab(work, "match", *pair, "--out", "ph.pt", shell=False)
        assert all(torch.equal(p, reference[g]) for g, p in torch.load(work / "ph.pt")["perm"].items()), pair
    out = f"merged-{dtype}"
    lmclab(work, "merge", f"{a}-{dtype}", b, "--alignment", "p32.pt", "--out", out, shell=False)
    merged = transformers.GPT2LMHeadModel.from_pretrained(work / out, dtype="auto")
    assert next(merged.parameters()).dtype == getattr(torch, dtype)


def test_barrier_refuses_data_the_model_does_not_read(work: Path) -> None:
    """A language model given images, an image model given token ids, token ids past the vocabulary: one line
    naming --data and what the model reads, before any work."""
    from test_cli_refusals import _tokens

    from lmclab.core.data import prepare

    if not (work / "digits").exists():
        prepare("mnist5k", work / "raw", work / "digits", max_train=20, max_test=10)
    _tokens(work / "tokens", high=50)
    _tokens(work / "bytes", high=256)
    for args, message in [
        (
            ["a", "b", "--data", "digits"],
            "--data digits: holds images of shape (1, 28, 28); the model (GPT2LMHeadModel) reads token ids",
        ),
        (
            ["va", "vb", "--data", "tokens"],
            "--data tokens: holds token ids of shape (8,); the model (ViTForImageClassification) reads images",
        ),
        (
            ["a", "b", "--data", "bytes"],
            "--data bytes: token ids up to 255; the model's embedding has 50 entries (a text prepared with another "
            "tokenizer?)",
        ),
    ]:
        err = lmclab(work, "barrier", *args, "--json", "never.json", ok=False, shell=False).stderr
        assert err == f"error: {message}\n", err
        assert not (work / "never.json").exists()
    assert (
        "test loss" in lmclab(work, "barrier", "a", "b", "--data", "tokens", "--num-lambdas", "3", shell=False).stdout
    )


@pytest.mark.parametrize("start", [0, None], ids=["decoder-start", "no-decoder-start"])
def test_an_encoder_decoder_folder_is_traced_on_its_decoder_inputs_or_refused_naming_them(tmp_path, start) -> None:
    """T5's decoder reads its own ids: the command builds them from ``decoder_start_token_id`` (the tracer then
    refuses a node of T5's graph, or traces it), or says that they are missing — never blames torch.fx."""
    config = transformers.T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)
    if start is not None:
        config.decoder_start_token_id = start
    for name in ("ta", "tb"):
        transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / name)
    from test_cli import _in_process

    proc = _in_process(tmp_path, ("match", "ta", "tb", "--method", "wm", "--out", "p.pt"))
    error = proc.stderr.strip()
    if start is None:
        assert error == (
            "error: T5ForConditionalGeneration: an encoder–decoder reads decoder_input_ids besides input_ids, and its "
            "config sets no decoder_start_token_id to build them from (set it in config.json)"
        )
    else:
        assert proc.returncode == 0 or error.startswith("error: trace_spec: node "), error


def test_folders_of_other_mlp_widths_are_matched_and_merged_into_the_wider_architecture(tmp_path: Path) -> None:
    """GPT-2 with 64 MLP units per block beside one with 40 (the stream and heads equal: LayerNorm and the heads'
    scale fix their widths): the narrower is embedded in the wider one's widths, and the merge at λ = 0 is a
    folder of the wider architecture that computes the narrower model's logits."""
    x = torch.randint(0, 50, (2, 8))
    for name, inner, seed in (("a", 64, 0), ("b", 40, 1)):
        torch.manual_seed(seed)
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2, n_inner=inner)).save_pretrained(tmp_path / name)
    out = lmclab(tmp_path, "match", "a", "b", "--out", "perm.pt", shell=False).stdout
    assert "B narrower in 2 groups, embedded in A's widths" in out
    lmclab(tmp_path, "merge", "a", "b", "--alignment", "perm.pt", "--lam", "0", "--out", "m", shell=False)
    merged = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m").eval()
    narrow = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "b").eval()
    assert merged.config.n_inner == 64
    with torch.no_grad():
        assert torch.allclose(merged(x).logits, narrow(x).logits, atol=1e-5)
    refused = lmclab(tmp_path, "merge", "a", "b", "--out", "naive", ok=False, shell=False)
    assert "b: other widths than a: merge it through an alignment (lmclab match)" in refused.stderr + refused.stdout
    wider = lmclab(tmp_path, "match", "b", "a", "--out", "p2.pt", ok=False, shell=False)
    assert "more than the reference model's 40" in wider.stderr + wider.stdout
