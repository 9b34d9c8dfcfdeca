"""Two checkpoints of a registered architecture in the form a search of ``symmetry`` acts on, with the spec and
activation points it acts by: :func:`symmetric_forms`. The pipeline's permute, merge, measure and connect stages
all take their endpoints from it, so that each stage sees the same models under the same spec.

For ``symmetry="permutation"`` (the paper's) these are the checkpoints themselves under the architecture's own
spec. For ``"orthogonal"`` they are the *canonical forms* an orthogonal alignment acts on (Theus et al. 2025,
Section 3; docs/symmetries.md): every norm gain the tracer can fold folded into the layers that read it and set
to 1 (:func:`lmclab.core.canonical.fold_gains`, ``W (g ⊙ y) = (W diag(g)) y``), a head tied to the embeddings
untied first (its config then says ``tie_embeddings: false``), under the spec the tracer proves
(:func:`lmclab.trace.trace` with ``symmetry="orthogonal"``: the kinds of its groups). A canonical form computes
the same function as the checkpoint; interpolating two of them is not interpolating the checkpoints, since the
gains are no longer averaged on their own."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.canonical import fold_gains, shared_parameters
from lmclab.core.orthogonal import SYMMETRIES
from lmclab.core.spec import PermutationSpec
from lmclab.trace import Traced
from lmclab.trace.untie import untied_trace


def symmetric_forms(
    *ckpts: Checkpoint, symmetry: str, example_inputs: Tensor | None
) -> tuple[tuple[Checkpoint, ...], PermutationSpec, dict[str, Any]]:
    """``(forms, spec, points)``: the checkpoints (of one architecture) as a search of ``symmetry`` sees them (the
    module docstring), the spec it acts by and the activation points of its groups; ``example_inputs`` (a batch
    of the model's inputs; unused for ``"permutation"``) to trace the orthogonal form on, once: the others take
    the first's untying and spec."""
    if symmetry not in SYMMETRIES:
        raise ValueError(f"symmetry: expected one of {SYMMETRIES}, got {symmetry!r}")
    if symmetry == "permutation":
        arch = get_arch(ckpts[0].arch)
        return ckpts, arch.permutation_spec(ckpts[0].config), arch.activation_points(ckpts[0].config)
    if example_inputs is None:
        raise ValueError("example_inputs: needed to trace the orthogonal form of the checkpoints")
    first, traced = canonical_checkpoint(ckpts[0], example_inputs)
    rest = (_folded(c, traced.spec, first.config) for c in ckpts[1:])
    return (first, *rest), traced.spec, dict(traced.points)


def canonical_checkpoint(ckpt: Checkpoint, example_inputs: Tensor) -> tuple[Checkpoint, Traced]:
    """``ckpt`` in its canonical form (the module docstring) and the trace of that form with
    ``symmetry="orthogonal"`` (spec with kinds, activation points); the checkpoint given is left as it was."""
    net = _built(ckpt)
    twin, traced = untied_trace(net, example_inputs)
    untied = [names for names in shared_parameters(net) if names not in shared_parameters(twin)]
    config = untied_config(ckpt.arch, ckpt.config, untied[0]) if untied else ckpt.config
    state = fold_gains(traced.spec, twin.state_dict(), ckpt.arch)
    return Checkpoint(ckpt.arch, config, ckpt.seed, state), traced


def _folded(ckpt: Checkpoint, spec: PermutationSpec, config: Any) -> Checkpoint:
    """``ckpt`` in the canonical form of another checkpoint of its architecture: the gains of ``spec`` folded into
    its state dict (where tied weights are separate entries, so the head takes the gain alone), with that form's
    ``config``."""
    return Checkpoint(ckpt.arch, config, ckpt.seed, fold_gains(spec, _built(ckpt).state_dict(), ckpt.arch))


def _built(ckpt: Checkpoint) -> Any:
    """The module of ``ckpt`` with its weights, in their own dtype."""
    floats = {v.dtype for v in ckpt.state_dict.values() if v.is_floating_point()}
    net = build_model(ckpt.arch, ckpt.config).to(floats.pop() if len(floats) == 1 else None)
    net.load_state_dict(ckpt.state_dict)
    return net


def untied_config(arch: str, config: Any, names: tuple[str, ...]) -> Any:
    """``config`` with its head untied from the embeddings (``tie_embeddings: false``), for the tensors ``names``
    that a gain folds into; one line naming them when the architecture's config cannot say so."""
    if "tie_embeddings" not in type(config).model_fields:
        raise ValueError(
            f"{arch}: {' and '.join(names)} are one tensor a gain folds into; its config cannot untie them"
        )
    return config.model_copy(update={"tie_embeddings": False})
