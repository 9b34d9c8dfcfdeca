"""The refusals of a Hugging Face checkpoint folder (lmclab.api.hf), each reached from the readers a
researcher calls (``lmclab.merge`` on folders, the command's ``load_model_file``) and read in full, beside
the nearest folder that loads: a config that is no JSON or names no class of transformers, or that
transformers refuses; weights missing, corrupt, mis-shaped or incomplete, in one file or shards; and a
folder written by ``save_hf_folder`` onto one that is not empty. Tiny random GPT-2s, no download."""

from __future__ import annotations

import contextlib
import errno
import json
import locale
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmclab
from lmclab.api.files import load_model_file
from lmclab.api.hf import save_hf_folder

pytestmark = pytest.mark.extras  # the models extra: not in `make test-fast`
transformers = pytest.importorskip("transformers")

WEIGHTS = "model.safetensors, pytorch_model.bin, model.safetensors.index.json, pytorch_model.bin.index.json"


def _whole(message: str) -> str:
    """A pattern matching exactly ``message``."""
    return f"^{re.escape(message)}$"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 (head tied to the embedding, so written once) saved whole and in shards."""
    work = tmp_path_factory.mktemp("hf-refusals")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=12, n_positions=6, bos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(work / "a")
    model.save_pretrained(work / "shards", max_shard_size="1KB")
    return work


def _copy(saved: Path, tmp_path: Path, name: str = "a") -> Path:
    return Path(shutil.copytree(saved / name, tmp_path / name))


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def _same(folder: Path, saved: Path) -> bool:
    """Whether ``folder`` reads as the saved model."""
    read, reference = load_model_file(folder).params, load_model_file(saved / "a").params
    return read.keys() == reference.keys() and all(torch.equal(read[k], v) for k, v in reference.items())


@pytest.mark.parametrize(
    "text,reason",
    [
        (b"{not json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"", "Expecting value: line 1 column 1 (char 0)"),
        (b'\xff{"n_embd": 8}', "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ],
    ids=["broken", "empty", "not-utf8"],
)
def test_a_config_that_is_no_json_is_refused(saved, tmp_path, text: bytes, reason: str) -> None:
    folder = _copy(saved, tmp_path)
    (folder / "config.json").write_bytes(text)
    with pytest.raises(ValueError, match=_whole(f"{folder / 'config.json'}: not valid JSON ({reason})")):
        lmclab.merge(folder, saved / "a", lam=0.3)
    assert _same(_copy(saved, tmp_path / "fresh"), saved)


def test_a_config_naming_no_class_of_transformers_is_refused(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    _edit_config(folder, architectures=["GPT2LMHeadModel2"])
    expected = f"{folder / 'config.json'}: architecture 'GPT2LMHeadModel2' is not a class of transformers"
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.merge(folder, saved / "a", lam=0.3)
    _edit_config(folder, architectures=[])  # none named: AutoModel, the model without its head
    loaded = load_model_file(folder)
    assert type(loaded.model) is transformers.GPT2Model and "wte.weight" in loaded.params


def test_a_config_transformers_refuses_is_one_line_naming_the_folder(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    _edit_config(folder, n_head=3)  # 8 features in 3 heads
    pattern = (
        rf"^{re.escape(f'{folder}: transformers cannot load it (')}.*embed_dim.* must be divisible by num_heads.*\)$"
    )
    with pytest.raises(ValueError, match=pattern):
        load_model_file(folder)
    _edit_config(folder, n_head=4)  # the same tensors in 4 heads
    assert _same(folder, saved)


@pytest.mark.parametrize(("message", "reason"), [("z" * 300, "z" * 200), ("one\n  two   three", "one two three")])
def test_what_transformers_says_is_one_line_of_at_most_200_characters(saved, monkeypatch, message, reason) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", refuse)
    with pytest.raises(ValueError, match=_whole(f"{saved / 'a'}: transformers cannot load it ({reason})")):
        load_model_file(saved / "a")


def test_a_folder_with_config_json_alone_is_refused(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError, match=_whole(f"{folder}: no weights beside config.json (expected one of {WEIGHTS})")
    ):
        lmclab.merge(saved / "a", folder, lam=0.3)
    shutil.move(folder / "config.json", tmp_path / "config.json")  # and without config.json: no Hugging Face folder
    (folder / "model.safetensors").write_bytes((saved / "a" / "model.safetensors").read_bytes())
    expected = f"{folder}: a folder without config.json (not a Hugging Face checkpoint folder)"
    with pytest.raises(FileNotFoundError, match=_whole(expected)):
        load_model_file(folder)
    shutil.move(tmp_path / "config.json", folder / "config.json")
    assert _same(folder, saved)


@pytest.mark.parametrize("layout", ["a", "shards"])
def test_a_corrupt_safetensors_file_of_a_folder_is_refused(saved, tmp_path, layout: str) -> None:
    folder = _copy(saved, tmp_path, layout)
    bad = folder / "model.safetensors" if layout == "a" else sorted(folder.glob("*.safetensors"))[-1]
    bad.write_bytes(bad.read_bytes()[:-7])  # the data cut short, the header whole
    reason = "Error while deserializing header: incomplete metadata, file not fully covered"
    with pytest.raises(
        ValueError, match=_whole(f"{bad}: not a readable safetensors file (truncated or corrupted? {reason})")
    ):
        lmclab.merge(folder, saved / "a", lam=0.3)
    assert _same(saved / layout, saved)


def test_an_unreadable_safetensors_file_of_a_folder_without_a_message_is_worded_by_its_exceptions_type(
    saved, tmp_path, monkeypatch
) -> None:
    import safetensors

    folder = _copy(saved, tmp_path)

    def unreadable(*args, **kwargs):
        raise OSError()  # a failed read that says nothing (as some network file systems do)

    monkeypatch.setattr(safetensors, "safe_open", unreadable)
    expected = f"{folder / 'model.safetensors'}: not a readable safetensors file (truncated or corrupted? OSError)"
    with pytest.raises(ValueError, match=_whole(expected)):
        load_model_file(folder)


def test_a_corrupt_pytorch_model_bin_of_a_folder_is_refused(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    (folder / "model.safetensors").unlink()
    bin_file = folder / "pytorch_model.bin"
    torch.save(load_file(saved / "a" / "model.safetensors"), bin_file)
    assert _same(folder, saved)
    bin_file.write_bytes(bin_file.read_bytes()[:100])  # the zip archive cut before its central directory
    reason = "PytorchStreamReader failed reading zip archive: failed finding central directory. This is an internal "
    reason += "miniz error. If yo"  # the first 120 characters
    expected = f"{bin_file}: not a readable PyTorch file (truncated or corrupted? {reason})"
    with pytest.raises(ValueError, match=_whole(expected)):
        load_model_file(folder)


def test_a_shard_the_index_names_but_the_folder_lacks_is_refused(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path, "shards")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and _same(folder, saved)
    (folder / shards[1]).unlink()
    with pytest.raises(
        FileNotFoundError, match=_whole(f"{folder / shards[1]}: file not found (named by the folder's index)")
    ):
        lmclab.merge(saved / "a", folder, lam=0.3)


@pytest.mark.parametrize(
    "index,reason",
    [
        ('{"metadata": {}}', "'weight_map'"),
        ('{"weight_map": ', "Expecting value: line 1 column 16 (char 15)"),
        ('{"weight_map": ["model-00001.safetensors"]}', "'list' object has no attribute 'values'"),
        ('["model-00001.safetensors"]', "list indices must be integers or slices, not str"),
        (b"\xfe{}", "'utf-8' codec can't decode byte 0xfe in position 0: invalid start byte"),
    ],
    ids=["no-weight-map", "cut", "map-a-list", "index-a-list", "not-utf8"],
)
def test_an_index_without_a_weight_map_is_refused(saved, tmp_path, index: str | bytes, reason: str) -> None:
    folder = _copy(saved, tmp_path, "shards")
    path = folder / "model.safetensors.index.json"
    path.write_bytes(index if isinstance(index, bytes) else index.encode())
    with pytest.raises(ValueError, match=_whole(f"{path}: not a weight index with a 'weight_map' ({reason})")):
        load_model_file(folder)


@contextlib.contextmanager
def _ascii_locale():
    """The process's text encoding is ASCII (the C locale) for a while, as on a machine set up without UTF-8."""
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)


