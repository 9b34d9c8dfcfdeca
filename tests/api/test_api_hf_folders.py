"""Hugging Face checkpoint folders given to the API by path (lmclab.api.inputs): the module their config builds,
its state dict, and inputs to trace it on, with no other argument."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

import lmclab
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace_spec

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a``: a small GPT-2; ``b``: every group of it randomly permuted."""
    work = tmp_path_factory.mktemp("hf-api")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=30, n_positions=8, bos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    spec, state = trace_spec(model, torch.randint(0, 30, (2, 8))), model.state_dict()
    perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(4), spec.heads)
    twin = copy.deepcopy(model)
    twin.load_state_dict(apply_permutation(spec, perm, state))
    model.save_pretrained(work / "a")
    twin.save_pretrained(work / "b")
    return work


def test_find_permutation_and_merge_read_folders_by_path(folders: Path) -> None:
    a, b = folders / "a", str(folders / "b")  # a Path and a str
    found = lmclab.find_permutation(a, b)
    assert lmclab.l2_reduction(a, b, found) == pytest.approx(100.0)
    merged = lmclab.merge(a, b, found, lam=0.3)
    reference = transformers.GPT2LMHeadModel.from_pretrained(a).state_dict()
    assert all(torch.allclose(merged[k], v, atol=1e-6) for k, v in reference.items())


@pytest.mark.parametrize("which", ["model_a", "model_b"])
def test_a_path_that_is_no_folder_is_one_line_naming_the_argument(folders: Path, which: str) -> None:
    args = {"model_a": folders / "a", "model_b": folders / "b"} | {which: folders / "missing"}
    expected = f"{which}: {folders / 'missing'}: no such file or folder"
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(expected)}$"):
        lmclab.find_permutation(args["model_a"], args["model_b"])


def test_a_language_model_curve_reads_logits_per_token(folders: Path) -> None:
    """Next-token pairs (ids[:, :-1], ids[:, 1:]): the loss at λ = 1 is the model's own mean token
    cross-entropy, and the aligned planted pair has no barrier."""
    a = transformers.GPT2LMHeadModel.from_pretrained(folders / "a").eval()
    ids = torch.randint(0, 30, (6, 8), generator=torch.Generator().manual_seed(0))
    data = [(ids[:3, :-1], ids[:3, 1:]), (ids[3:, :-1], ids[3:, 1:])]
    found = lmclab.find_permutation(a, folders / "b")
    pi_b = found.apply(transformers.GPT2LMHeadModel.from_pretrained(folders / "b").state_dict())
    curve = lmclab.curve(a, pi_b, eval_data=data, num_lambdas=5)
    with torch.no_grad():
        own = torch.nn.functional.cross_entropy(a(ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten())
    end = next(r for r in curve.rows if r["lam"] == 1.0)
    assert end["loss"] == pytest.approx(float(own), rel=1e-5) and 0.0 <= end["acc"] <= 1.0
    assert abs(curve.barrier()) < 1e-5


def test_reading_and_writing_a_folder_restores_the_callers_transformers_verbosity(folders: Path, tmp_path) -> None:
    """lmclab silences transformers while it reads or writes a folder, then gives back the caller's level
    and progress bars (saved before it silenced them)."""
    from lmclab.api.hf import load_hf_folder, save_hf_folder

    logging = transformers.utils.logging
    before = logging.get_verbosity(), logging.is_progress_bar_enabled()
    try:
        for level, bars in ((logging.INFO, True), (logging.DEBUG, False)):
            logging.set_verbosity(level)
            (logging.enable_progress_bar if bars else logging.disable_progress_bar)()
            state, model = load_hf_folder(folders / "a")
            assert (logging.get_verbosity(), logging.is_progress_bar_enabled()) == (level, bars)
            save_hf_folder(model, state, tmp_path / f"out{level}")
            assert (logging.get_verbosity(), logging.is_progress_bar_enabled()) == (level, bars)
    finally:
        logging.set_verbosity(before[0])
        (logging.enable_progress_bar if before[1] else logging.disable_progress_bar)()


def test_a_folder_is_read_into_memory_once_and_a_tied_weight_s_second_name_is_its_own_tensor(folders: Path) -> None:
    """The state dict holds the module's own tensors (no second copy of the folder in memory); GPT-2's head, tied
    to the token embedding, is a copy of it under its own name."""
    from lmclab.api.hf import load_hf_folder

    state, model = load_hf_folder(folders / "a")
    own = {k: p.data_ptr() for k, p in model.state_dict().items()}
    shared = [k for k, v in state.items() if v.data_ptr() == own[k]]
    assert set(state) - set(shared) == {"lm_head.weight"}
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    assert state["lm_head.weight"].data_ptr() != state["transformer.wte.weight"].data_ptr()


def test_a_tensor_tied_to_three_others_is_written_untied_when_one_of_them_differs(tmp_path) -> None:
    """T5 ties its shared embeddings, both stacks' embeddings and the head: a state whose head alone differs
    (a merge of untied copies) is written untied, every name keeping its own value; read back the same."""
    from lmclab.api.hf import load_hf_folder, save_hf_folder

    config = transformers.T5Config(
        vocab_size=20, d_model=8, d_kv=4, d_ff=12, num_layers=1, num_heads=2, decoder_start_token_id=0
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1  # the shared weight, then the three names it ties
    save_hf_folder(model, state, tmp_path / "out")
    back, _ = load_hf_folder(tmp_path / "out")
    assert all(torch.equal(back[k], v) for k, v in state.items())
