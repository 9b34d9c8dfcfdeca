"""Refusals of the architectures that the rest of the suite does not reach: checkpoints whose config or
tensors their architecture refuses, the configs of VGG, the ViT, the MAE and traced models that cannot
be built, and masks or patches of the wrong shape. Each is one line naming what it is about, and the
nearest input on the accepted side of its bound passes."""

from __future__ import annotations

import re

import pytest
import torch

from lmclab.archs import build_model, make_config, vit
from lmclab.archs.checkpoint import FORMAT, Checkpoint, atomic_save, load_checkpoint, save_checkpoint
from lmclab.archs.masking import patchify, unpatchify, visible_indices
from lmclab.core.options import OptionError

MLP = {"input_shape": [1, 4, 4], "num_classes": 3, "hidden": 1, "width": 2}
MAE = {"input_shape": (1, 28, 28), "patch_size": 7, "width": 16, "heads": 4, "depth": 1, "decoder_depth": 1}


def _blob(config: dict, state: dict) -> dict:
    """What :func:`save_checkpoint` writes, with any config and tensors."""
    return {"format": FORMAT, "arch": "mlp", "config": config, "seed": 3, "state_dict": state}


def test_a_checkpoint_whose_config_its_architecture_refuses_names_the_file_and_the_option(tmp_path):
    good = build_model("mlp", make_config("mlp", **MLP), seed=3).state_dict()
    path = tmp_path / "bad.pt"
    atomic_save(_blob({**MLP, "width": 0}, good), path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: width must be a positive integer, got 0$"):
        load_checkpoint(path)
    atomic_save(_blob({**MLP, "width": 2}, good), path)  # the smallest accepted width
    loaded = load_checkpoint(path)
    assert loaded.config == make_config("mlp", **MLP) and loaded.seed == 3
    assert all(torch.equal(loaded.state_dict[k], v) for k, v in good.items())


def test_a_checkpoint_whose_tensors_do_not_fit_its_spec_names_the_file_and_the_missing_key(tmp_path):
    config = make_config("mlp", **MLP)
    state = build_model("mlp", config, seed=1).state_dict()
    path = tmp_path / "short.pt"
    save_checkpoint(path, Checkpoint("mlp", config, 1, {k: v for k, v in state.items() if k != "out.bias"}))
    message = f"{path}: keys do not match the permutation spec (missing ['out.bias'], unexpected [])"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_checkpoint(path)
    save_checkpoint(path, Checkpoint("mlp", config, 1, state))
    assert set(load_checkpoint(path).state_dict) == set(state)


def test_vgg_needs_a_channel_count_and_images_of_28_to_32_pixels():
    with pytest.raises(OptionError, match=r"^layers: expected at least one channel count, got \['M'\]$"):
        make_config("vgg", input_shape=(3, 32, 32), num_classes=10, layers=["M"])
    with pytest.raises(
        OptionError, match=r"^layers must be a non-empty list of a positive integer or one of \['M'\], got \(\)$"
    ):
        make_config("vgg", input_shape=(3, 32, 32), num_classes=10, layers=[])
    assert make_config("vgg", input_shape=(3, 32, 32), num_classes=10, layers=[8, "M"]).channels() == [8]
    refusal = r"^input_shape: vgg takes images of 28 to 32 pixels a side \(padded to 32\), got "
    for shape in ((3, 27, 28), (3, 28, 33), (1, 33, 32), (1, 32, 27)):
        with pytest.raises(OptionError, match=refusal + re.escape(repr(shape)) + "$"):
            make_config("vgg", input_shape=shape, num_classes=10, layers=[8, "M"])
    for shape in ((3, 28, 32), (1, 32, 28), (1, 30, 29)):  # both ends of the accepted sizes and between
        config = make_config("vgg", input_shape=shape, num_classes=10, layers=[8, "M"])
        assert build_model("vgg", config, seed=0).eval()(torch.zeros(2, *shape)).shape == (2, 10)


def test_a_vit_needs_heads_dividing_its_width_and_a_multiple_of_4_for_sin_cos_positions():
    digits = {"input_shape": (1, 28, 28), "num_classes": 10, "patch_size": 7}
    with pytest.raises(OptionError, match=r"^heads: 4 heads do not divide the width 18$"):
        make_config("vit", **digits, width=18, heads=4)
    with pytest.raises(OptionError, match=r"^width: a sin-cos position embedding needs a multiple of 4, got 18$"):
        make_config("vit", **digits, width=18, heads=3, position="sincos")
    assert make_config("vit", **digits, width=18, heads=3, position="learned").width == 18
    assert make_config("vit", **digits, width=20, heads=4, position="sincos").width == 20


def test_a_sin_cos_table_has_maes_frequencies_and_needs_a_width_of_a_multiple_of_4():
    with pytest.raises(OptionError, match=r"^width: a sin-cos position embedding needs a multiple of 4, got 18$"):
        vit.sincos_table(18, (2, 3), cls=True)
    table = vit.sincos_table(8, (2, 3), cls=True)
    rows, cols = torch.tensor([0.0, 0, 0, 1, 1, 1]), torch.tensor([0.0, 1, 2, 0, 1, 2])  # the 2 × 3 grid, row-major
    assert table.shape == (1, 7, 8) and not table[0, 0].any()  # the class token's row is zero
    assert torch.allclose(table[0, 1:, 0], rows.sin()) and torch.allclose(table[0, 1:, 4], cols.sin())
    slow = 1 / 10000 ** (1 / 2)  # MAE's second frequency of width/4 = 2: 10000^(−1/2)
    for column, wave in ((1, (rows * slow).sin()), (3, (rows * slow).cos()), (7, (cols * slow).cos())):
        torch.testing.assert_close(table[0, 1:, column], wave, rtol=0, atol=1e-7)


def test_an_mae_decoder_with_sin_cos_positions_needs_a_width_of_a_multiple_of_4():
    with pytest.raises(OptionError, match=r"^decoder_width: a sin-cos position table needs a multiple of 4, got 6$"):
        make_config("mae", **MAE, decoder_width=6, decoder_heads=2)
    assert make_config("mae", **MAE, decoder_width=6, decoder_heads=2, position="learned").decoder.width == 6
    assert make_config("mae", **MAE, decoder_width=8, decoder_heads=2).decoder.width == 8


def test_an_mae_predicts_from_a_bool_mask_of_one_row_per_image_and_one_column_per_patch():
    model = build_model("mae", make_config("mae", **MAE, decoder_width=8, decoder_heads=2), seed=0).eval()
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for shape in ((2, 15), (3, 16)):
        with pytest.raises(ValueError, match=rf"^mask: shape \({shape[0]}, {shape[1]}\), expected \(2, 16\)$"):
            model.predict(x, torch.zeros(shape, dtype=torch.bool))
    mask = model.default_mask(2)
    with pytest.raises(
        ValueError, match=r"^mask: expected a bool tensor \(n, patches\), got torch.int64 of shape \(2, 16\)$"
    ):
        model.predict(x, mask.long())
    with torch.no_grad():
        assert torch.equal(model.predict(x, mask), model.predict(x))  # the default mask, passed or not
    assert model.predict(x, mask).shape == (2, 16, 49)


def test_visible_indices_need_a_two_axis_bool_mask():
    with pytest.raises(
        ValueError, match=r"^mask: expected a bool tensor \(n, patches\), got torch.bool of shape \(4,\)$"
    ):
        visible_indices(torch.tensor([True, False, False, True]))
    mask = torch.tensor([[True, False, False, True], [False, True, True, False]])
    assert visible_indices(mask).tolist() == [[1, 2], [0, 3]]


def test_unpatchify_needs_the_patches_of_the_image_it_is_given():
    x = torch.randn(2, 3, 8, 12, generator=torch.Generator().manual_seed(1))
    patches = patchify(x, 4)  # (2, 6, 48)
    message = r"^patches: shape \(2, 6, 48\) is not that of \(3, 8, 8\) in 4-pixel patches$"
    with pytest.raises(ValueError, match=message):
        unpatchify(patches, 4, (3, 8, 8))  # 4 patches, not 6
    with pytest.raises(ValueError, match=r"^patches: shape \(2, 6, 48\) is not that of \(1, 8, 12\) in 4-pixel"):
        unpatchify(patches, 4, (1, 8, 12))
    assert torch.equal(unpatchify(patches, 4, (3, 8, 12)), x)


def test_traced_kwargs_are_a_mapping_or_pairs_never_a_list_of_strings():
    """A string of two characters unpacks as a pair: without the check ``['ab']`` would pass as ``{a: 'b'}``."""
    factory = {"input_shape": (3, 32, 32), "num_classes": 10, "factory": "torch.nn:Identity"}
    with pytest.raises(
        OptionError, match=r"^kwargs must be a mapping of names to numbers, strings, booleans or null, got \('ab',\)$"
    ):
        make_config("traced", **factory, kwargs=["ab"])
    with pytest.raises(
        OptionError, match=r"^kwargs must be a mapping of names to numbers, strings, booleans or null, got 5$"
    ):
        make_config("traced", **factory, kwargs=5)
    assert make_config("traced", **factory, kwargs={"b": 1, "a": [2, 3]}).kwargs == (("a", (2, 3)), ("b", 1))
    assert make_config("traced", **factory, kwargs=[["b", 1], ("a", None)]).kwargs == (("a", None), ("b", 1))