def test_an_index_is_read_as_utf8_whatever_the_locales_encoding(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path, "shards")
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text(encoding="utf-8"))
    index["metadata"]["note"] = "modèle réduit"  # not ASCII: UTF-8, as transformers writes its indexes
    path.write_text(json.dumps(index, ensure_ascii=False), encoding="utf-8")
    with _ascii_locale():
        assert _same(folder, saved)


def test_a_tensor_of_another_shape_than_the_config_gives_is_refused(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    _edit_config(folder, vocab_size=13)  # the saved embedding has 12 rows
    expected = f"{folder}: tensor 'transformer.wte.weight' has shape (12, 8), GPT2LMHeadModel's is (13, 8)"
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.merge(folder, saved / "a", lam=0.3)
    _edit_config(folder, vocab_size=12)
    assert _same(folder, saved)


def test_a_tensor_the_folder_lacks_is_refused_unless_the_model_ties_it(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path)
    state = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in state and _same(folder, saved)  # the tied head, filled in from the embedding
    del state["transformer.h.0.ln_2.bias"]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    expected = f"{folder}: no weights for ['transformer.h.0.ln_2.bias'] of the GPT2LMHeadModel it describes"
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.merge(saved / "a", folder, lam=0.3)


def test_an_encoder_decoder_without_a_decoder_start_token_is_refused_when_its_inputs_are_to_be_built() -> None:
    shapes = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 1, "num_heads": 4}
    bare = transformers.T5ForConditionalGeneration(transformers.T5Config(**shapes)).eval()
    expected = (
        "T5ForConditionalGeneration: an encoder–decoder reads decoder_input_ids besides input_ids, and its config "
        "sets no decoder_start_token_id to build them from (set it in config.json)"
    )
    with pytest.raises(ValueError, match=_whole(expected)):
        lmclab.find_permutation(bare, bare)


