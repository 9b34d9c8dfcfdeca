"""Checkpoints too large to hold twice: safetensors shards read one tensor at a time and written one shard at a
time.

:class:`ShardedWeights` is a read-only mapping of names to tensors over a folder's shards whose values are read
when asked for — each from its file, opened, memory-mapped and closed around the read, so that no page of a
shard stays resident (``safe_open`` keeps a file mapped while it is open, and its pages count in the process's
memory) — and converted to the compute dtype on the compute device; it keeps nothing, so a caller that drops
each tensor after use holds one at a time. Its shapes and stored dtypes come from the shards' headers, without
reading a tensor, and ``bytes_read`` counts what it read.

:func:`write_shards` writes tensors produced one at a time as shards of at most ``max_shard_bytes`` (the last
tensor of a shard may pass it) with the index Hugging Face's ``from_pretrained`` reads
(``model.safetensors.index.json``), holding one shard in memory: safetensors' ``save_file`` writes a whole
mapping at once, so a shard is the unit. Built on the ``safetensors`` library (the format's reference reader
and writer, which checks headers and offsets)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _open(file: Path):
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), "pt")
    except (SafetensorError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{file}: not a readable safetensors file (truncated or corrupted? {first[:120]})") from None


def shard_files(folder: Path) -> dict[str, Path]:
    """Each tensor's file in ``folder``: ``model.safetensors`` alone, or the shards its index names; one line
    naming the file when the folder has neither, the index is no weight map or a shard is missing."""
    folder = Path(folder)
    if (folder / SINGLE).is_file():
        with _open(folder / SINGLE) as handle:
            keys = handle.keys()
        return dict.fromkeys(keys, folder / SINGLE)
    index = folder / INDEX
    if not index.is_file():
        raise FileNotFoundError(f"{folder}: no safetensors weights (expected {SINGLE} or {INDEX})")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = {str(k): folder / str(v) for k, v in weight_map.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{index}: not a weight index with a 'weight_map' ({exc})") from None
    for file in sorted(set(files.values())):
        if not file.is_file():
            raise FileNotFoundError(f"{file}: file not found (named by the folder's index)")
    return files


class ShardedWeights(Mapping[str, Tensor]):
    """The tensors of safetensors files, read when asked for (module docstring).

    ``files``: each name's file, in the order the mapping iterates; ``aliases``: names read from another's tensor
    (an entry a checkpoint writes once, such as an output head tied to the embeddings); ``dtype``/``device``: what
    every floating read is converted to (None: as stored; integers stay as stored)."""

    def __init__(
        self,
        files: Mapping[str, Path],
        *,
        aliases: Mapping[str, str] | None = None,
        dtype: torch.dtype | None = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.files, self.aliases = dict(files), dict(aliases or {})
        self.dtype, self.device, self.bytes_read = dtype, torch.device(device), 0
        self.shapes: dict[str, torch.Size] = {}
        self.stored: dict[str, torch.dtype] = {}
        for file in sorted(set(self.files.values())):
            with _open(file) as handle:
                keys = handle.keys()
                for key in keys:
                    if self.files.get(key) == file:
                        piece = handle.get_slice(key)
                        self.shapes[key], self.stored[key] = torch.Size(piece.get_shape()), _dtype(piece, file)
        if missing := sorted(set(self.files) - set(self.shapes)):
            raise ValueError(f"{self.files[missing[0]]}: no tensor {missing[0]!r} (named by the folder's index)")
        self.shapes = {k: self.shapes[k] for k in self.files}  # the order of ``files``, then the aliases'
        for name, source in self.aliases.items():
            self.shapes[name], self.stored[name] = self.shapes[source], self.stored[source]

    def with_dtype(self, dtype: torch.dtype | None, device: torch.device | str | None = None) -> ShardedWeights:
        """The same files read in ``dtype`` (on ``device``; default: this one's)."""
        twin = ShardedWeights.__new__(ShardedWeights)
        twin.__dict__.update(self.__dict__, dtype=dtype, device=torch.device(device or self.device), bytes_read=0)
        return twin

    def __getitem__(self, name: str) -> Tensor:
        key = self.aliases.get(name, name)
        if key not in self.files:
            raise KeyError(name)
        with _open(self.files[key]) as handle:
            return self._converted(handle.get_tensor(key))

    def rows(self, name: str, start: int, stop: int) -> Tensor:
        """``self[name][start:stop]``, only those rows read."""
        key = self.aliases.get(name, name)
        with _open(self.files[key]) as handle:
            return self._converted(handle.get_slice(key)[start:stop])

    def _converted(self, value: Tensor) -> Tensor:
        """``value`` as read, counted, and copied in the compute dtype (floating reads) onto the device."""
        self.bytes_read += value.nbytes
        dtype = self.dtype if self.dtype is not None and value.is_floating_point() else value.dtype
        return value.to(device=self.device, dtype=dtype, copy=True)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def nbytes(self) -> int:
        """The stored size of every tensor (aliases once per name)."""
        return sum(s.numel() * self.stored[k].itemsize for k, s in self.shapes.items())


def _dtype(piece, file: Path) -> torch.dtype:
    from safetensors.torch import _getdtype

    try:
        return _getdtype(piece.get_dtype())
    except (KeyError, ValueError, AttributeError):
        raise ValueError(f"{file}: tensor dtype {piece.get_dtype()!r} that torch cannot hold") from None


def shard_plan(sizes: Mapping[str, int], max_shard_bytes: int) -> list[list[str]]:
    """The names in order cut into shards of at most ``max_shard_bytes`` each (a tensor larger than that alone)."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes: expected a positive number of bytes, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def write_shards(
    folder: Path, sizes: Mapping[str, int], produce: Callable[[str], Tensor], *, max_shard_bytes: int
) -> int:
    """Every name of ``sizes`` (its bytes as it will be written, to plan the shards) written to ``folder`` as
    ``produce(name)`` gives it, one shard in memory at a time (module docstring), with the index; the total bytes."""
    from safetensors.torch import save_file

    plan, total, weight_map = shard_plan(sizes, max_shard_bytes), 0, {}
    for k, names in enumerate(plan, 1):
        file = f"model-{k:05d}-of-{len(plan):05d}.safetensors" if len(plan) > 1 else SINGLE
        shard = {name: produce(name).contiguous() for name in names}
        total += sum(v.nbytes for v in shard.values())
        save_file(shard, str(Path(folder) / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        del shard
    if len(plan) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (Path(folder) / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return total


def stored_sizes(shapes: Mapping[str, torch.Size], dtypes: Mapping[str, torch.dtype]) -> dict[str, int]:
    """Bytes of each tensor as stored."""
    return {k: s.numel() * dtypes[k].itemsize for k, s in shapes.items()}
