"""One epoch of optimiser steps (lmclab.train.training.Step) by hand: the mean loss and accuracy it reports
are those of every image it saw, a trailing batch of one image is skipped and one of two is not; the
optimiser each name gives; bf16 autocast on when asked; every offset of a crop drawn, on the input's device."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lmclab.core.data import Split
from lmclab.core.distributed import World
from lmclab.train.augment import crop_flip
from lmclab.train.training import Step, make_optimizer


def _step(precision: str = "fp32") -> Step:
    """A step of lr 0 (the model stays put) on 10 fixed images of 3 classes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    generator = torch.Generator().manual_seed(1)
    data = Split(torch.randn(10, 3, 2, 2, generator=generator), torch.randint(0, 3, (10,), generator=generator))
    opt = make_optimizer(model.parameters(), optimizer="sgd", lr=0.0, momentum=0.0, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return Step(model, opt, sched, data, "none", generator, World(), precision)


@pytest.mark.parametrize(("sizes", "counted"), [((4, 4, 2), 10), ((4, 4, 1), 8), ((4, 3, 3), 10)])
def test_an_epoch_reports_the_mean_loss_and_accuracy_of_the_images_it_stepped_on(sizes, counted) -> None:
    """With lr = 0 the model stays put: the epoch's figures are the mean cross-entropy and accuracy of the
    first ``counted`` images (a trailing batch of one image is skipped, BatchNorm needs two)."""
    step = _step()
    order = torch.arange(10).flip(0)
    batches = order[: sum(sizes)].split(list(sizes))
    loss, acc = step.epoch(batches)
    seen = order[:counted]
    with torch.no_grad():
        logits = step.model(step.data.x[seen])
    assert loss == pytest.approx(F.cross_entropy(logits, step.data.y[seen]).item(), rel=1e-6)
    assert acc == int((logits.argmax(1) == step.data.y[seen]).sum()) / counted
    assert step.model.training  # an epoch trains


def test_bf16_autocast_is_on_only_when_asked() -> None:
    """The same step in fp32 twice is bit-identical; in bf16 its loss moves, by less than 5 %."""
    idx = torch.arange(10)
    fp32, again, bf16 = _step("fp32").one(idx), _step("fp32").one(idx), _step("bf16").one(idx)
    assert fp32 == again and bf16[0] != fp32[0] and bf16[0] == pytest.approx(fp32[0], rel=0.05)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_each_optimizer_name_gives_its_optimizer_with_every_setting(name: str) -> None:
    params = [nn.Parameter(torch.zeros(2))]
    opt = make_optimizer(params, optimizer=name, lr=0.25, momentum=0.5, weight_decay=0.125)
    group = opt.param_groups[0]
    assert type(opt) is {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[name]
    assert (group["lr"], group["weight_decay"]) == (0.25, 0.125)
    if name == "sgd":
        assert group["momentum"] == 0.5 and not group["nesterov"]


def test_a_crop_draws_every_offset_from_zero_to_twice_the_padding() -> None:
    x = torch.arange(16.0).reshape(1, 1, 4, 4).expand(400, 1, 4, 4)
    out = crop_flip(x, torch.Generator().manual_seed(0), pad=1)
    padded = F.pad(x[:1], (1, 1, 1, 1))[0, 0]
    offsets = set()
    for image in out[:, 0]:
        for dy in range(3):
            for dx in range(3):
                window = padded[dy : dy + 4, dx : dx + 4]
                if torch.equal(image, window) or torch.equal(image, window.flip(-1)):
                    offsets.add((dy, dx))
    assert offsets == {(dy, dx) for dy in range(3) for dx in range(3)}


def test_a_crop_stays_on_the_device_of_its_input() -> None:
    """On the ``meta`` device (no data, every operation checked for its device): all index tensors follow."""
    out = crop_flip(torch.empty(5, 3, 8, 8, device="meta"), torch.Generator().manual_seed(0), pad=2)
    assert out.device.type == "meta" and out.shape == (5, 3, 8, 8)


def _language_step(lr: float, world: World | None = None) -> Step:
    """A tiny ``gpt`` on 24 windows of 16 bytes of the Python reference (next-token targets per position)."""
    from pydoc_data.topics import topics

    from lmclab.archs import gpt
    from lmclab.core.text import encode, split_documents, windows

    x, y = windows(encode(topics, split_documents(topics)[0]), 16, limit=24)
    config = gpt.Config(input_shape=(16,), num_classes=256, width=16, depth=1, heads=2, mlp_ratio=2)
    torch.manual_seed(0)
    model = gpt.Model(config)
    opt = make_optimizer(model.parameters(), optimizer="adam", lr=lr, momentum=0.0, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    data = Split(torch.from_numpy(x).long(), torch.from_numpy(y).long())
    return Step(model, opt, sched, data, "none", torch.Generator().manual_seed(1), world or World(), "fp32")


def test_targets_per_position_give_the_mean_token_cross_entropy_and_accuracy() -> None:
    """A language model's ``(B, T, V)`` logits against ``(B, T)`` next tokens: with lr 0, the epoch's loss is
    the mean cross-entropy over every token, its accuracy the fraction of tokens predicted (of a model
    trained a little first, so that it predicts some)."""
    trained, step = _language_step(lr=3e-3), _language_step(lr=0.0)
    for _ in range(10):
        trained.epoch(torch.arange(24).split(8))
    step.model.load_state_dict(trained.model.state_dict())
    batches = torch.arange(24).split([10, 14])
    loss, acc = step.epoch(batches)
    with torch.no_grad():
        logits = step.model(step.data.x)
    assert loss == pytest.approx(F.cross_entropy(logits.flatten(0, 1), step.data.y.flatten()).item(), rel=1e-6)
    assert acc == pytest.approx(float((logits.argmax(-1) == step.data.y).float().mean()), rel=1e-6)
    assert 0.05 < acc < 0.5


def test_a_language_model_learns_its_windows() -> None:
    step = _language_step(lr=3e-3)
    batches = torch.arange(24).split(8)
    first = step.epoch(batches)[0]
    for _ in range(20):
        last = step.epoch(batches)[0]
    assert last < 0.8 * first
