"""The canonical form in which orthogonal maps of a stream are symmetries: norm gains folded into their readers.

An RMSNorm computes ``g ⊙ x / rms(x)``; a per-channel gain ``g`` does not commute with an orthogonal map
(``diag(g) O ≠ O diag(g)``), but every layer that reads the norm's output is linear, ``W (g ⊙ y) =
(W diag(g)) y``, so moving ``g`` into the readers' columns and setting it to 1 keeps the function (the
folding SliceGPT and QuaRot perform; Ashkboos et al. 2024, Section 3). The tracer records each foldable
gain with the weights that read it (:attr:`lmclab.core.spec.PermutationSpec.gains`,
:mod:`lmclab.trace.rotations`); the folded model is of the same architecture, with unit gains.

A head tied to the embeddings (GPT-2, most small language models) reads the final norm's gain through the
embedding matrix ``E`` itself: folding the gain gives the head ``E diag(g)`` while the embedding keeps ``E``,
so the canonical form unties them (:func:`untie`): the head gets its own weight, a copy, and the function is
unchanged; the untied model has one more matrix and is saved untied (``tie_word_embeddings: false``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from lmclab.core.shards import ShardedWeights
from lmclab.core.spec import Params, PermutationSpec, with_metadata


def fold_gains(spec: PermutationSpec, params: Mapping[str, Tensor], what: str = "params") -> Params:
    """``params`` with every gain of ``spec.gains`` folded into the weights that read it (``W ← W diag(g)``,
    ``g ← 1``; a weight stored as (in, out), GPT-2's ``Conv1D``, ``W ← diag(g) W``: the tracer records such a
    reader only when it is not square; for a gain read as ``c + w``, ``g = c + w`` and ``w ← 1 − c``; a
    LayerNorm's bias ``b ← b / g``, so that ``W diag(g)(x̂ + b/g) = W (g ⊙ x̂ + b)``), the caller's tensors
    untouched. One-line error naming ``what`` when no axis of a reader is as long as its gain, or when a gain
    with a bias has a zero entry."""
    roles = gain_roles(spec)
    out = {k: fold_entry(spec, roles, k, v, params.__getitem__, what) if k in roles else v for k, v in params.items()}
    return with_metadata(out, params)


def gain_roles(spec: PermutationSpec) -> dict[str, tuple[str, list[str]]]:
    """Every entry folding changes, with its role — ``"gain"``, ``"bias"`` (of one gain) or ``"reader"`` — and
    the gains it concerns."""
    roles: dict[str, tuple[str, list[str]]] = {}
    for gain, readers in spec.gains.items():
        roles[gain] = ("gain", [gain])
        if (bias := spec.gain_biases.get(gain)) is not None:
            roles[bias] = ("bias", [gain])
        for reader in readers:
            roles.setdefault(reader, ("reader", []))[1].append(gain)
    return roles


def fold_entry(
    spec: PermutationSpec,
    roles: Mapping[str, tuple[str, list[str]]],
    name: str,
    value: Tensor,
    read: Callable[[str], Tensor],
    what: str = "params",
) -> Tensor:
    """The entry ``name`` of :func:`fold_gains`' result from its ``value`` (``roles``: :func:`gain_roles`;
    ``read(gain)``: a gain's stored values), one entry at a time — a checkpoint read lazily is folded as it is read."""
    role, gains = roles[name]
    if role == "gain":
        return torch.full_like(value, 1.0 - spec.gain_offsets.get(name, 0.0))
    for gain in gains:
        g = read(gain).reshape(-1).double() + spec.gain_offsets.get(gain, 0.0)
        if role == "bias":
            if bool((g == 0).any()):
                raise ValueError(f"{what}: the gain {gain!r} has a zero entry; its bias {name!r} cannot be folded")
            return (value / g.to(value.dtype)).to(value.dtype)
        if value.dim() != 2 or g.numel() not in value.shape:
            raise ValueError(
                f"{what}: {name!r} of shape {tuple(value.shape)} reads the gain {gain!r} of {g.numel()} entries"
            )
        along = g if value.shape[1] == g.numel() else g[:, None]  # (out, in) as nn.Linear; else (in, out): addmm's
        value = (value * along.to(value.dtype)).to(value.dtype)
    return value


def is_canonical(spec: PermutationSpec, params: Mapping[str, Tensor]) -> bool:
    """Whether every gain of ``spec.gains`` reads 1 in ``params`` (folded: ``w = 1 − c`` for a gain ``c + w``)."""
    return all(bool((params[gain] == 1.0 - spec.gain_offsets.get(gain, 0.0)).all()) for gain in spec.gains)


def shared_parameters(model: nn.Module) -> list[tuple[str, ...]]:
    """Each set of names under which one parameter of ``model`` appears more than once (a tied head)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(n) for n in names.values() if len(n) > 1]


def untie(model: nn.Module, names: tuple[str, ...]) -> None:
    """Give every name of ``names`` but the first its own copy of their shared parameter, in ``model`` itself
    (a copy the caller owns): the function is unchanged."""
    first = model.get_parameter(names[0])
    for name in names[1:]:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(first.detach().clone(), first.requires_grad))


def tie(model: nn.Module, names: tuple[str, ...]) -> None:
    """Make every name of ``names`` the first's parameter again (the inverse of :func:`untie`)."""
    first = model.get_parameter(names[0])
    for name in names[1:]:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, first)


def untie_config(model: nn.Module) -> None:
    """Mark a Hugging Face model's config (and its text config) untied, so that ``save_pretrained`` and
    ``from_pretrained`` keep the head's own weight; a module without such a config is left as it is."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    for cfg in (config, text() if callable(text) else None):
        if getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False


class FoldedWeights(ShardedWeights):
    """A checkpoint read lazily (:class:`lmclab.core.shards.ShardedWeights`) in the canonical form of ``spec``: each
    entry folded as it is read (:func:`fold_entry`; its gains read beside it, a few values each), the files
    untouched. Errors name ``what``."""

    def __init__(self, weights: ShardedWeights, spec: PermutationSpec, what: str = "params") -> None:
        # no ShardedWeights.__init__: the headers were read by ``weights``, whose reads (and their count) these are
        self.base, self.spec, self.roles, self.what = weights, spec, gain_roles(spec), what
        self.files, self.aliases, self.shapes, self.stored = (
            weights.files,
            weights.aliases,
            weights.shapes,
            weights.stored,
        )
        self.dtype, self.device = weights.dtype, weights.device

    @property
    def bytes_read(self) -> int:  # type: ignore[override]
        return self.base.bytes_read

    def __getitem__(self, name: str) -> Tensor:
        value = self.base[name]
        return (
            fold_entry(self.spec, self.roles, name, value, self.base.__getitem__, self.what)
            if name in self.roles
            else value
        )

    def rows(self, name: str, start: int, stop: int) -> Tensor:
        """``self[name][start:stop]``: only those rows read where folding scales columns alone (a reader stored
        (out, in), or an entry folding leaves); else the entry read whole, folded and sliced (a gain, a bias, a
        reader stored (in, out): small, or along the rows)."""
        role, gains = self.roles.get(name, ("", []))
        if not role:
            return self.base.rows(name, start, stop)
        if role == "reader" and all(self.shapes[name][-1] == self.shapes[g].numel() for g in gains):
            value = self.base.rows(name, start, stop)
            return fold_entry(self.spec, self.roles, name, value, self.base.__getitem__, self.what)
        return self[name][start:stop]
