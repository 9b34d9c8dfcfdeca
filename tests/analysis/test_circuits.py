"""The barrier in circuit space (lmclab.analysis.circuits): the wide model computes θa and θb at its ends, holds
the interpolated QKᵀ and OV circuits of every head (with and without grouped queries, at λ ≠ ½), is blind to the
maps inside heads that move the parameter-space midpoint, and is refused in one line where no wide model exists."""

from __future__ import annotations

import math

import pytest
import torch
from test_validate import _params
from torch.func import functional_call

from lmclab.analysis.circuits import circuit_barrier, circuit_params
from lmclab.analysis.pair import MeasureSettings, measure_method, prepare_pair
from lmclab.archs import circuit_model, gpt, make_config, vit
from lmclab.archs.checkpoint import Checkpoint
from lmclab.core.data import Split
from lmclab.core.heads import headed_matrix
from lmclab.core.merge import lerp_params
from lmclab.core.orthogonal import random_orthogonal
from lmclab.core.spec import apply_permutation, identity_permutation
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.trace import trace_spec

VOCAB, CONTEXT = 13, 8
X = torch.randint(0, VOCAB, (6, CONTEXT), generator=torch.Generator().manual_seed(1))
DATA = Split(X, torch.roll(X, -1, dims=1))


def _pair(**options) -> tuple[gpt.Config, dict, dict]:
    shapes = dict(width=16, depth=2, heads=4, norm="rmsnorm", tie_embeddings=False) | options
    config = gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, **shapes)
    params = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = gpt.Model(config).double()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.4)
        params.append(model.state_dict())
    return config, *params


def _logits(config: gpt.Config, params: dict, wide: bool = False) -> torch.Tensor:
    model = (circuit_model("gpt", config) if wide else gpt.Model(config)).double().eval()
    with torch.no_grad():
        return functional_call(model, params, (X,))


def _per_head(w: torch.Tensor, d: int) -> list[torch.Tensor]:
    return list(w.unflatten(0, (-1, d)))


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["heads", "grouped-queries"])
def test_the_wide_model_computes_the_ends_and_holds_each_head_s_interpolated_circuits(kv_heads) -> None:
    config, a, b = _pair(kv_heads=kv_heads)
    spec = trace_spec(gpt.Model(config), X, symmetry="orthogonal")  # each head's features as units
    for lam, end in ((1.0, a), (0.0, b)):
        torch.testing.assert_close(_logits(config, circuit_params(spec, a, b, lam), wide=True), _logits(config, end))
    lam, d, n = 0.3, config.head_size, config.heads // config.groups
    wide = circuit_params(spec, a, b, lam)
    at = "blocks.1.attn"
    q, k, v, o = (wide[f"{at}.{p}.weight"] for p in ("q", "k", "v", "out"))
    for h in range(config.heads):
        g = h // n  # the key/value head query head h reads
        qk = _per_head(q, 2 * d)[h].T @ _per_head(k, 2 * d)[g] / math.sqrt(2)  # the wide head's 1/√(2d), as 1/√d
        ov = o.T.unflatten(0, (-1, 2 * d))[h].T @ _per_head(v, 2 * d)[g]
        ends = [
            (_per_head(m[f"{at}.q.weight"], d)[h].T @ _per_head(m[f"{at}.k.weight"], d)[g],
             m[f"{at}.out.weight"].T.unflatten(0, (-1, d))[h].T @ _per_head(m[f"{at}.v.weight"], d)[g])
            for m in (a, b)
        ]  # fmt: skip
        torch.testing.assert_close(qk, lam * ends[0][0] + (1 - lam) * ends[1][0])
        torch.testing.assert_close(ov, lam * ends[0][1] + (1 - lam) * ends[1][1])


def test_maps_inside_heads_move_the_midpoint_but_not_the_circuit_space_midpoint() -> None:
    """θb = θa with every head turned inside (queries and keys by one R_h, values by another): the parameter-space
    midpoint changes the function, the circuit-space midpoint is θa's and its barrier 0."""
    config, a, _ = _pair()
    spec, gen = trace_spec(gpt.Model(config), X, symmetry="orthogonal"), torch.Generator().manual_seed(4)
    element = identity_permutation(spec.group_sizes(a))
    with pytest.raises(ValueError, match=r"^spec: group 'P_q_0' moves whole heads; circuits need each head's "):
        grouped, params, _ = _pair(kv_heads=2)
        circuit_params(gpt.permutation_spec(grouped), params, params, 0.5)
    for group, heads in spec.heads.items():
        turns = torch.stack([random_orthogonal(config.head_size, gen) for _ in range(heads.count)])
        element[group] = headed_matrix(torch.arange(heads.count), turns)
    b = apply_permutation(spec, element, a)
    assert float((_logits(config, lerp_params(a, b, 0.5)) - _logits(config, a)).abs().max()) > 1e-2
    torch.testing.assert_close(_logits(config, circuit_params(spec, a, b, 0.5), wide=True), _logits(config, a))
    found = circuit_barrier(spec, circuit_model("gpt", config).double(), a, b, DATA)
    assert found["test_loss_barrier_mid_circuits"] == pytest.approx(0.0, abs=1e-5)  # float32 logits


