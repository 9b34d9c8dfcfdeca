"""MAE pretraining on real digits (the session's 800 mnist5k training images), its determinism and option
errors; the encoder's evaluation: linear probe and kNN closed cases, the probe curve's endpoints, the
masked/visible reconstruction error and the residual change of an identity block."""

from __future__ import annotations

import pytest
import torch
from mae_reference import reconstruction_loss

from lmclab.analysis.mae import fixed_masks, masked_visible_error
from lmclab.analysis.mae_probe import (
    encoder_features,
    knn_accuracy,
    linear_probe_accuracy,
    probe_curve,
    residual_change,
)
from lmclab.archs import mae, seeded_model, vit
from lmclab.archs.masking import patchify
from lmclab.core.data import Split
from lmclab.core.objective import functional_method
from lmclab.core.options import OptionError
from lmclab.train.mae_training import decay_groups, train_mae

TINY = {"patch_size": 7, "width": 16, "depth": 1, "heads": 2, "decoder_width": 8, "decoder_depth": 1}
TINY |= {"decoder_heads": 2}
CONFIG = mae.Config(input_shape=(1, 28, 28), **TINY)


def _train(images: Split, seed: int, epochs: int = 2):
    return train_mae(CONFIG, seed, images, epochs=epochs, lr=1e-2, batch_size=100, warmup_epochs=1)


def test_train_mae_reduces_the_reconstruction_loss_of_real_digits(splits):
    state, history = _train(splits["train"], seed=0, epochs=4)
    assert [r["epoch"] for r in history] == [1, 2, 3, 4] and all(r["seconds"] > 0 for r in history)
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    assert history[-1]["lr"] < 1e-6  # cosine decay to 0 after the warm-up
    model = mae.Model(CONFIG)
    masks = fixed_masks(len(splits["test"]), CONFIG.patches, CONFIG.mask_ratio, seed=1)
    untrained = reconstruction_loss(model, dict(model.state_dict()), splits["test"].x, masks)
    assert reconstruction_loss(model, state, splits["test"].x, masks) < 0.8 * untrained  # held-out digits too


def test_same_seed_gives_identical_parameters_and_another_seed_different(splits):
    images = Split(splits["train"].x[:200], splits["train"].y[:200])
    (a, ha), (b, hb), (c, _) = _train(images, 3), _train(images, 3), _train(images, 4)
    assert set(a) == set(mae.Model(CONFIG).state_dict())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in ha] == [r["train_loss"] for r in hb]
    assert not torch.equal(a["blocks.0.fc1.weight"], c["blocks.0.fc1.weight"])


