"""An alignment: the permutation π found for θb, the spec it permutes by, and what the search recorded —
in memory and in a file that carries its spec, so that merging or measuring with a saved alignment
needs no second trace of the model (the paper's Section 2: π(θb) with ``W'_ℓ = P_ℓ W_ℓ P_{ℓ-1}ᵀ``).

>>> import torch, lmclab
>>> from torch import nn
>>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> res = lmclab.find_permutation(net, net, example_inputs=torch.zeros(2, 4))
>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "perm.pt"
>>> res.save(path)
>>> back = lmclab.load_alignment(path)
>>> back.spec == res.spec and all(torch.equal(back.perm[g], res.perm[g]) for g in res.perm)
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmclab.api.inputs import Model, params_of
from lmclab.api.widths import embedded
from lmclab.core import spec as spec_ops
from lmclab.core.canonical import fold_gains
from lmclab.core.orthogonal import as_matrix
from lmclab.core.spec import Params, Permutation, PermutationSpec
from lmclab.core.spec_data import spec_from_data, spec_to_data

FORMAT = "lmclab-alignment-2"  # the permutation, its method, its numeric stats and its spec
SPECLESS = "lmclab-permutation-1"  # what lmclab wrote before: no spec (read with spec= given)


def short_stats(stats: Mapping[str, Any], count: int = 3) -> str:
    """The first ``count`` numeric entries of ``stats`` as ``, name=value`` (for a ``repr``)."""
    numbers = [(k, v) for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return "".join(f", {k}={v:.4g}" for k, v in numbers[:count])


def short_groups(sizes: Mapping[str, int], count: int = 6) -> str:
    """``{g: n, …}`` of the first ``count`` groups (for a ``repr``)."""
    shown = ", ".join(f"{g}: {n}" for g, n in list(sizes.items())[:count])
    noun = "group" if len(sizes) == 1 else "groups"
    return f"{len(sizes)} {noun} {{{shown}{', …' if len(sizes) > count else ''}}}"


def apply_permutation(spec: PermutationSpec, perm: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Params:
    """π(θ): every axis of every entry of ``params`` permuted by its group's index tensor (or multiplied by its
    orthogonal matrix) in ``perm`` (the argument order of :func:`lmclab.core.spec.apply_permutation` and
    git-re-basin's); a spec with gains first folds them (the canonical form its orthogonal groups act on)."""
    if not isinstance(perm, Mapping) or not isinstance(params, Mapping):
        raise TypeError("perm and params must be mappings (group -> index tensor; name -> tensor), in that order")
    spec.check(params, "params")
    spec_ops.check_permutation(perm, spec.group_sizes(params), spec.heads, spec.kinds)
    return spec_ops.apply_permutation(spec, perm, fold_gains(spec, params, "params"))


def aligned_to(alignment: Alignment, params: Mapping[str, Tensor], what: str, source: str = "alignment") -> Params:
    """π(θ) of ``params`` (called ``what``) by ``alignment`` (called ``source``), its norm gains first folded
    into their readers where the spec lists gains (:func:`lmclab.core.canonical.fold_gains`: the canonical form
    an orthogonal alignment acts on); one line naming both unless its spec and permutation were found for a
    model of ``params``' tensors, axes and group sizes."""
    try:
        if alignment.widths:  # θb of other widths: embedded in the alignment's (lmclab.api.widths)
            sizes = {g: len(p) for g, p in alignment.perm.items()}
            params = embedded(alignment.spec, fold_gains(alignment.spec, params, what), sizes, alignment.widths)
        alignment.spec.check(params, what)
        sizes = alignment.spec.group_sizes(params)
        for group, perm in alignment.perm.items():
            if group in sizes and sizes[group] != len(perm):
                raise ValueError(f"group {group!r} has {sizes[group]} units in {what}, {len(perm)} in the alignment")
        spec_ops.check_permutation(alignment.perm, sizes, alignment.spec.heads, alignment.spec.kinds)
    except ValueError as exc:
        detail = str(exc).removeprefix(f"{what}: ").removeprefix("model_b: ")
        raise ValueError(f"{source}: found for another model than {what}: {detail}") from None
    params = fold_gains(alignment.spec, params, what)  # a gain it cannot fold is the model's own: named as such
    return spec_ops.apply_permutation(alignment.spec, alignment.perm, params)


def aligned_pair(
    alignment: Alignment | None, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> tuple[Params, Params]:
    """θa and π(θb) as an alignment compares them: both in the canonical form its spec acts on (θa's gains folded
    as :func:`aligned_to` folds θb's); the pair unchanged without ``alignment``."""
    if alignment is None:
        return dict(params_a), dict(params_b)
    return fold_gains(alignment.spec, params_a, "model_a"), aligned_to(alignment, params_b, "model_b")


@dataclass(frozen=True, repr=False)
class Alignment:
    """The permutation ``perm`` (group → index tensor, or an orthogonal matrix for a group of kind
    ``"orthogonal"``: :mod:`lmclab.core.orthogonal`) found by ``method`` aligning θb to θa under ``spec``;
    ``stats`` holds what the search recorded (seconds, objective, curves); ``widths``, θb's units of each group
    where it is narrower than θa: ``perm`` then acts on θb embedded in θa's widths (:mod:`lmclab.core.widths`: a
    semi-permutation, or a map with orthonormal columns, of θb's units)."""

    method: str
    spec: PermutationSpec
    perm: Permutation
    stats: dict[str, Any] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)

    def apply(self, params_b: Model) -> Params:
        """π(θb) for a module, state dict or checkpoint path ``params_b`` (in its own dtype)."""
        return aligned_to(self, params_of(params_b, "params_b", torch.device("cpu")), "params_b")

    def matrix(self, group: str) -> Tensor:
        """The element of ``group`` as the ``n_a × n_b`` matrix (float64) that maps θb's units onto θa's: a
        permutation matrix (``P[i, perm[i]] = 1``) or an orthogonal map, and for θb narrower there (``widths``)
        its first ``n_b`` columns — a semi-permutation (one 1 per column) or a map with orthonormal columns."""
        if group not in self.perm:
            raise ValueError(f"group: {group!r} is not a group of the alignment ({sorted(self.perm)[:3]} …)")
        full = as_matrix(self.perm[group].cpu())
        return full[:, : self.widths.get(group, full.shape[1])]

    def save(self, path: str | os.PathLike) -> None:
        """The alignment with its spec, written atomically to ``path`` (read back by :func:`load_alignment`);
        of ``stats`` the numbers are kept."""
        from lmclab.archs.checkpoint import atomic_save

        plain = {k: float(v) for k, v in self.stats.items() if isinstance(v, int | float)}
        perm = {g: p.cpu() for g, p in self.perm.items()}
        blob = {"format": FORMAT, "method": self.method, "stats": plain, "perm": perm, "spec": spec_to_data(self.spec)}
        blob |= {"widths": dict(self.widths)} if self.widths else {}
        atomic_save(blob, Path(path))

    def __repr__(self) -> str:
        sizes = {g: len(p) for g, p in self.perm.items()}
        narrower = f", θb narrower in {len(self.widths)}" * bool(self.widths)
        return f"Alignment(method={self.method!r}, {short_groups(sizes)}{narrower}{short_stats(self.stats)})"


def read_alignment(path: str | os.PathLike) -> tuple[dict[str, Any], PermutationSpec | None]:
    """The file's contents and its spec (None in a file of the earlier, spec-less format)."""
    from lmclab.core.torchfile import torch_load

    path = Path(path)
    expected = f"expected an alignment written by `lmclab match` or Alignment.save (format {FORMAT})"
    if path.is_dir():
        raise ValueError(f"{path}: a folder; {expected}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    blob = torch_load(path)
    if not isinstance(blob, dict) or blob.get("format") not in (FORMAT, SPECLESS):
        raise ValueError(f"{path}: {expected}")
    spec = spec_from_data(blob["spec"], str(path)) if blob["format"] == FORMAT else None
    return blob, spec


def load_alignment(path: str | os.PathLike, *, spec: PermutationSpec | None = None) -> Alignment:
    """The :class:`Alignment` saved at ``path`` with its spec; ``spec`` is needed only for a file of the
    earlier format, which did not store one (and, given, must equal a stored one)."""
    blob, stored = read_alignment(path)
    if stored is None and spec is None:
        raise ValueError(f"spec: {path} was written without its spec (an earlier lmclab); pass the spec it permutes by")
    if stored is not None and spec is not None and stored != spec:
        raise ValueError(f"spec: differs from the spec stored in {path}")
    found = stored or spec
    spec_ops.check_permutation(blob["perm"], {g: len(p) for g, p in blob["perm"].items()}, found.heads, found.kinds)
    if set(blob["perm"]) != set(found.groups):
        raise ValueError(f"{path}: its permutation's groups {sorted(blob['perm'])} are not the spec's")
    widths = blob.get("widths", {})
    sizes = {g: len(p) for g, p in blob["perm"].items()}
    if not isinstance(widths, dict) or any(
        not isinstance(n, int) or not 0 < n < sizes.get(g, 0) for g, n in widths.items()
    ):
        raise ValueError(f"{path}: its widths are not fewer units than its groups' ({widths!r:.80})")
    return Alignment(str(blob.get("method", "")), found, dict(blob["perm"]), dict(blob.get("stats", {})), widths)
