"""``lmclab match --symmetry orthogonal`` on Hugging Face Llama folders: B is A in canonical form (RMSNorm gains
folded into the layers that read them) with its residual stream rotated by a random orthogonal map and its MLP
units and heads permuted, saved by ``save_pretrained``; the match brings it back exactly and ``lmclab merge``
writes a folder ``from_pretrained`` loads that computes A's function, while permutations alone cannot;
``lmclab trace --symmetry orthogonal`` lists the kinds and the gains. Folders whose head is tied to the
embeddings are matched in their untied form, and merged into a folder whose head is tied only where the merged
values are equal."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lmclab as lmclab_api
from lmclab.core.canonical import fold_gains
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")
from test_cli import lmclab  # noqa: E402  (tests/cli is on the import path)

LLAMA = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
LLAMA |= {"intermediate_size": 64, "vocab_size": 50, "max_position_embeddings": 16, "tie_word_embeddings": False}
X = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))


# grouped queries and as many key/value heads as query heads: the stream orthogonal, inside each (key/value) head Q/K
# turned per rotary plane and V/O rotated, with grouped queries on every query head of a key/value head alike
KV_HEADS = {"grouped": (2, 5), "rotary-heads": (4, 5)}


@pytest.fixture(scope="module", params=list(KV_HEADS))
def work(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("rotated")
    torch.manual_seed(0)
    config = LLAMA | {"num_key_value_heads": KV_HEADS[request.param][0]}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "norm" in key:
                p.uniform_(0.5, 1.5)
    spec = trace_spec(model, X, symmetry="orthogonal")
    folded = fold_gains(spec, model.state_dict())
    perm = random_permutation(spec.group_sizes(folded), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, folded))
    model.save_pretrained(work / "a")
    twin.save_pretrained(work / "b")
    (work / "kinds").write_text(str(KV_HEADS[request.param][1]))
    return work


def _logits(folder: Path) -> torch.Tensor:
    with torch.no_grad():
        return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()(X).logits


def test_match_undoes_a_rotated_stream_and_merge_writes_a_folder_of_a_s_function(work: Path) -> None:
    out = lmclab(work, "match", "a", "b", "--symmetry", "orthogonal", "--out", "rot.pt", shell=False).stdout
    assert f"({(work / 'kinds').read_text()} orthogonal)" in out and "L2 reduction 100.00 %" in out
    lmclab(work, "merge", "a", "b", "--alignment", "rot.pt", "--lam", "0.3", "--out", "merged", shell=False)
    reference = _logits(work / "a")
    torch.testing.assert_close(_logits(work / "merged"), reference, rtol=1e-4, atol=1e-4)
    out = lmclab(work, "match", "a", "b", "--out", "perm.pt", shell=False).stdout  # permutations only
    assert "L2 reduction 100.00 %" not in out
    lmclab(work, "merge", "a", "b", "--alignment", "perm.pt", "--lam", "0.3", "--out", "permuted", shell=False)
    assert (_logits(work / "permuted") - reference).abs().max() > 1e-2


def test_merge_many_merges_a_rotated_copy_back_into_a_folder_of_a_s_function(work: Path) -> None:
    out = lmclab(work, "merge-many", "a", "b", "--symmetry", "orthogonal", "--out", "many", shell=False).stdout
    assert out.startswith(f"merge_many: 2 models ({(work / 'kinds').read_text()} orthogonal), ")
    torch.testing.assert_close(_logits(work / "many"), _logits(work / "a"), rtol=1e-4, atol=1e-4)
    args = ("merge-many", "a", "b", "--method", "zipit", "--symmetry", "orthogonal", "--out", "x")
    refused = lmclab(work, *args, ok=False, shell=False)
    expected = (
        "--method: 'zipit' seeks permutations only; --symmetry orthogonal by ('merge_many', 'star', 'sync', 'c2m3')"
    )
    assert refused.stderr == f"error: {expected}\n"
    assert not (work / "x").exists()


def test_trace_lists_the_kinds_and_the_gains(work: Path, tmp_path: Path) -> None:
    (tmp_path / "llama_factory.py").write_text(
        "import transformers\n"
        f"def build(**kw):\n    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**({LLAMA!r} | kw)))\n"
    )
    out = lmclab(
        tmp_path, "trace", "llama_factory:build", "--input-shape", "8", "--symmetry", "orthogonal", shell=False
    ).stdout
    query = "model.layers.0.self_attn.q_proj.weight[0] (2 copies), model.layers.0.self_attn.k_proj.weight[0]"
    assert f"P_1 (16 units, rotary; 2 heads, head order P_heads_0): {query}" in out  # grouped queries: 2 per key head
    assert "model.layers.0.self_attn.v_proj.weight[0], model.layers.0.self_attn.o_proj.weight[1] (2 copies)" in out
    assert "kind: P_3 stays a permutation group: node 'silu': an operation that does not commute with rotations" in out
    assert "gain: model.norm.weight folded into lm_head.weight" in out
    args = ("trace", "llama_factory:build", "--input-shape", "8", "--symmetry", "orthogonal")
    out = lmclab(tmp_path, *args, "--kwargs", '{"num_key_value_heads": 4}', shell=False).stdout  # no grouped queries
    assert "P_1 (32 units, rotary; 4 heads, head order P_heads_0): model.layers.0.self_attn.q_proj.weight[0]" in out
    assert "kind: P_1 is rotary: node 'mul_5': rotary positions turn each plane (j, j + d/2) by its own angle" in out


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tied Llama folders: ``a`` with random gains but the final norm's (ones: its canonical head is still the
    embedding), ``b`` its canonical form rotated and permuted (tied too), ``c`` another with every gain random."""
    work, config = tmp_path_factory.mktemp("tied"), transformers.LlamaConfig(**(LLAMA | {"tie_word_embeddings": True}))
    torch.manual_seed(0)
    model, other = (transformers.LlamaForCausalLM(config).eval() for _ in range(2))
    with torch.no_grad():
        for (key, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
            if "norm" in key:
                q.uniform_(0.5, 1.5)
                p.uniform_(0.5, 1.5) if key != "model.norm.weight" else None
    canonical = lmclab_api.canonicalize(model, X)
    spec = trace_spec(canonical, X, symmetry="orthogonal")
    state = canonical.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads, spec.kinds)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))  # the head's values equal the embedding's
    for name, m in (("a", model), ("b", twin), ("c", other)):
        m.save_pretrained(work / name)
    return work


