"""Byte-level text data (lmclab.core.text): the fixed split of the Python reference's topics, the windows of
next-token targets, and the prepared format read back by ``load_split``."""

from __future__ import annotations

from pydoc_data.topics import topics

import numpy as np
import pytest
import torch

from lmclab.core import text
from lmclab.core.data import load_meta, load_split, prepare
from lmclab.core.options import OptionError


def test_the_topics_split_whole_into_a_fixed_test_set_of_a_tenth_of_the_bytes() -> None:
    train, test = text.split_documents(topics)
    assert sorted(train + test) == sorted(topics) and not set(train) & set(test)
    assert (train, test) == text.split_documents(dict(reversed(topics.items())))  # not the dict's order
    size = {n: len(t.encode()) for n, t in topics.items()}
    total, held = sum(size.values()), sum(size[n] for n in test)
    assert held >= text.TEST_FRACTION * total
    drawn = [sorted(topics)[i] for i in np.random.default_rng(0).permutation(len(topics))]
    assert drawn[: len(test)] == sorted(test, key=drawn.index)  # the first topics drawn, no more
    assert held - size[drawn[len(test) - 1]] < text.TEST_FRACTION * total


def test_two_small_documents_drawn_first_leave_one_for_training_and_one_is_refused() -> None:
    train, test = text.split_documents({"a": "x" * 5, "b": "y" * 5}, test_fraction=0.9)
    assert len(train) == len(test) == 1
    with pytest.raises(OptionError, match=r"^documents: a train and a test set need at least 2 documents, got 1$"):
        text.split_documents({"a": "x"})


@pytest.mark.parametrize(
    ("n", "context", "limit", "kept"),
    [(10, 3, None, [0, 1, 2]), (10, 9, None, [0]), (13, 3, 2, [0, 3]), (13, 3, 3, [0, 2, 3]), (13, 3, 9, [0, 1, 2, 3])],
)
def test_windows_are_inputs_and_their_next_tokens_kept_evenly_spaced(n, context, limit, kept) -> None:
    """13 tokens in windows of 3 make 4 windows: a limit of 2 keeps the first and the last, 3 keeps 0, 2 and 3
    (1.5 rounds to 2), a limit above the count keeps all."""
    tokens = np.arange(n, dtype=np.uint8)
    x, y = text.windows(tokens, context, limit)
    assert x.shape == y.shape == (len(kept), context)
    for row, i in enumerate(kept):
        assert x[row].tolist() == list(range(i * context, i * context + context))
        assert y[row].tolist() == list(range(i * context + 1, i * context + context + 1))


def test_a_context_that_leaves_no_window_is_refused() -> None:
    with pytest.raises(OptionError, match=r"^context: 10 tokens leave no window in a text of 10$"):
        text.windows(np.zeros(10, dtype=np.uint8), 10)


def test_pydoc_is_prepared_as_byte_windows_and_read_back_as_token_ids(tmp_path) -> None:
    meta = prepare("pydoc", tmp_path, tmp_path / "prepared", context=48, max_test=20)
    assert load_meta(tmp_path / "prepared") == meta
    assert (meta["kind"], meta["num_classes"], meta["input_shape"], meta["n_test"]) == ("tokens", 256, [48], 20)
    train, test = load_split(tmp_path / "prepared", "train"), load_split(tmp_path / "prepared", "test")
    assert train.x.dtype == train.y.dtype == torch.int64 and train.x.shape == (meta["n_train"], 48)
    assert torch.equal(train.x[:, 1:], train.y[:, :-1]) and torch.equal(train.x[1:, 0], train.y[:-1, -1])
    names = text.split_documents(topics)
    joined = text.SEPARATOR.join(topics[n] for n in names[0]).encode()
    assert bytes(train.x.flatten().to(torch.uint8).tolist()) == joined[: meta["n_train"] * 48]
    assert meta["n_train"] == (len(joined) - 1) // 48 and test.x.shape == (20, 48)
    held_out = topics[names[1][0]].encode()[:48]
    assert held_out not in joined and held_out in bytes(test.x.flatten().to(torch.uint8).tolist())


def test_pydoc_is_prepared_by_default_as_windows_of_64_bytes(tmp_path) -> None:
    meta = prepare("pydoc", tmp_path, tmp_path / "prepared", max_train=5, max_test=3)
    assert (meta["tokenizer"], meta["input_shape"], meta["n_train"], meta["n_test"]) == ("bytes", [64], 5, 3)
    assert load_split(tmp_path / "prepared", "test").x.shape == (3, 64)


@pytest.mark.parametrize(("context", "shown"), [(0, "0"), (True, "True"), ("64", "'64'")])
def test_a_context_that_is_not_a_positive_count_is_refused(tmp_path, context, shown) -> None:
    with pytest.raises(OptionError, match=rf"^context must be a positive number of tokens, got {shown}$"):
        prepare("pydoc", tmp_path, tmp_path / "prepared", context=context)
    assert not (tmp_path / "prepared").exists()


def test_a_context_of_one_token_gives_windows_of_a_token_and_its_successor(monkeypatch) -> None:
    monkeypatch.setitem(text.TEXTS, "tiny", lambda root, column: {"train": {"a": "abcd"}, "test": {"b": "xyz"}})
    meta, splits = text.prepare_text("tiny", context=1)
    assert meta["input_shape"] == [1]
    inputs, targets = splits["train"]
    assert bytes(inputs.ravel()) == b"abc" and bytes(targets.ravel()) == b"bcd"


def test_an_unknown_text_is_refused_in_one_line() -> None:
    with pytest.raises(OptionError, match=r"^name: unknown text 'wiki'; expected one of \['pydoc', 'text'\]$"):
        text.prepare_text("wiki", context=8)


def test_a_split_corpus_keeps_a_train_and_a_test_document_of_the_same_name(monkeypatch) -> None:
    """Each split joins its own documents: the test set's ``a`` never replaces the train set's ``a``."""
    corpus = {"train": {"a": "train one", "b": "train two"}, "test": {"a": "the test"}}
    monkeypatch.setitem(text.TEXTS, "clash", lambda root, column: corpus)
    meta, splits = text.prepare_text("clash", context=4)
    train, test = ("train one\n\ntrain two", "the test")
    assert meta["documents"] == {"train": 2, "test": 1}
    assert meta["bytes"] == {"train": 18, "test": 8} and meta["tokens"] == {"train": len(train), "test": len(test)}
    for split, joined in (("train", train), ("test", test)):
        inputs = splits[split][0]
        assert b"".join(bytes(row) for row in inputs) == joined.encode()[: 4 * len(inputs)]