def test_measure_method_adds_the_circuit_barrier_when_asked() -> None:
    config, a, b = _pair(position="learned")
    config = config.model_copy(update={"tie_embeddings": False})
    a, b = ({k: v.float() for k, v in p.items()} for p in (a, b))
    ckpts = (Checkpoint("gpt", config, 0, a), Checkpoint("gpt", config, 1, b))
    midpoint = Checkpoint("gpt", config, None, lerp_params(a, b, 0.5))
    summaries = [
        measure_method(
            prepare_pair(*ckpts, {"train": DATA, "test": DATA}, MeasureSettings(num_lambdas=3, circuits=c)),
            ckpts[1],
            midpoint,
        )[1]
        for c in (False, True)
    ]
    assert "test_loss_barrier_mid_circuits" not in summaries[0]
    found = summaries[1]["test_loss_barrier_mid_circuits"]
    assert math.isfinite(found) and found != pytest.approx(summaries[1]["test_loss_barrier_mid"], abs=1e-3)


def test_a_model_without_heads_twice_as_wide_is_refused_in_one_line() -> None:
    mlp = make_config("mlp", input_shape=(1, 2, 2), num_classes=3, hidden=1, width=4)
    with pytest.raises(ValueError, match=r"^circuits: mlp has no model of heads twice as wide \(gpt with "):
        circuit_model("mlp", mlp)
    rotary = gpt.Config(input_shape=(CONTEXT,), num_classes=VOCAB, width=16, heads=4, position="rotary")
    with pytest.raises(ValueError, match=r"^circuits: rotary heads have no circuit-space model .*; use learned"):
        circuit_model("gpt", rotary)
    params = _params()
    params["measure"]["circuits"] = True
    with pytest.raises(ParamsError) as err:
        check_params(params)
    assert [line for line in err.value.lines if "circuits" in line] == [
        "measure.circuits: mlp has no model of heads twice as wide (gpt with learned positions and vit have)"
    ]


@pytest.mark.parametrize("head_dim", [None, 5], ids=["width-over-heads", "head-dim"])
def test_the_wide_vit_computes_the_ends_and_is_blind_to_maps_inside_its_heads(head_dim) -> None:
    """The project's ViT (LayerNorm, class token, heads of width/heads or of ``head_dim`` features): the wide
    model is θa and θb at λ = 1 and 0, and a θb that differs from θa by maps inside its heads has a circuit-space
    midpoint of θa's function while its parameter-space midpoint is another."""
    config = vit.Config(input_shape=(1, 8, 8), num_classes=5, patch_size=4, width=12, depth=2, heads=3)
    config = config.model_copy(update={"head_dim": head_dim})
    images = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a, b = ({k: v.double() for k, v in vit.Model(config).state_dict().items()} for _ in range(2))
    a = {
        k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(5), dtype=v.dtype)
        for k, v in a.items()
    }

    def logits(params, wide=False):
        model = (circuit_model("vit", config) if wide else vit.Model(config)).double().eval()
        with torch.no_grad():
            return functional_call(model, params, (images,))

    spec = trace_spec(vit.Model(config), images[:2].float(), symmetry="orthogonal")
    for lam, end in ((1.0, a), (0.0, b)):
        torch.testing.assert_close(logits(circuit_params(spec, a, b, lam), wide=True), logits(end))
    element, gen = identity_permutation(spec.group_sizes(a)), torch.Generator().manual_seed(4)
    for group, heads in spec.heads.items():
        turns = torch.stack([random_orthogonal(config.head_size, gen) for _ in range(heads.count)])
        element[group] = headed_matrix(torch.arange(heads.count), turns)
    turned = apply_permutation(spec, element, a)
    torch.testing.assert_close(logits(turned), logits(a))  # a symmetry
    assert float((logits(lerp_params(a, turned, 0.5)) - logits(a)).abs().max()) > 1e-2
    torch.testing.assert_close(logits(circuit_params(spec, a, turned, 0.5), wide=True), logits(a))
