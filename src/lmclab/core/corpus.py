"""A researcher's own corpus for a language model (``data.name: text``) and a tokenizer from a local folder.

``root`` is read as one of:

- a folder of text files (``*.txt``, ``*.md``, ``*.rst``, ``*.text`` at any depth; names starting with a dot
  skipped), each file a document named by its path under ``root``. With ``train/`` and ``test/`` (or
  ``validation/``) subfolders those are the split; otherwise the documents are split like every text
  (:func:`lmclab.core.text.split_documents`);
- a Hugging Face dataset written by ``save_to_disk`` (``dataset_dict.json``: its ``train`` and ``test`` or
  ``validation`` splits, or ``train`` alone, split by documents; ``state.json``: one dataset, split by
  documents), each row's ``text_column`` a document. Reading it needs the ``datasets`` package (the
  ``text`` extra).

A corpus is ``{"train": documents, "test": documents}`` or ``{"all": documents}`` (to be split), documents
being ``{name: text}``. The tokenizer (:func:`load_tokenizer`) is any tokenizer ``transformers`` loads from a
folder (``tokenizer.json``, ``vocab.json`` + ``merges.txt``, …; the ``models`` extra); without one, text is
tokenised as its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lmclab.core.options import OptionError

SUFFIXES = (".txt", ".md", ".rst", ".text")
TEST_FOLDERS = ("test", "validation")
Corpus = Mapping[str, Mapping[str, str]]


def source_kind(root: Path) -> str:
    """``"dataset"`` (saved by ``datasets``) or ``"files"``; a one-line :class:`OptionError` naming ``{root}``
    when ``root`` is neither (missing, a file, or a folder without text files)."""
    root = Path(root)
    if not root.is_dir():
        raise OptionError(f"{{root}}: {root} is not a folder (expected text files or a saved Hugging Face dataset)")
    if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        return "dataset"
    if not any(_text_files(root)):
        raise OptionError(
            f"{{root}}: {root} holds no text file ({', '.join('*' + s for s in SUFFIXES)}) and no saved "
            "Hugging Face dataset (dataset_dict.json or state.json)"
        )
    return "files"


def _text_files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.suffix in SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def _read_files(folder: Path, root: Path) -> dict[str, str]:
    documents = {}
    for path in _text_files(folder):
        try:
            documents[path.relative_to(root).as_posix()] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OptionError(f"{{root}}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return documents


def _split_folders(root: Path) -> tuple[Path, Path] | None:
    test = next((root / n for n in TEST_FOLDERS if (root / n).is_dir()), None)
    return (root / "train", test) if (root / "train").is_dir() and test is not None else None


def read_corpus(root: Path, *, text_column: str = "text") -> Corpus:
    """The documents under ``root`` (module docstring), split when the source is."""
    root = Path(root)
    if source_kind(root) == "dataset":
        return _read_dataset(root, text_column)
    folders = _split_folders(root)
    if folders is None:
        return {"all": _read_files(root, root)}
    corpus = {"train": _read_files(folders[0], root), "test": _read_files(folders[1], root)}
    for split, documents in corpus.items():
        if not documents:
            raise OptionError(f"{{root}}: {folders[split == 'test']} holds no text file")
    return corpus


def _read_dataset(root: Path, text_column: str) -> Corpus:
    try:
        import datasets
    except ImportError:
        raise OptionError(
            f"{{root}}: {root} is a saved Hugging Face dataset; reading it needs the datasets package "
            "(pip install 'lmclab[text]')"
        ) from None
    loaded: Any = datasets.load_from_disk(str(root))
    parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"all": loaded}
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in parts:
            raise OptionError(f"{{root}}: {root} has splits {sorted(parts)}; expected a train split")
        test = next((n for n in TEST_FOLDERS if n in parts), None)
        parts = {"train": parts["train"], "test": parts[test]} if test else {"all": parts["train"]}
    corpus = {}
    for split, rows in parts.items():
        if text_column not in rows.column_names:
            raise OptionError(
                f"{{text_column}}: {text_column!r} is not a column of {root} (it has {rows.column_names})"
            )
        texts = rows[text_column]
        if not all(isinstance(t, str) for t in texts):
            raise OptionError(f"{{text_column}}: column {text_column!r} of {root} holds values that are not text")
        corpus[split] = {f"{split}/{i:09d}": t for i, t in enumerate(texts)}
    return corpus


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer ``transformers`` loads from the local ``folder`` (never downloaded); a one-line
    :class:`OptionError` naming ``{tokenizer}`` otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise OptionError(f"{{tokenizer}}: {folder} is not a folder (expected a saved tokenizer)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise OptionError("{tokenizer}: a tokenizer folder needs transformers (pip install 'lmclab[models]')") from None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OptionError(f"{{tokenizer}}: {folder} holds no tokenizer transformers can load ({first})") from None


def tokenize(tokenizer: Any, documents: Mapping[str, str], names: list[str]) -> np.ndarray:
    """The token ids of the named documents, each followed by the end-of-text token (or, when the tokenizer
    has none, by the tokens of a blank line); int32."""
    separator = (
        [tokenizer.eos_token_id]
        if tokenizer.eos_token_id is not None
        else tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    )
    ids = tokenizer([documents[n] for n in names], add_special_tokens=False)["input_ids"] if names else []
    joined = [token for doc in ids for token in (*doc, *separator)]
    return np.asarray(joined, dtype=np.int32)
