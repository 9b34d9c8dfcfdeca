"""A researcher's corpus (``data.name: text``, lmclab.core.corpus): folders of text files, split or not, saved
Hugging Face datasets of every layout, a tokenizer from a local folder, and every refusal in one line."""

from __future__ import annotations

import builtins
from pathlib import Path

import numpy as np
import pytest
import torch

from lmclab.core import corpus, text
from lmclab.core.data import load_split, prepare
from lmclab.core.options import OptionError

pytestmark = pytest.mark.extras  # the text and models extras: not in `make test-fast`
datasets = pytest.importorskip("datasets")
pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

WORDS = "the model merges two networks after aligning their hidden units by permutation".split()  # noqa: SIM905


def document(i: int, words: int = 60) -> str:
    rng = np.random.default_rng(i)
    return " ".join(rng.choice(WORDS, words)) + f" end {i}."


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content, encoding="utf-8")
    return folder


def test_a_folder_of_text_files_is_one_document_per_file_named_by_its_path(tmp_path) -> None:
    files = {f"part{i % 2}/doc{i}.txt": document(i) for i in range(6)} | {"notes.md": "# notes", "a.rst": "rst"}
    write(tmp_path, files | {"skip.json": "{}", ".hidden/x.txt": "no", "part0/.y.txt": "no"})
    assert corpus.source_kind(tmp_path) == "files"
    assert corpus.read_corpus(tmp_path) == {"all": files}


def test_train_and_test_folders_are_the_split(tmp_path) -> None:
    write(tmp_path, {"train/a.txt": "alpha", "train/sub/b.txt": "beta", "validation/c.txt": "gamma", "README.md": "r"})
    assert corpus.read_corpus(tmp_path) == {
        "train": {"train/a.txt": "alpha", "train/sub/b.txt": "beta"},
        "test": {"validation/c.txt": "gamma"},
    }
    write(tmp_path, {"test/d.txt": "delta"})  # test/ is preferred over validation/
    assert corpus.read_corpus(tmp_path)["test"] == {"test/d.txt": "delta"}
    (tmp_path / "train" / "a.txt").unlink()
    (tmp_path / "train" / "sub" / "b.txt").unlink()
    with pytest.raises(OptionError, match=r"^root: .*/train holds no text file$"):
        corpus.read_corpus(tmp_path)
    write(tmp_path, {"train/a.txt": "alpha"})
    (tmp_path / "test" / "d.txt").unlink()
    with pytest.raises(OptionError, match=r"^root: .*/test holds no text file$"):
        corpus.read_corpus(tmp_path)


def test_a_corpus_stored_under_a_hidden_folder_is_read(tmp_path) -> None:
    """Only hidden folders inside the corpus are skipped, not those on the way to it (``~/.cache/...``)."""
    root = write(tmp_path / ".cache" / "corpus", {"a.txt": "alpha", "sub/b.txt": "beta", ".git/c.txt": "no"})
    assert corpus.source_kind(root) == "files"
    assert corpus.read_corpus(root) == {"all": {"a.txt": "alpha", "sub/b.txt": "beta"}}
    split = write(tmp_path / ".cache" / "split", {"train/a.txt": "alpha", "test/b.txt": "beta"})
    assert corpus.read_corpus(split) == {"train": {"train/a.txt": "alpha"}, "test": {"test/b.txt": "beta"}}


def test_a_train_folder_alone_is_not_a_split(tmp_path) -> None:
    write(tmp_path, {"train/a.txt": "alpha", "b.txt": "beta"})
    assert corpus.read_corpus(tmp_path) == {"all": {"train/a.txt": "alpha", "b.txt": "beta"}}


def test_a_test_folder_alone_is_not_a_split(tmp_path) -> None:
    write(tmp_path, {"test/a.txt": "alpha", "b.txt": "beta"})
    assert corpus.read_corpus(tmp_path) == {"all": {"test/a.txt": "alpha", "b.txt": "beta"}}


def test_unreadable_sources_are_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(OptionError, match=r"^root: .*/missing is not a folder \(expected text files or a saved"):
        corpus.source_kind(tmp_path / "missing")
    write(tmp_path, {"file.txt": "x"})
    with pytest.raises(OptionError, match=r"^root: .*/file.txt is not a folder"):
        corpus.source_kind(tmp_path / "file.txt")
    write(tmp_path / "empty", {"data.csv": "a,b"})
    with pytest.raises(OptionError, match=r"^root: .*/empty holds no text file \(\*\.txt, \*\.md, \*\.rst, \*\.text\)"):
        corpus.source_kind(tmp_path / "empty")
    (tmp_path / "latin").mkdir()
    (tmp_path / "latin" / "x.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(
        OptionError, match=r"^root: .*/latin/x.txt is not UTF-8 text \(unexpected end of data at byte 3\)$"
    ):
        corpus.read_corpus(tmp_path / "latin")


