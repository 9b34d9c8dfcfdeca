"""Text data sets for next-token prediction, tokenised as bytes (vocabulary 256), offline.

``pydoc`` is the Python language reference that ships with every CPython (``pydoc_data.topics``: 79
topics, about 466 KB of English prose, grammar and examples). The topics, not the bytes, are split into a
fixed train and test set: in the sorted order of their names shuffled by a fixed seed, topics go to the
test set until it holds :data:`TEST_FRACTION` of the bytes, so no topic is seen in training and tested on.
Each split's topics are joined (sorted by name, a blank line between) and encoded as UTF-8 bytes.

A split of ``n`` bytes is cut into ``(n − 1) // context`` windows of ``context + 1`` consecutive bytes,
each starting ``context`` after the last: the window's first ``context`` bytes are the input, its last
``context`` the targets (the next byte at every position). ``max_train``/``max_test`` keep the first
windows of a split. A window is a sample: the prepared format of :mod:`lmclab.core.data` holds the inputs
``(windows, context)`` and the targets ``(windows, context)`` as bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from lmclab.core.options import OptionError, got

VOCABULARY = 256  # bytes
TEST_FRACTION = 0.1  # of a text's bytes, in whole topics
SPLIT_SEED = 0  # fixed: the split is part of the data set's definition
SEPARATOR = "\n\n"  # between the documents of a split


def _pydoc() -> Mapping[str, str]:
    from pydoc_data.topics import topics

    return topics


TEXTS: dict[str, Callable[[], Mapping[str, str]]] = {"pydoc": _pydoc}


def split_documents(documents: Mapping[str, str], test_fraction: float = TEST_FRACTION) -> tuple[list, list]:
    """The names of the train and test documents (module docstring), each sorted; at least one of each."""
    if len(documents) < 2:
        raise OptionError(f"{{documents}}: a train and a test set need at least 2 documents, got {len(documents)}")
    names = sorted(documents)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(names))
    total = sum(len(documents[n].encode()) for n in names)
    test: list[str] = []
    for i in order:
        if test and sum(len(documents[n].encode()) for n in test) >= test_fraction * total:
            break
        test.append(names[i])
    train = [n for n in names if n not in test]
    if not train:  # small documents drawn first took them all: the last one drawn goes back to training
        train.append(test.pop())
    return sorted(train), sorted(test)


def encode(documents: Mapping[str, str], names: list[str]) -> np.ndarray:
    """The UTF-8 bytes of the named documents joined by :data:`SEPARATOR` (uint8)."""
    return np.frombuffer(SEPARATOR.join(documents[n] for n in names).encode(), dtype=np.uint8).copy()


def windows(tokens: np.ndarray, context: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-token targets ``(windows, context)`` of ``tokens`` (module docstring), at most ``limit``."""
    count = (len(tokens) - 1) // context
    if count < 1:
        raise OptionError(f"{{context}}: {context} tokens leave no window in a text of {len(tokens)}")
    count = count if limit is None else min(count, limit)
    starts = np.arange(count)[:, None] * context + np.arange(context + 1)
    cut = tokens[starts]
    return cut[:, :-1], cut[:, 1:]


def prepare_text(
    name: str, *, context: int, max_train: int | None = None, max_test: int | None = None
) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The metadata and the train and test windows of text ``name`` (module docstring)."""
    if name not in TEXTS:
        raise OptionError(f"{{name}}: unknown text {got(name)}; expected one of {got(sorted(TEXTS))}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise OptionError(f"{{context}} must be a positive number of tokens, got {got(context)}")
    documents = TEXTS[name]()
    train, test = split_documents(documents)
    splits = {
        "train": windows(encode(documents, train), context, max_train),
        "test": windows(encode(documents, test), context, max_test),
    }
    meta = {
        "name": name,
        "kind": "tokens",
        "num_classes": VOCABULARY,
        "input_shape": [context],
        "n_train": len(splits["train"][0]),
        "n_test": len(splits["test"][0]),
        "documents": {"train": len(train), "test": len(test)},
        "bytes": {"train": int(splits["train"][0].size), "test": int(splits["test"][0].size)},
    }
    return meta, splits
