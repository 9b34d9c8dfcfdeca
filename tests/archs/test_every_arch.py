"""Registry-parametrised checks of every architecture: spec keys, invariance of
the logits under a random permutation (eval mode, BN statistics permuted), inverse, activation
points, on 1-channel 28-pixel and 3-channel 32-pixel inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from lmclab.archs import ARCHS, build_model, get_arch, make_config
from lmclab.archs.base import interface
from lmclab.core.bn_repair import repair_bn
from lmclab.core.data import Split
from lmclab.core.objective import is_reconstruction
from lmclab.core.spec import apply_permutation, compose, invert, random_permutation

CASES = {
    "mlp": {"hidden": 2, "width": 16},
    "vgg-x0.25": {"width_multiplier": 0.25},
    "vgg13-x0.125": {
        "width_multiplier": 0.125,
        "layers": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    },
    "resnet20-x1": {"width_multiplier": 1},
    "resnet20-x2": {"width_multiplier": 2},
    "resnet50": {},
    "traced-resnet18": {"factory": "torchvision.models:resnet18", "in_channels": 3},  # spec by torch.fx tracing
    "traced-mobilenet_v2": {"factory": "torchvision.models:mobilenet_v2", "in_channels": 3},
    "mixer": {"patch_size": 4, "hidden": 16, "token_mlp": 8, "channel_mlp": 24, "depth": 2},  # LayerNorm, no BN
    "vit": {"patch_size": 4, "width": 16, "heads": 4, "depth": 2},  # headed groups (attention)
    "vit-mean-sincos": {"patch_size": 4, "width": 16, "heads": 2, "depth": 1, "pool": "mean", "position": "sincos"},
    "vit-head_dim": {"patch_size": 4, "width": 16, "heads": 3, "head_dim": 5, "depth": 1},  # 3 heads of 5 over 16
    # a masked autoencoder: forward(x) is its reconstruction loss on fixed masks (lmclab.core.objective)
    "mae": {"patch_size": 4, "width": 16, "heads": 2, "depth": 1, "decoder_width": 8, "decoder_heads": 2},
    "mae-head_dim": {"patch_size": 4, "width": 16, "heads": 3, "head_dim": 6, "depth": 1, "decoder_width": 8},
    # a language model: windows of 12 token ids (of 10) in, next-token logits (batch, 12, 10) out
    "gpt": {"width": 16, "depth": 2, "heads": 2, "mlp_ratio": 2},
}
CONTEXT = 12  # the language model's window, in place of an image shape
SLOW = ("resnet50", "traced-resnet18", "traced-mobilenet_v2")
SHAPES = [(1, 28, 28), (3, 32, 32)]


def _arch(case: str) -> str:
    return case.split("-")[0].replace("vgg13", "vgg")


def _shape(arch: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The input shape of ``arch``'s config: the image's, or a language model's window."""
    return (CONTEXT,) if interface(get_arch(arch)).INPUT == "tokens" else shape