def test_text_without_a_root_is_refused() -> None:
    with pytest.raises(OptionError, match=r"^root: data set 'text' reads the corpus in a folder; none was given$"):
        text.prepare_text("text", context=8)


def saved(tmp_path: Path, splits: dict[str, list[str]] | list[str], column: str = "text") -> Path:
    out = tmp_path / "saved"
    if isinstance(splits, list):
        datasets.Dataset.from_dict({column: splits}).save_to_disk(str(out))
    else:
        parts = {
            name: datasets.Dataset.from_dict({column: rows, "id": list(range(len(rows)))})
            for name, rows in splits.items()
        }
        datasets.DatasetDict(parts).save_to_disk(str(out))
    return out


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ({"train": ["a", "b"], "test": ["c"]}, {"train": ["a", "b"], "test": ["c"]}),
        ({"train": ["a", "b"], "validation": ["c"], "extra": ["z"]}, {"train": ["a", "b"], "test": ["c"]}),
        ({"train": ["a", "b", "c"]}, {"all": ["a", "b", "c"]}),
        ({"train": ["a", "b"], "unsupervised": ["z"]}, {"all": ["a", "b"]}),
        (["a", "b", "c"], {"all": ["a", "b", "c"]}),
    ],
)
def test_a_saved_dataset_gives_its_split_or_its_documents(tmp_path, layout, expected) -> None:
    root = saved(tmp_path, layout)
    assert corpus.source_kind(root) == "dataset"
    got = corpus.read_corpus(root)
    assert {split: list(docs.values()) for split, docs in got.items()} == expected
    assert all(name.startswith(f"{split}/") for split, docs in got.items() for name in docs)  # no clash across splits


def test_a_saved_dataset_is_refused_without_train_split_text_column_or_text(tmp_path) -> None:
    with pytest.raises(OptionError, match=r"^root: .*/saved has splits \['a', 'b'\]; expected a train split$"):
        corpus.read_corpus(saved(tmp_path / "1", {"a": ["x"], "b": ["y"]}))
    with pytest.raises(OptionError, match=r"^text_column: 'text' is not a column of .*/saved \(it has \['body'\]\)$"):
        corpus.read_corpus(saved(tmp_path / "2", ["x", "y"], column="body"))
    assert corpus.read_corpus(saved(tmp_path / "3", ["x", "y"], column="body"), text_column="body")["all"]
    numbers = tmp_path / "4"
    datasets.Dataset.from_dict({"text": [1, 2]}).save_to_disk(str(numbers))
    with pytest.raises(OptionError, match=r"^text_column: column 'text' of .*/4 holds values that are not text$"):
        corpus.read_corpus(numbers)


def test_prepare_reads_a_saved_dataset_from_its_text_column_by_default_or_the_one_named(tmp_path) -> None:
    meta = prepare("text", saved(tmp_path, [document(i, 200) for i in range(8)]), tmp_path / "prepared", context=32)
    assert sum(meta["documents"].values()) == 8
    body = saved(tmp_path / "body", [document(i, 200) for i in range(6)], column="body")
    meta = prepare("text", body, tmp_path / "prepared_body", context=32, text_column="body")
    assert sum(meta["documents"].values()) == 6


def test_a_saved_dataset_without_the_datasets_package_is_refused(tmp_path, monkeypatch) -> None:
    root = saved(tmp_path, ["x", "y"])
    real = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(
        OptionError,
        match=r"^root: .*/saved is a saved Hugging Face dataset; reading it needs the datasets package "
        r"\(pip install 'lmclab\[text\]'\)$",
    ):
        corpus.read_corpus(root)


