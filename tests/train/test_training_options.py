"""Augmentation (deterministic per seed, correct crops and flips), learning-rate schedules,
optimiser options and their one-line errors."""

from __future__ import annotations

import math

import pytest
import torch

from lmclab.archs import make_config
from lmclab.core.data import Split
from lmclab.train.augment import crop_flip, resolve_augment
from lmclab.train.training import lr_factor, train


def test_crop_flip_is_a_shifted_possibly_flipped_window_of_the_padded_image():
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    out = crop_flip(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(len(x)):
        windows = [padded[i, :, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)]
        windows += [w.flip(-1) for w in windows]
        assert any(torch.equal(out[i], w) for w in windows)
    flipped = sum(torch.equal(out[i, :, 4:-4, 4:-4], padded[i, :, 8:-8, 8:-8].flip(-1)) for i in range(len(x)))
    assert flipped < len(x)  # not everything flipped; some crops moved, some flipped


def test_crop_flip_is_deterministic_per_generator_seed():
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    a = crop_flip(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, crop_flip(x, torch.Generator().manual_seed(5)))
    assert not torch.equal(a, crop_flip(x, torch.Generator().manual_seed(6)))


def test_auto_augmentation_follows_the_paper():
    assert resolve_augment("auto", "cifar10") == "crop_flip"
    assert resolve_augment("auto", "mnist5k") == resolve_augment("auto", "fashion_mnist") == "none"
    with pytest.raises(ValueError, match=r"^augment: expected auto or one of"):
        resolve_augment("mixup", "cifar10")


def test_lr_schedules():
    assert [lr_factor("constant", s, 10) for s in range(10)] == [1.0] * 10
    assert lr_factor("cosine", 0, 10) == 1.0 and math.isclose(lr_factor("cosine", 5, 10), 0.5)
    assert math.isclose(lr_factor("linear", 5, 10), 0.5)
    warm = [lr_factor("linear", s, 10, warmup_steps=4) for s in range(10)]
    assert warm[:4] == [0.25, 0.5, 0.75, 1.0] and warm[4] == 1.0 and warm[-1] > 0


def _tiny():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 1, 28, 28, generator=g), torch.randint(0, 10, (60,), generator=g)
    return Split(x, y), make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=8)


@pytest.mark.parametrize(
    "options",
    [
        dict(optimizer="sgd", momentum=0.9, weight_decay=1e-3, schedule="cosine", warmup_epochs=1),
        dict(optimizer="adam", weight_decay=1e-2, schedule="linear", augment="crop_flip"),
    ],
)
def test_training_options_are_deterministic_per_seed(options):
    data, config = _tiny()
    runs = [
        train("mlp", config, seed, data, data, epochs=2, lr=0.01, batch_size=16, progress=False, **options)
        for seed in (0, 0, 1)
    ]
    (a, hist), (b, _), (c, _) = runs
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert not torch.equal(a.state_dict["out.weight"], c.state_dict["out.weight"])
    assert "lr" in hist[0]


def test_weight_decay_shrinks_weights():
    data, config = _tiny()
    norms = [
        train("mlp", config, 0, data, data, epochs=3, lr=0.01, batch_size=20, weight_decay=wd, progress=False)[0]
        .state_dict["layers.0.weight"]
        .norm()
        for wd in (0.0, 1.0)
    ]
    assert norms[1] < norms[0]


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(optimizer="rmsprop"), r"^optimizer must be one of \['adam', 'sgd'\], got 'rmsprop'$"),
        (dict(schedule="step"), "^schedule must be one of"),
        (dict(momentum=1.0), "^momentum must"),
        (dict(weight_decay=-1.0), "^weight_decay must"),
        (dict(warmup_epochs=5), r"^warmup_epochs must be between 0 and epochs \(2\)"),
        (dict(augment="auto"), "^augment must be one of"),
    ],
)
def test_bad_training_options_fail_before_training(options, match):
    data, config = _tiny()
    with pytest.raises(ValueError, match=match):
        train("mlp", config, 0, data, data, epochs=2, batch_size=16, progress=False, **options)