def test_weight_decay_spares_biases_and_norms_and_options_fail_in_one_line(splits):
    decayed, spared = decay_groups(mae.Model(CONFIG), 0.05)
    assert decayed["weight_decay"] == 0.05 and spared["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decayed["params"]) and all(p.ndim == 1 for p in spared["params"])
    with pytest.raises(OptionError, match=r"^warmup_epochs must be between 0 and epochs \(2\), got 3$"):
        train_mae(CONFIG, 0, splits["train"], epochs=2, warmup_epochs=3)
    with pytest.raises(OptionError, match=r"^batch_size must be at most the 800 training images, got 801$"):
        train_mae(CONFIG, 0, splits["train"], batch_size=801)
    with pytest.raises(OptionError, match=r"^beta2 must be a number in \[0, 1\), got 1.0$"):
        train_mae(CONFIG, 0, splits["train"], beta2=1.0)


def _clusters(n: int, seed: int, spread: float = 1.0, classes: int = 4, dim: int = 10):
    """Gaussian clusters (std ``spread``) around class centres 8 apart along distinct axes: linearly
    separable with the default spread. Features (n, dim) and labels (n,)."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = 8.0 * torch.eye(classes, dim, dtype=torch.float64)
    return centres[labels] + spread * torch.randn(n, dim, generator=gen, dtype=torch.float64), labels


def test_linear_probe_is_perfect_on_separable_features_and_at_chance_on_random_labels():
    (x_tr, y_tr), (x_te, y_te) = _clusters(400, seed=0), _clusters(400, seed=1)
    assert linear_probe_accuracy(x_tr, y_tr, x_te, y_te) == 1.0
    # standardised with the training statistics: a scale and offset per feature change nothing
    (x_tr, y_tr), (x_te, y_te) = _clusters(400, seed=0, spread=4.0), _clusters(400, seed=1, spread=4.0)
    scale, offset = 10.0 ** torch.linspace(-3, 3, 10, dtype=torch.float64), torch.linspace(-50, 50, 10)
    overlapping = linear_probe_accuracy(x_tr, y_tr, x_te, y_te)
    assert 0.6 < overlapping < 0.95
    assert linear_probe_accuracy(scale * x_tr + offset, y_tr, scale * x_te + offset, y_te) == overlapping
    gen = torch.Generator().manual_seed(2)
    noise = torch.randn(2000, 100, generator=gen, dtype=torch.float64)  # the probe fits its 1000 labels better
    labels = torch.randint(0, 2, (2000,), generator=gen)
    chance = linear_probe_accuracy(noise[:1000], labels[:1000], noise[1000:], labels[1000:])
    assert abs(chance - 0.5) < 0.06
    assert linear_probe_accuracy(x_tr, y_tr, x_te, y_te) == linear_probe_accuracy(x_tr, y_tr, x_te, y_te)


def test_knn_with_one_neighbour_on_its_own_training_set_is_perfect_and_uses_cosine_similarity():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 8, generator=gen, dtype=torch.float64), torch.randint(0, 5, (300,), generator=gen)
    assert knn_accuracy(x, y, x, y, k=1, batch_size=64) == 1.0
    # cosine: (1.5, 2) is nearer (0, 0.1) in angle, but nearer (1, 0) in L2 distance and by dot product
    bank = torch.tensor([[1.0, 0.0], [0.0, 0.1]], dtype=torch.float64)
    assert knn_accuracy(bank, torch.tensor([0, 1]), torch.tensor([[1.5, 2.0]]), torch.tensor([1]), k=1) == 1.0
    assert knn_accuracy(*_clusters(200, 0), *_clusters(200, 1), k=5) == 1.0
    with pytest.raises(ValueError, match=r"^k must be between 1 and the 300 training features, got 301"):
        knn_accuracy(x, y, x, y, k=301)


def _random_mae(seed: int) -> dict[str, torch.Tensor]:
    return dict(seeded_model(mae.Model, CONFIG, seed).state_dict())


def test_probe_curve_endpoints_are_the_endpoints_own_accuracies(splits):
    model, params_a, params_b = mae.Model(CONFIG), _random_mae(0), _random_mae(1)
    train, test = (Split(s.x[:200], s.y[:200]) for s in (splits["train"], splits["test"]))
    rows = probe_curve(model, params_a, params_b, train, test, [0.0, 0.5, 1.0], steps=20, k=5)
    assert [r["lam"] for r in rows] == [0.0, 0.5, 1.0]
    for lam, params in ((1.0, params_a), (0.0, params_b)):
        f_train, f_test = (encoder_features(model, params, s.x, batch_size=64) for s in (train, test))
        row = next(r for r in rows if r["lam"] == lam)
        assert row["probe_acc"] == linear_probe_accuracy(f_train, train.y, f_test, test.y, steps=20)
        assert row["knn_acc"] == knn_accuracy(f_train, train.y, f_test, test.y, k=5)
    assert rows[0]["probe_acc"] != rows[-1]["probe_acc"] or rows[0]["knn_acc"] != rows[-1]["knn_acc"]


def test_features_are_the_encoders_class_token_on_all_patches(splits):
    model, params = mae.Model(CONFIG), _random_mae(0)
    x = splits["test"].x[:6]
    probe = vit.Model(mae.probe_config(CONFIG, 10))
    probe.load_state_dict(mae.encoder_params(params), strict=False)
    captured = {}
    probe.norm.register_forward_hook(lambda m, i, out: captured.update(z=out))
    with torch.no_grad():
        probe(x)
    assert torch.allclose(encoder_features(model, params, x), captured["z"][:, 0], atol=1e-6)
    assert torch.allclose(encoder_features(model, params, x, pool="mean"), captured["z"][:, 1:].mean(1), atol=1e-6)


def test_masked_visible_error_splits_the_loss_by_patch_and_residual_change_of_an_identity_block_is_zero(splits):
    model, params = mae.Model(CONFIG), _random_mae(0)
    x = splits["test"].x[:10]
    masks = fixed_masks(10, CONFIG.patches, CONFIG.mask_ratio, seed=2)
    errors = masked_visible_error(model, params, x, masks, batch_size=3)
    assert abs(errors["masked"] - reconstruction_loss(model, params, x, masks)) < 1e-6
    per_patch = (functional_method(model, params, "predict", x, masks) - patchify(x, 7)).pow(2).mean(-1)
    assert abs(errors["visible"] - float(per_patch[~masks].mean())) < 1e-6
    identity = dict(params)
    for name in ("blocks.0.attn.out", "blocks.0.fc2"):
        identity |= {f"{name}.weight": torch.zeros_like(params[f"{name}.weight"])}
        identity |= {f"{name}.bias": torch.zeros_like(params[f"{name}.bias"])}
    assert residual_change(model, identity, x, batch_size=4) == {"blocks.0": 0.0}
    changes = residual_change(model, params, x, masks)
    assert set(changes) == {"blocks.0", "decoder_blocks.0"} and all(v > 0 for v in changes.values())
