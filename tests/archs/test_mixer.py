"""MLP-Mixer: its hand-written spec (one stream group across blocks, token- and channel-hidden
groups, the token axis never permuted), weight and activation matching recovering a permuted copy, and
the same spec derived by tracing (a Mixer's tensors are permuted on two axes at once)."""

from __future__ import annotations

import pytest
import torch

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.data import Split
from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.search.activation_matching import activation_matching
from lmclab.search.weight_matching import weight_matching
from lmclab.trace import trace

CONFIG = make_config(
    "mixer", input_shape=(1, 28, 28), num_classes=10, patch_size=7, hidden=16, token_mlp=8, channel_mlp=24, depth=2
)


def permuted_pair():
    model = build_model("mixer", CONFIG, seed=0)
    spec = get_arch("mixer").permutation_spec(CONFIG)
    params = model.state_dict()
    perm = random_permutation(spec.group_sizes(params), torch.Generator().manual_seed(1))
    return model, spec, params, apply_permutation(spec, perm, params)


def test_the_stream_is_shared_and_the_token_axis_is_never_permuted():
    spec = get_arch("mixer").permutation_spec(CONFIG)
    assert spec.group_sizes(build_model("mixer", CONFIG).state_dict()) == {
        "P_stream": 16,
        "P_token_0": 8,
        "P_channel_0": 24,
        "P_token_1": 8,
        "P_channel_1": 24,
    }
    assert spec.axes["blocks.0.token_fc1.weight"] == ("P_token_0", None)  # reads the 16 tokens, unpermuted
    assert spec.axes["blocks.1.token_fc2.bias"] == (None,)
    assert spec.axes["blocks.1.channel_fc2.weight"] == ("P_stream", "P_channel_1")
    assert spec.axes["embed.weight"][0] == spec.axes["head.weight"][1] == spec.axes["norm.weight"][0] == "P_stream"


def test_a_block_adds_the_token_mlp_then_the_channel_mlp_to_its_input():
    block = build_model("mixer", CONFIG, seed=0).blocks[0]
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(0))  # (batch, tokens, hidden)

    def mlp(fc1, fc2, v):
        return fc2.bias + torch.nn.functional.gelu(v @ fc1.weight.T + fc1.bias) @ fc2.weight.T

    with torch.no_grad():
        u = x + mlp(block.token_fc1, block.token_fc2, block.norm1(x).transpose(1, 2)).transpose(1, 2)
        expected = u + mlp(block.channel_fc1, block.channel_fc2, block.norm2(u))
        assert torch.allclose(block(x), expected, atol=1e-6)


def test_weight_matching_recovers_a_permuted_mixer():
    _, spec, params, permuted = permuted_pair()
    back = apply_permutation(spec, weight_matching(spec, params, permuted).perm, permuted)
    assert all(torch.equal(back[k], v) for k, v in params.items())


def test_activation_matching_reads_units_on_the_last_axis():
    model, spec, params, permuted = permuted_pair()
    data = Split(
        torch.randn(200, 1, 28, 28, generator=torch.Generator().manual_seed(2)), torch.zeros(200, dtype=torch.long)
    )
    found = activation_matching(
        spec, params, permuted, model=model, points=get_arch("mixer").activation_points(CONFIG), data=data
    )
    back = apply_permutation(spec, found.perm, permuted)
    assert all(torch.allclose(back[k], v) for k, v in params.items())


def test_the_traced_spec_and_points_match_the_hand_written_ones():
    """Tracing follows the channels through the transposes (two permuted axes at once: the stream and the
    token-hidden units), the token MLP over the unpermuted token axis and the mean over tokens; its
    activation points (units on the last axis) recover a permuted Mixer like the hand-written ones."""
    model, spec, params, permuted = permuted_pair()
    traced = trace(model, torch.zeros(2, 1, 28, 28))
    names = {
        traced.spec.axes[f"blocks.{k}.{layer}.weight"][0]: f"P_{kind}_{k}"
        for k in range(2)
        for layer, kind in (("token_fc1", "token"), ("channel_fc1", "channel"))
    }
    names[traced.spec.axes["embed.weight"][0]] = "P_stream"
    assert {k: tuple(names.get(g) for g in axes) for k, axes in traced.spec.axes.items()} == spec.axes
    assert traced.points[traced.spec.axes["blocks.1.token_fc1.weight"][0]] == ["blocks.1.token_fc1@-1"]
    data = Split(
        torch.randn(200, 1, 28, 28, generator=torch.Generator().manual_seed(2)), torch.zeros(200, dtype=torch.long)
    )
    found = activation_matching(traced.spec, params, permuted, model=model, points=traced.points, data=data)
    back = apply_permutation(traced.spec, found.perm, permuted)
    assert all(torch.allclose(back[k], v) for k, v in params.items())


def test_validate_checks_the_patches_against_the_data_sets_own_image(tmp_path):
    import copy

    from dvc_repo import TINY, deep_update

    from lmclab.pipeline.validate import ParamsError, check_params

    digits = deep_update(copy.deepcopy(TINY), {"model": {"arch": "mixer"}})
    check_params(digits)  # 7-pixel patches tile a 28-pixel digit
    with pytest.raises(ParamsError, match=r"model.mixer.patch_size: 7 does not divide the image 32 × 32"):
        check_params(deep_update(digits, {"data": {"name": "cifar10"}}))