def test_match_aligns_tied_folders_untied_and_merge_writes_the_head_as_its_values_say(tied: Path) -> None:
    out = lmclab(tied, "match", "a", "b", "--symmetry", "orthogonal", "--out", "rot.pt", shell=False).stdout
    assert "(5 orthogonal); model.embed_tokens.weight and lm_head.weight matched untied, " in out
    assert "L2 reduction 100.00 %" in out
    lmclab(tied, "merge", "a", "b", "--alignment", "rot.pt", "--lam", "0.3", "--out", "merged", shell=False)
    torch.testing.assert_close(_logits(tied / "merged"), _logits(tied / "a"), rtol=1e-4, atol=1e-4)
    assert json.loads((tied / "merged" / "config.json").read_text())["tie_word_embeddings"]  # equal: tied still
    lmclab(tied, "match", "a", "c", "--symmetry", "orthogonal", "--out", "rot_c.pt", shell=False)
    lmclab(tied, "merge", "a", "c", "--alignment", "rot_c.pt", "--out", "merged_c", shell=False)
    assert not json.loads((tied / "merged_c" / "config.json").read_text())["tie_word_embeddings"]
    written = load_file(tied / "merged_c" / "model.safetensors")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tied / "merged_c").state_dict()
    assert not torch.equal(written["lm_head.weight"], written["model.embed_tokens.weight"])
    assert all(torch.equal(loaded[k], v) for k, v in written.items())  # the head kept, not the embedding twice


def test_match_refuses_a_method_without_orthogonal_steps_on_a_tied_folder(tied: Path) -> None:
    args = ("match", "a", "c", "--symmetry", "orthogonal", "--method", "wm_sinkhorn", "--out", "r.pt")
    err = lmclab(tied, *args, ok=False, shell=False).stderr
    assert (
        err == "error: --method: 'wm_sinkhorn' seeks permutations only; "
        "--symmetry orthogonal by ('identity', 'wm', 'am', 'ste', 'ste_sinkhorn')\n"
    )
    assert not (tied / "r.pt").exists()
