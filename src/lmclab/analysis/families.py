"""Where a barrier is: the barrier of the path that moves one family of layers alone, and of the path that moves
every family but one.

A family is a layer's name with its block indices replaced by ``*`` (:func:`layer_family`), so that
``blocks.*.attn.q.weight`` is the queries of every block; :func:`parameter_families` groups a model's floating
parameters by their module's family (weight and bias together). For a family ``F`` and the paper's path
``θ(λ) = λ θa + (1 − λ) π(θb)`` (Eq. 1):

- *alone*: ``θ_F(λ)`` is θa outside ``F`` and ``θ(λ)`` inside (Adilova et al. 2024, *Layer-wise Linear Mode
  Connectivity*); its barrier ``L(θ_F(λ)) − [λ L(θa) + (1 − λ) L(θ_F(0))]`` is the part of the loss the family's
  own interpolation raises, other layers held;
- *all but*: ``θ_¬F(λ)`` is ``θ(λ)`` outside ``F`` and θa inside; ``L(θ_¬F(λ)) − [λ L(θa) + (1 − λ) L(π(θb))]``,
  measured against the pair's own ends (the path's other end, π(θb) with θa's ``F``, may be no model at all), is
  what is left of the whole barrier once ``F`` stops moving, so the whole barrier minus it is the family's share
  in the company of the others.

A family whose entries θa and π(θb) share (norm gains folded to 1, buffers) moves nowhere and has no row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from lmclab.analysis.layer_names import layer_family
from lmclab.core.canonical import shared_parameters
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import lerp_params


def parameter_families(params: Mapping[str, Tensor], tied: Sequence[Sequence[str]] = ()) -> dict[str, list[str]]:
    """``params``' floating entries by family, in order of first appearance: the family of an entry is its
    module's (``blocks.2.fc1.bias`` → ``blocks.*.fc1``; a top-level entry is its own family). The families of
    the names of each set in ``tied`` (one parameter under several names: a head tied to the embeddings) move
    together, as one family named ``a + b``."""
    family = {name: layer_family(name.rsplit(".", 1)[0]) for name, v in params.items() if v.is_floating_point()}
    for names in tied:
        joined = " + ".join(dict.fromkeys(family[n] for n in names if n in family))
        family = {n: joined if f in joined.split(" + ") else f for n, f in family.items()}
    families: dict[str, list[str]] = {}
    for name, f in family.items():
        families.setdefault(f, []).append(name)
    return families


def family_barriers(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    split: Split,
    *,
    lam: float = 0.5,
) -> list[dict]:
    """The loss barriers at ``lam`` on ``split`` of the paths that move one family alone and every family but one
    (module docstring), one row ``{family, alone, all_but}`` per family that moves, after a first row ``family:
    "(all)"`` with the whole path's barrier in both columns. ``params_a`` and ``permuted_b`` (aligned to θa) have
    the same entries; no repair (the plain curve's losses). Names ``model`` ties move together."""
    if not 0.0 < lam < 1.0:
        raise ValueError(f"lam: expected a merge weight strictly between 0 and 1, got {lam}")
    if params_a.keys() != permuted_b.keys():
        raise ValueError("permuted_b: expected the entries of params_a")
    mid, loss = lerp_params(params_a, permuted_b, lam), lambda params: evaluate(model, params, split).loss
    loss_a, loss_b = loss(params_a), loss(permuted_b)
    whole = loss(mid) - (lam * loss_a + (1 - lam) * loss_b)
    rows = [{"family": "(all)", "alone": whole, "all_but": whole}]
    for family, names in parameter_families(params_a, shared_parameters(model)).items():
        if all(torch.equal(params_a[n], permuted_b[n]) for n in names):
            continue  # moves nowhere
        end = loss({**params_a, **{n: permuted_b[n] for n in names}})  # θa with π(θb)'s F
        alone = loss({**params_a, **{n: mid[n] for n in names}}) - (lam * loss_a + (1 - lam) * end)
        all_but = loss({**mid, **{n: params_a[n] for n in names}}) - (lam * loss_a + (1 - lam) * loss_b)
        rows.append({"family": family, "alone": alone, "all_but": all_but})
    return rows