def word_tokenizer(folder: Path, texts: list[str], eos: bool = True) -> Path:
    """A word-level tokenizer trained here on ``texts`` and saved as transformers saves one (nothing downloaded);
    like many, it adds a beginning-of-text token when asked for special tokens, which a corpus must not get."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<eos>", "<bos>"]))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", **({"eos_token": "<eos>"} if eos else {}))
    fast.save_pretrained(str(folder))
    return folder


def test_a_corpus_is_tokenised_by_a_local_tokenizer_each_document_ended_by_eos(tmp_path) -> None:
    files = {f"train/d{i}.txt": document(i) for i in range(5)} | {f"test/d{i}.txt": document(i) for i in (5, 6)}
    root = write(tmp_path / "corpus", files)
    folder = word_tokenizer(tmp_path / "tok", list(files.values()))
    meta = prepare("text", root, tmp_path / "prepared", context=16, tokenizer=folder)
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    assert (meta["num_classes"], meta["tokenizer"], meta["documents"]) == (len(tok), "tok", {"train": 5, "test": 2})
    expected = [
        t for i in range(5) for t in (*tok(document(i), add_special_tokens=False)["input_ids"], tok.eos_token_id)
    ]
    assert meta["tokens"]["train"] == len(expected) and meta["n_train"] == (len(expected) - 1) // 16
    train = load_split(tmp_path / "prepared", "train")
    assert train.x.dtype == torch.int64 and train.x.flatten().tolist() == expected[: meta["n_train"] * 16]
    assert train.y.flatten().tolist() == expected[1 : meta["n_train"] * 16 + 1]


def test_a_tokenizer_without_eos_separates_documents_by_a_blank_line(tmp_path) -> None:
    folder = word_tokenizer(tmp_path / "tok", ["a b", "\n\n"], eos=False)
    tok = corpus.load_tokenizer(folder)
    ids = corpus.tokenize(tok, {"x": "a", "y": "b"}, ["x", "y"])
    blank = tok("\n\n", add_special_tokens=False)["input_ids"]
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in ("a", "b"))
    assert ids.dtype == np.int32 and ids.tolist() == [*a, *blank, *b, *blank]
    assert tok("a")["input_ids"] == [2, *a] and 2 not in ids.tolist()  # no beginning-of-text token inside
    assert corpus.tokenize(tok, {}, []).tolist() == []


def test_unloadable_tokenizers_are_refused_in_one_line(tmp_path, monkeypatch) -> None:
    with pytest.raises(OptionError, match=r"^tokenizer: .*/none is not a folder \(expected a saved tokenizer\)$"):
        corpus.load_tokenizer(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptionError, match=r"^tokenizer: .*/empty holds no tokenizer transformers can load \("):
        corpus.load_tokenizer(tmp_path / "empty")
    real = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name)) if name == "transformers" else real(name, *a, **k)
        ),
    )
    with pytest.raises(OptionError, match=r"^tokenizer: a tokenizer folder needs transformers \(pip install"):
        corpus.load_tokenizer(tmp_path / "empty")


def test_a_tokenizer_is_loaded_offline_and_its_error_is_one_line(tmp_path, monkeypatch) -> None:
    import transformers

    calls, errors = [], iter([OSError("no tokenizer here\nsecond line"), ValueError()])

    def fake(path, **kwargs):
        calls.append(kwargs)
        raise next(errors)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    with pytest.raises(
        OptionError, match=r"^tokenizer: .* holds no tokenizer transformers can load \(no tokenizer here\)$"
    ):
        corpus.load_tokenizer(tmp_path)
    with pytest.raises(OptionError, match=r"^tokenizer: .* holds no tokenizer transformers can load \(ValueError\)$"):
        corpus.load_tokenizer(tmp_path)
    assert calls == [{"local_files_only": True}] * 2  # never downloaded


def test_the_tokenizer_is_loaded_before_the_corpus_is_read(tmp_path) -> None:
    """A bad tokenizer is reported before a (possibly large) corpus is read; nothing is written."""
    with pytest.raises(OptionError, match=r"^tokenizer: "):
        prepare("text", tmp_path / "no-corpus", tmp_path / "prepared", context=8, tokenizer=tmp_path / "no-tok")
    assert not (tmp_path / "prepared").exists()


def test_an_unsplit_corpus_of_files_is_split_by_documents_as_bytes(tmp_path) -> None:
    files = {f"d{i}.txt": document(i, 200) for i in range(20)}
    root = write(tmp_path / "corpus", files)
    meta = prepare("text", root, tmp_path / "prepared", context=32, max_test=3)
    train_names, test_names = text.split_documents(files)
    assert meta["documents"] == {"train": len(train_names), "test": len(test_names)} and meta["num_classes"] == 256
    assert meta["bytes"]["test"] == sum(len(files[n].encode()) for n in test_names) and meta["n_test"] == 3
    joined = text.SEPARATOR.join(files[n] for n in train_names).encode()
    train = load_split(tmp_path / "prepared", "train")
    assert bytes(train.x.flatten().to(torch.uint8).tolist()) == joined[: meta["n_train"] * 32]
