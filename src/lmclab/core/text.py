"""Text data sets for next-token prediction, tokenised as bytes (vocabulary 256) or by a local tokenizer.

``pydoc`` is the Python language reference that ships with every CPython (``pydoc_data.topics``: 79
topics, about 466 KB of English prose, grammar and examples), offline. ``text`` is a researcher's corpus
under ``root`` (:mod:`lmclab.core.corpus`: text files or a saved Hugging Face dataset). Documents, not
bytes, are split into a fixed train and test set (unless the corpus comes split): in the sorted order of
their names shuffled by a fixed seed, documents go to the test set until it holds :data:`TEST_FRACTION` of
the bytes, so no document is seen in training and tested on. A corpus that comes split keeps its splits as
they are: each split's documents are its own, so a train and a test document of the same name (a reader may name
each split's rows ``0``, ``1``, …) are both kept, neither in the other's place: what the researcher put in a
split is what is trained or tested on. Each split's documents are joined (sorted by
name, a blank line between) and encoded as UTF-8 bytes; with a ``tokenizer`` folder, tokenised by it
(:func:`lmclab.core.corpus.tokenize`: each document followed by the end-of-text token).

A split of ``n`` bytes is cut into ``(n − 1) // context`` windows of ``context + 1`` consecutive bytes,
each starting ``context`` after the last: the window's first ``context`` bytes are the input, its last
``context`` the targets (the next byte at every position). ``max_train``/``max_test`` keep that many
windows of a split, evenly spaced from its first to its last (every part of the text represented). A window
is a sample: the prepared format of :mod:`lmclab.core.data` holds the inputs ``(windows, context)`` and the
targets ``(windows, context)`` as bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from lmclab.core.corpus import Corpus, load_tokenizer, read_corpus, tokenize
from lmclab.core.options import OptionError, got

VOCABULARY = 256  # bytes
TEST_FRACTION = 0.1  # of a text's bytes, in whole topics
SPLIT_SEED = 0  # fixed: the split is part of the data set's definition
SEPARATOR = "\n\n"  # between the documents of a split


def _pydoc(root: Path | None, text_column: str) -> Corpus:
    from pydoc_data.topics import topics

    return {"all": topics}


def _local(root: Path | None, text_column: str) -> Corpus:
    if root is None:
        raise OptionError("{root}: data set 'text' reads the corpus in a folder; none was given")
    return read_corpus(root, text_column=text_column)


# name -> the corpus of (root, text_column); a split corpus is {"train", "test"}, else {"all"}
TEXTS: dict[str, Callable[[Path | None, str], Corpus]] = {"pydoc": _pydoc, "text": _local}


def split_documents(documents: Mapping[str, str], test_fraction: float = TEST_FRACTION) -> tuple[list, list]:
    """The names of the train and test documents (module docstring), each sorted; at least one of each."""
    if len(documents) < 2:
        raise OptionError(f"{{documents}}: a train and a test set need at least 2 documents, got {len(documents)}")
    names = sorted(documents)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(names))
    sizes = np.array([len(documents[names[i]].encode()) for i in order])
    before = np.concatenate([[0], np.cumsum(sizes)[:-1]])  # bytes already in the test set when each is drawn
    count = max(1, int(np.sum(before < test_fraction * sizes.sum())))  # draw until the fraction is reached
    count = min(count, len(names) - 1)  # small documents drawn first took them all: one goes back to training
    test = {names[i] for i in order[:count]}
    return [n for n in names if n not in test], sorted(test)


def _parts(corpus: Corpus) -> dict[str, tuple[Mapping[str, str], list[str]]]:
    """Each split's documents and the names it joins: a corpus that comes split keeps each split's own
    documents, so a train and a test document of the same name are both kept (module docstring)."""
    if "all" in corpus:
        names = split_documents(corpus["all"])
        return {s: (corpus["all"], n) for s, n in zip(("train", "test"), names, strict=True)}
    return {s: (corpus[s], sorted(corpus[s])) for s in ("train", "test")}


def encode(documents: Mapping[str, str], names: list[str]) -> np.ndarray:
    """The UTF-8 bytes of the named documents joined by :data:`SEPARATOR` (uint8)."""
    return np.frombuffer(SEPARATOR.join(documents[n] for n in names).encode(), dtype=np.uint8).copy()


def windows(tokens: np.ndarray, context: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-token targets ``(windows, context)`` of ``tokens`` (module docstring): every window, or
    ``limit`` of them evenly spaced from the first to the last (every part of the text represented)."""
    count = (len(tokens) - 1) // context
    if count < 1:
        raise OptionError(f"{{context}}: {context} tokens leave no window in a text of {len(tokens)}")
    kept = np.arange(count) if limit is None or limit >= count else np.linspace(0, count - 1, limit).round().astype(int)
    starts = kept[:, None] * context + np.arange(context + 1)
    cut = tokens[starts]
    return cut[:, :-1], cut[:, 1:]


def prepare_text(
    name: str,
    *,
    context: int,
    max_train: int | None = None,
    max_test: int | None = None,
    root: Path | None = None,
    tokenizer: Path | None = None,
    text_column: str = "text",
) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The metadata and the train and test windows of text ``name`` (module docstring): ``root`` is the
    corpus of ``text``, ``tokenizer`` a tokenizer folder (None: bytes), ``text_column`` the column of a
    saved dataset. The tokenizer is loaded before the corpus is read."""
    if name not in TEXTS:
        raise OptionError(f"{{name}}: unknown text {got(name)}; expected one of {got(sorted(TEXTS))}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise OptionError(f"{{context}} must be a positive number of tokens, got {got(context)}")
    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    corpus = TEXTS[name](root, text_column)
    parts = _parts(corpus)
    encoded = {s: encode(docs, n) if tok is None else tokenize(tok, docs, n) for s, (docs, n) in parts.items()}
    limits = {"train": max_train, "test": max_test}
    splits = {s: windows(tokens, context, limits[s]) for s, tokens in encoded.items()}
    meta = {
        "name": name,
        "kind": "tokens",
        "num_classes": VOCABULARY if tok is None else len(tok),
        "input_shape": [context],
        "n_train": len(splits["train"][0]),
        "n_test": len(splits["test"][0]),
        "tokenizer": "bytes" if tok is None else Path(tokenizer).name,
        "documents": {s: len(n) for s, (_, n) in parts.items()},
        "bytes": {s: sum(len(docs[d].encode()) for d in n) for s, (docs, n) in parts.items()},
        "tokens": {s: int(len(t)) for s, t in encoded.items()},
    }
    return meta, splits
