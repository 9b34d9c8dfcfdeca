"""R_γ pooled over parts of a model (lmclab.studies.layer_alignment): layer families, a decoder's roles, the pooled
ratio's closed form, and pooling every layer of a measured pair giving back the model's R_γ."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from lmclab.analysis.alignment import layer_names
from lmclab.analysis.compose import Analysis, Endpoints, analyze_pair, r_key
from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import lambda_grid
from lmclab.core.spec import random_permutation
from lmclab.report.language import family_section
from lmclab.studies.layer_alignment import gpt_role, layer_family, part_table, pooled_alignment


@pytest.mark.parametrize(
    ("layer", "family"),
    [
        ("layers.0.weight", "layers.*.weight"),
        ("blocks.12.attn.q.weight", "blocks.*.attn.q.weight"),
        ("net.10.0.weight", "net.*.*.weight"),
        ("0.weight", "*.weight"),
        ("fc1.weight", "fc1.weight"),
        ("stage2.block1.conv3x3.weight", "stage2.block1.conv3x3.weight"),
        ("head.weight", "head.weight"),
    ],
)
def test_a_layer_family_replaces_whole_block_indices(layer, family) -> None:
    assert layer_family(layer) == family


def gpt_layers(**options) -> list[str]:
    config = make_config("gpt", input_shape=(8,), num_classes=32, width=8, depth=2, heads=2, **options)
    params = dict(build_model("gpt", config, seed=0).state_dict())
    return layer_names(get_arch("gpt").permutation_spec(config), params)


@pytest.mark.parametrize("options", [{}, {"mlp": "swiglu", "position": "rotary", "tie_embeddings": False}])
def test_every_layer_of_a_gpt_has_its_role(options) -> None:
    roles = {layer: gpt_role(layer) for layer in gpt_layers(**options)}
    attention = [n for n, r in roles.items() if r == "attention"]
    mlp = [n for n, r in roles.items() if r == "MLP"]
    stream = [n for n, r in roles.items() if r == "stream"]
    assert sorted(attention) == sorted(f"blocks.{k}.attn.{p}.weight" for k in (0, 1) for p in ("q", "k", "v", "out"))
    parts = ("gate", "fc1", "fc2") if options else ("fc1", "fc2")
    assert sorted(mlp) == sorted(f"blocks.{k}.{p}.weight" for k in (0, 1) for p in parts)
    assert set(stream) == ({"embed.weight", "head.weight"} | ({"pos_embed.weight"} if not options else set()))


def rows(pair: str, method: str, shares: dict[str, tuple[float, int]], gamma: float = 0.3) -> list[dict]:
    return [
        {
            "pair": pair,
            "method": method,
            "layer": layer,
            "gamma": gamma,
            "numerator": n,
            "kept": k,
            "R": n / k if k else math.nan,
        }
        for layer, (n, k) in shares.items()
    ]


def test_the_pooled_ratio_sums_numerators_and_counts_per_part() -> None:
    """Pair p: blocks 0 and 1 of fc give (3 + 1) / (4 + 4) = 0.5; the head keeps nothing: NaN. Pair q: fc
    (2 + 2) / (4 + 4) = 0.5 → mean 0.5, std 0; a row at another γ is left out."""
    frame = pd.DataFrame(
        rows("p", "wm", {"blocks.0.fc.weight": (3.0, 4), "blocks.1.fc.weight": (1.0, 4), "head.weight": (0.0, 0)})
        + rows("q", "wm", {"blocks.0.fc.weight": (2.0, 4), "blocks.1.fc.weight": (2.0, 4), "head.weight": (1.0, 2)})
        + rows("q", "wm", {"blocks.0.fc.weight": (9.0, 1)}, gamma=0.0)
    )
    pooled = pooled_alignment(frame, 0.3).set_index(["pair", "part"])
    assert pooled.loc[("p", "blocks.*.fc.weight"), "R"] == 0.5 and pooled.loc[("p", "blocks.*.fc.weight"), "kept"] == 8
    assert math.isnan(pooled.loc[("p", "head.weight"), "R"]) and pooled.loc[("q", "head.weight"), "R"] == 0.5
    table = part_table(frame, 0.3).set_index("part")
    assert (table.loc["blocks.*.fc.weight", "mean"], table.loc["blocks.*.fc.weight", "std"]) == (0.5, 0.0)
    assert table.loc["head.weight", "mean"] == 0.5 and table.loc["head.weight", "pairs"] == 1  # NaN not counted
    everything = pooled_alignment(frame, 0.3, group=lambda _: "all").set_index("pair")["R"]
    assert everything.to_dict() == {"p": 4.0 / 8, "q": 5.0 / 10}
    with pytest.raises(ValueError, match=r"^gamma: no per-layer R at γ = 0.5 \(measured: \[0.0, 0.3\]\)$"):
        pooled_alignment(frame, 0.5)
    section = family_section(frame.assign(method="wm"), ["wm"])
    assert "| `blocks.*.fc.weight` | 0.500 ± 0.000 |" in section and "| `head.weight` | 0.500 ± 0.000 |" in section
    assert family_section(pd.DataFrame(), ["wm"]) == "" and family_section(None, ["wm"]) == ""


@pytest.mark.parametrize("gamma", [0.0, 0.3])
def test_pooling_every_layer_of_a_measured_gpt_pair_gives_the_models_r(gamma) -> None:
    config = make_config("gpt", input_shape=(8,), num_classes=32, width=8, depth=2, heads=2)
    model = build_model("gpt", config, seed=0)
    spec = get_arch("gpt").permutation_spec(config)
    params_a, params_b = (dict(build_model("gpt", config, seed=s).state_dict()) for s in (0, 1))
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(3))
    permuted_b, midpoint = aligned_midpoint(spec, params_a, params_b, perm)
    tokens = torch.randint(0, 32, (6, 9), generator=torch.Generator().manual_seed(4))
    splits = {"test": Split(x=tokens[:, :-1], y=tokens[:, 1:])}
    how = Analysis(lams=lambda_grid(3), gammas=[gamma], input_shape=(8,))
    summary, tables = analyze_pair(Endpoints(spec, model, params_a, params_b, splits), permuted_b, midpoint, how)
    frame = pd.DataFrame(tables["alignment"]).assign(pair="p", method="m")
    by_role = pooled_alignment(frame, gamma, group=gpt_role)
    assert set(by_role["part"]) == {"stream", "attention", "MLP"}
    whole = pooled_alignment(frame, gamma, group=lambda _: "all")["R"].item()
    assert whole == pytest.approx(summary[r_key(gamma)], abs=1e-12)
    assert (by_role["numerator"].sum(), by_role["kept"].sum()) == pytest.approx(
        (frame["numerator"].sum(), frame["kept"].sum())
    )


def test_parts_keep_the_order_they_are_met_in_and_one_kept_triplet_counts() -> None:
    frame = pd.DataFrame(
        rows("q", "wm", {"head.weight": (0.5, 1), "blocks.0.fc.weight": (1.0, 2)})
        + rows("p", "wm", {"head.weight": (-1.0, 1), "blocks.0.fc.weight": (2.0, 2)})
    )
    pooled = pooled_alignment(frame, 0.3)
    assert list(zip(pooled["pair"], pooled["part"], pooled["R"], strict=True)) == [
        ("q", "head.weight", 0.5),
        ("q", "blocks.*.fc.weight", 0.5),
        ("p", "head.weight", -1.0),
        ("p", "blocks.*.fc.weight", 1.0),
    ]
    assert part_table(frame, 0.3)["part"].tolist() == ["head.weight", "blocks.*.fc.weight"]