def test_writing_onto_a_folder_that_is_not_empty_fails_and_leaves_nothing(saved, tmp_path) -> None:
    model = transformers.GPT2LMHeadModel.from_pretrained(saved / "a")
    own = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: v + 1 for k, v in own.items()}
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OSError, match=_whole(f"[Errno {errno.ENOTEMPTY}] Directory not empty: '{out}'")):
        save_hf_folder(model, state, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()  # empty: written in its place
    save_hf_folder(model, state, out)
    written = transformers.GPT2LMHeadModel.from_pretrained(out).state_dict()
    assert all(torch.equal(written[k], v) for k, v in state.items())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in own.items())  # the caller's model untouched


def test_a_folder_is_written_beside_its_place_then_renamed_into_it_not_in_the_system_temporary_folder(
    saved, tmp_path, monkeypatch
) -> None:
    """The rename that puts the written folder in place stays on one file system: the system's temporary
    folder (here one that does not exist) is not used."""
    import tempfile

    model, move, moved = transformers.GPT2LMHeadModel.from_pretrained(saved / "a"), os.replace, []

    def recorded(src, dst) -> None:
        moved.append((Path(src), Path(dst)))
        move(src, dst)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    monkeypatch.setattr(os, "replace", recorded)
    save_hf_folder(model, model.state_dict(), tmp_path / "out")
    [(src, dst)] = moved
    assert src.parent == tmp_path and src.name.startswith(".out.") and dst == tmp_path / "out"
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and _same(tmp_path / "out", saved)


def test_an_interrupt_once_the_written_folder_is_in_place_reaches_the_caller_as_it_is(saved, tmp_path, monkeypatch):
    model, move = transformers.GPT2LMHeadModel.from_pretrained(saved / "a"), os.replace

    def move_then_interrupt(src, dst) -> None:  # Ctrl-C right after the rename: nothing left to clean
        move(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", move_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_hf_folder(model, model.state_dict(), tmp_path / "out")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and _same(tmp_path / "out", saved)
