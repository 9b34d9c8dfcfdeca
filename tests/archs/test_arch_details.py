"""Details of the hand-written architectures a wrong line would change without breaking invariance:
images padded to the VGG's 32 × 32 from their centre, ResNet20's downsampling stages, a traced model
repeating grey inputs into its colour channels and keeping the num_classes its kwargs set, ResNet50's
stream names, checkpoints written on a GPU loading onto the CPU, ResNet50 as torchvision's with its
one-channel stem, and the one-line refusals of patches and checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmclab.archs import build_model, get_arch, make_config
from lmclab.archs.base import check_patches_tile
from lmclab.archs.checkpoint import FORMAT, CheckpointError, atomic_save, load_checkpoint
from lmclab.archs.masking import patchify
from lmclab.core.options import OptionError


def test_vgg_pads_a_28_pixel_image_to_32_from_its_centre():
    model = build_model("vgg", make_config("vgg", input_shape=(1, 28, 28), num_classes=10, width_multiplier=0.25))
    seen = []
    model.features[0].register_forward_hook(lambda m, args, out: seen.append(args[0]))
    model.eval()(torch.ones(2, 1, 28, 28))
    (padded,) = seen
    assert padded.shape == (2, 1, 32, 32)
    assert padded[0, 0, 2:30, 2:30].eq(1).all() and padded.sum() == 2 * 28 * 28  # 2 zero rows/columns each side


def test_resnet20_halves_the_resolution_at_the_first_block_of_stages_two_and_three():
    model = build_model("resnet20", make_config("resnet20", input_shape=(3, 32, 32), num_classes=10))
    sizes = []
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (3, 3):
            module.register_forward_hook(lambda m, args, out: sizes.append(out.shape[-1]))
    model.eval()(torch.zeros(1, 3, 32, 32))
    assert sorted(set(sizes)) == [8, 16, 32] and sizes[-1] == 8


def test_a_traced_colour_model_reads_grey_images_as_repeated_channels():
    config = make_config(
        "traced", input_shape=(1, 28, 28), num_classes=10, factory="torchvision.models:resnet18", in_channels=3
    )
    model = build_model("traced", config).eval()
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(model(x), model.net(x.repeat(1, 3, 1, 1))) and model(x).shape == (2, 10)


def linear_head(num_classes: int = 7) -> nn.Module:  # a traced factory taking num_classes
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, num_classes))


def test_a_traced_factory_s_own_num_classes_in_its_kwargs_is_kept():
    """``num_classes`` is added to a factory's kwargs only where they do not set it: the head they ask for stays."""
    fields = {"input_shape": (3, 4, 4), "num_classes": 10, "factory": "test_arch_details:linear_head"}
    given = build_model("traced", make_config("traced", **fields, kwargs={"num_classes": 4}))
    added = build_model("traced", make_config("traced", **fields))
    assert (given(torch.zeros(2, 3, 4, 4)).shape, added(torch.zeros(2, 3, 4, 4)).shape) == ((2, 4), (2, 10))


def test_patches_that_do_not_tile_the_image_are_refused_on_either_side():
    for shape in ((1, 30, 28), (1, 28, 30)):
        with pytest.raises(OptionError, match=f"does not divide the image {shape[1]} × {shape[2]}"):
            check_patches_tile(shape, 7)
        with pytest.raises(ValueError, match=rf"^patch_size: 7 does not divide the image {shape[1]} × {shape[2]}$"):
            patchify(torch.zeros(1, *shape), 7)
    check_patches_tile((3, 28, 14), 7)


def test_an_unreadable_checkpoint_is_worded_from_its_exception(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    path.write_bytes(b"x")

    def load(*args, **kwargs):
        raise RuntimeError("boom at byte 1\nsecond line")

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value).endswith("boom at byte 1)") and "\n" not in str(err.value)


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(tmp_path, monkeypatch):
    config = make_config("mlp", input_shape=[1, 4, 4], num_classes=3, hidden=1, width=2)
    state = build_model("mlp", config, seed=0).state_dict()
    blob = {"format": FORMAT, "arch": "mlp", "config": config.model_dump(), "seed": 0, "state_dict": state}
    with monkeypatch.context() as patch:  # tag every storage as torch.save does for CUDA tensors
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        atomic_save(blob, tmp_path / "gpu.pt")
    loaded = load_checkpoint(tmp_path / "gpu.pt").state_dict
    assert all(v.device.type == "cpu" and torch.equal(v, state[k]) for k, v in loaded.items())


def test_resnet50_names_its_streams_after_the_stem_and_the_four_stages():
    spec = get_arch("resnet50").permutation_spec(make_config("resnet50", input_shape=(3, 32, 32), num_classes=10))
    streams = {group for group in spec.groups if "_block" not in group}
    assert streams == {"P_stem", "P_stage1", "P_stage2", "P_stage3", "P_stage4"}
    assert spec.axes["net.layer1.0.conv1.weight"][:2] == ("P_stage1_block0_1", "P_stem")
    assert spec.axes["net.fc.weight"] == (None, "P_stage4")


def test_resnet50_is_torchvisions_and_reads_one_channel_through_a_stem_of_the_same_stride_and_padding():
    """Three channels: torchvision's resnet50 itself, drawn from one seed weight by weight. One channel: the stem
    conv alone is new (7 × 7, stride 2, padding 3), so the grey net gives the logits of a colour net whose stem
    reads the first channel and ignores the other two."""
    from torchvision.models import resnet50

    colour_config = make_config("resnet50", input_shape=(3, 32, 32), num_classes=10, width_multiplier=0.25)
    colour = build_model("resnet50", colour_config, seed=0).eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        reference = resnet50(weights=None, num_classes=10, width_per_group=16).state_dict()
    assert list(colour.net.state_dict()) == list(reference)
    assert all(torch.equal(v, reference[k]) for k, v in colour.net.state_dict().items())
    grey_config = make_config("resnet50", input_shape=(1, 32, 32), num_classes=10, width_multiplier=0.25)
    grey = build_model("resnet50", grey_config, seed=1).eval()
    state = grey.state_dict()
    stem = state["net.conv1.weight"]  # (64, 1, 7, 7)
    colour.load_state_dict(state | {"net.conv1.weight": torch.cat([stem, torch.zeros(64, 2, 7, 7)], 1)})
    x = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(2, 2, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(grey(x), colour(torch.cat([x, noise], 1)), rtol=1e-5, atol=1e-6)