def _inputs(shape: tuple[int, ...], n: int, generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """``n`` random images of ``shape``, or windows of token ids for a window shape ``(CONTEXT,)``."""
    if shape == (CONTEXT,):
        return torch.randint(0, 10, (n, CONTEXT), generator=generator)
    return torch.randn(n, *shape, generator=generator, dtype=dtype)


def _randomised(model: nn.Module, shape: tuple[int, ...], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Perturbed weights and BN running statistics of those weights on random inputs (distinct
    per channel, so their permutation matters; realistic, so deep nets keep logits of order 1)."""
    params = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator)
        if v.is_floating_point() and not k.endswith(("running_mean", "running_var"))
        else v
        for k, v in model.state_dict().items()
    }
    x = _inputs(shape, 16, generator)
    return repair_bn(model, params, Split(x, torch.zeros(16, dtype=torch.long)), batch_size=16)


def _double(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in params.items()}


def test_every_registered_architecture_is_covered():
    assert {_arch(c) for c in CASES} == set(ARCHS)


@pytest.mark.parametrize("shape", SHAPES, ids=["1x28", "3x32"])
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_spec_matches_state_dict_and_permutation_is_a_symmetry(case, shape):
    arch = _arch(case)
    shape = _shape(arch, shape)
    config = make_config(arch, input_shape=shape, num_classes=10, **CASES[case])
    model = build_model(arch, config, seed=0).eval()
    spec = get_arch(arch).permutation_spec(config)
    assert set(spec.axes) == set(model.state_dict())
    spec.check(model.state_dict())
    for name in spec.axes:
        if name.endswith(("running_mean", "running_var")):
            assert name in spec.stats and spec.axes[name][0] is not None  # permuted, not matched
        if name.endswith("num_batches_tracked"):
            assert name in spec.stats and spec.axes[name] == ()
    g = torch.Generator().manual_seed(1)
    params = _randomised(model, shape, g)
    perm = random_permutation(spec.group_sizes(params), g, spec.heads)
    permuted = apply_permutation(spec, perm, params)
    # float64: the symmetry is exact, so only rounding separates the two (ResNet50's 50 layers
    # amplify float32 rounding to ~1e-4 of logits of order 10)
    x = _inputs(shape, 3, g, torch.float64)
    model, params, permuted = model.double(), _double(params), _double(permuted)
    with torch.no_grad():
        logits, logits_perm = (functional_call(model, p, (x,), tie_weights=False) for p in (params, permuted))
    expected = () if is_reconstruction(model) else (3, *shape[:1], 10) if shape == (CONTEXT,) else (3, 10)
    assert logits.shape == expected and logits.abs().max() < 100
    assert torch.allclose(logits, logits_perm, atol=1e-4, rtol=1e-4)
    assert (
        any(not torch.equal(permuted[k], params[k]) for k in spec.stats if k.endswith("running_mean")) or not spec.stats
    )  # the BN statistics really moved
    back = apply_permutation(spec, invert(perm), permuted)
    assert all(torch.equal(back[k], params[k]) for k in params)
    assert all(torch.equal(p, torch.arange(len(p))) for p in compose(invert(perm), perm).values())


@pytest.mark.parametrize("case", [c for c in CASES if c != "resnet50"])
def test_activation_points_carry_their_groups(case):
    """Every group has hook points; each point's output has that group's size on its unit axis
    (dim 1, or the one after ``@``)."""
    arch = _arch(case)
    shape = _shape(arch, (1, 28, 28))
    config = make_config(arch, input_shape=shape, num_classes=10, **CASES[case])
    model = build_model(arch, config, seed=0).eval()
    spec = get_arch(arch).permutation_spec(config)
    points = get_arch(arch).activation_points(config)
    assert set(points) == set(spec.groups)
    modules, seen = dict(model.named_modules()), {}
    for ps in points.values():
        for p in ps:
            name, _, axis = p.partition("@")
            modules[name].register_forward_hook(
                lambda _m, _i, out, p=p, axis=int(axis or 1): seen.__setitem__(p, out.shape[axis])
            )
    with torch.no_grad():
        model(_inputs(shape, 2, torch.Generator().manual_seed(0)))
    sizes = spec.group_sizes(model.state_dict())
    assert all(seen[p] == sizes[g] for g, ps in points.items() for p in ps)


def test_resnet20_groups_streams_and_projections():
    config = make_config("resnet20", input_shape=(3, 32, 32), num_classes=10, width_multiplier=1)
    spec = get_arch("resnet20").permutation_spec(config)
    assert len(spec.groups) == 3 + 9  # one stream per stage + one inner group per block
    assert spec.axes["layer2.0.downsample.0.weight"] == ("P_stage2", "P_stage1", None, None)
    assert spec.axes["layer2.1.conv2.weight"] == ("P_stage2", "P_stage2_block1", None, None)
    assert spec.axes["conv1.weight"][0] == "P_stage1" and "layer1.0.downsample.0.weight" not in spec.axes
    assert config.widths() == [16, 32, 64]
    quarter = make_config("resnet20", input_shape=(3, 32, 32), num_classes=10, width_multiplier=0.25)
    assert quarter.widths() == [4, 8, 16]


@pytest.mark.parametrize(
    "arch, fields, match",
    [
        ("vgg", {"width_multiplier": 0}, "width_multiplier"),
        ("vgg", {"layers": [64, "X"]}, "layers"),
        ("resnet20", {"blocks": 0}, "blocks"),
        ("resnet20", {"depth": 3}, "no option"),
    ],
)
def test_bad_config_is_one_line_error(arch, fields, match):
    with pytest.raises(ValueError, match=match):
        make_config(arch, input_shape=(3, 32, 32), num_classes=10, **fields)


def test_every_architecture_declares_its_interface_and_nothing_reads_around_it() -> None:
    """The members code outside an architecture reads are :class:`lmclab.archs.base.Interface`'s, declared
    there with their defaults (that no module of the library reads one by ``getattr``/``hasattr`` with a
    default of its own is read from the source in ``tests/meta/test_extending.py``), and a module of the
    wrong kind is refused by name."""
    import types

    from lmclab.archs import ARCHS
    from lmclab.archs.base import REQUIRED, Interface
    from lmclab.core.options import OptionError

    assert interface(ARCHS["gpt"]).INPUT == "tokens" and interface(ARCHS["traced"]).TRACED
    assert interface(ARCHS["mlp"]) == Interface() and interface(ARCHS["mae"]).OBJECTIVE == "mae"
    bad = types.ModuleType("toy")
    with pytest.raises(OptionError, match=rf"toy lacks {REQUIRED!r}".replace("(", r"\[").replace(")", r"\]")):
        interface(bad)
    for name in REQUIRED:
        setattr(bad, name, object())
    bad.INPUT = "audio"
    with pytest.raises(OptionError, match=r"toy.INPUT = 'audio' is not"):
        interface(bad)
    bad.INPUT, bad.PRETRAINING_KEYS = "tokens", ("a", 1)
    with pytest.raises(OptionError, match=r"toy.PRETRAINING_KEYS = \('a', 1\) is not"):
        interface(bad)
