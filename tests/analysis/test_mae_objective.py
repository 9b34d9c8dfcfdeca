"""A masked autoencoder through the library's loss-evaluating code (lmclab.core.objective): the curves'
loss is the reconstruction loss on the fixed masks of ``mask_seed``, the searches' midpoint objective is
the merged MAE's loss, the output ensemble is the loss of the mean prediction; ``from_vit``'s one-line
errors; ``train_mae``'s test loss per epoch; and the MAE analyses of a pair (lmclab.analysis.mae_pair)."""

from __future__ import annotations

import math

import pytest
import torch
from mae_reference import reconstruction_loss

from lmclab.analysis.mae import fixed_masks
from lmclab.analysis.mae_pair import mae_pair
from lmclab.archs import mae, seeded_model, vit
from lmclab.archs.masking import masked_mse, pixel_targets
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate, evaluate_ensemble
from lmclab.core.merge import lerp_params
from lmclab.core.objective import functional_method, is_reconstruction
from lmclab.core.options import OptionError
from lmclab.search.midpoint import midpoint_loss
from lmclab.train.mae_training import train_mae

VIT = vit.Config(input_shape=(1, 28, 28), num_classes=10, patch_size=7, width=16, depth=1, heads=2)
DECODER = {"decoder_width": 8, "decoder_depth": 1, "decoder_heads": 2}
CONFIG = mae.from_vit(VIT, **DECODER)


def _pair():
    model = seeded_model(mae.Model, CONFIG, 0).double().eval()
    a = {k: v.double() for k, v in model.state_dict().items()}
    b = {k: v.double() for k, v in seeded_model(mae.Model, CONFIG, 1).state_dict().items()}
    return model, a, b


def _images(n: int, seed: int = 3) -> Split:
    gen = torch.Generator().manual_seed(seed)
    return Split(torch.rand(n, 1, 28, 28, generator=gen, dtype=torch.float64), torch.arange(n) % 10)


def test_from_vit_takes_the_encoder_of_the_vit_and_names_each_bad_option():
    assert (CONFIG.width, CONFIG.depth, CONFIG.heads, CONFIG.patch_size) == (16, 1, 2, 7)
    assert CONFIG.encoder == vit.Config(**{**VIT.__dict__, "pool": "cls"})
    cases = [
        ({"pool": "mean"}, {}, "pool: an MAE encoder has a class token"),
        ({}, {"decoder_width": 9}, "decoder_heads: 2 heads do not divide decoder_width 9"),
        ({}, {"mask_ratio": 0.01}, "mask_ratio: 0.01 masks 0 of 16 patches"),
        ({}, {"decoder_depth": 0}, "decoder_depth must be a positive integer"),
        ({}, {"depth": 3}, "pretraining: unknown option 'depth'"),
    ]
    for encoder, options, message in cases:
        with pytest.raises(OptionError, match=message):
            mae.from_vit(vit.Config(**{**VIT.__dict__, **encoder}), **{**DECODER, **options})


def test_evaluate_gives_the_reconstruction_loss_on_the_fixed_masks_and_no_accuracy():
    model, a, _ = _pair()
    data = _images(40)
    assert is_reconstruction(model)
    got = evaluate(model, a, data, batch_size=64)  # one batch: the masks of mask_seed for 40 images
    masks = fixed_masks(40, CONFIG.patches, CONFIG.mask_ratio, CONFIG.mask_seed)
    assert got.loss == pytest.approx(reconstruction_loss(model, a, data.x, masks), rel=1e-12)
    assert math.isnan(got.acc)
    assert evaluate(model, lerp_params(a, a, 0.3), data, batch_size=64).loss == pytest.approx(got.loss, rel=1e-12)


def test_the_midpoint_objective_is_the_loss_of_the_merged_mae():
    model, a, b = _pair()
    data = _images(8)
    got = midpoint_loss(model, mae.permutation_spec(CONFIG), a, b, data.x, data.y)
    merged = lerp_params(a, b, 0.5)
    mask = model.default_mask(8)
    pred = functional_method(model, merged, "predict", data.x, mask)
    want = masked_mse(pred, pixel_targets(data.x, 7, False), mask)
    assert float(got) == pytest.approx(float(want), rel=1e-12)


def test_the_output_ensemble_of_maes_is_the_loss_of_the_mean_prediction():
    model, a, b = _pair()
    data = _images(16)
    same = evaluate_ensemble(model, [a, a], data)
    assert same.loss == pytest.approx(evaluate(model, a, data).loss, rel=1e-12) and math.isnan(same.acc)
    mask = model.default_mask(16)
    preds = [functional_method(model, p, "predict", data.x, mask) for p in (a, b)]
    want = masked_mse((preds[0] + preds[1]) / 2, pixel_targets(data.x, 7, False), mask)
    assert evaluate_ensemble(model, [a, b], data).loss == pytest.approx(float(want), rel=1e-12)


def test_train_mae_measures_the_test_reconstruction_loss_each_epoch(splits):
    rows = []
    state, history = train_mae(
        CONFIG, 0, splits["train"], test=splits["test"], epochs=2, lr=1e-2, batch_size=200, on_epoch=rows.append
    )
    model = seeded_model(mae.Model, CONFIG, 0)
    assert rows == history and [r["epoch"] for r in rows] == [1, 2]
    assert history[-1]["test_loss"] == pytest.approx(evaluate(model, state, splits["test"]).loss, rel=1e-6)


def test_the_mae_analyses_of_a_pair_are_consistent_with_their_parts():
    model, a, b = _pair()
    train, test = _images(60, seed=4), _images(30, seed=5)
    rows, residual, summary = mae_pair(model, a, b, train, test, [0.0, 0.5, 1.0])
    assert [r["lam"] for r in rows] == [0.0, 0.5, 1.0]
    at = {r["lam"]: r for r in rows}
    want = 100 * ((at[1.0]["probe_acc"] + at[0.0]["probe_acc"]) / 2 - at[0.5]["probe_acc"])
    assert summary["probe_acc_barrier_mid"] == pytest.approx(want)
    assert summary["knn_acc_a"] == pytest.approx(100 * at[1.0]["knn_acc"])
    masks = fixed_masks(30, CONFIG.patches, CONFIG.mask_ratio, CONFIG.mask_seed)
    mid = lerp_params(a, b, 0.5)
    assert summary["masked_error_mid"] == pytest.approx(reconstruction_loss(model, mid, test.x, masks), rel=1e-10)
    assert {(r["lam"], r["block"]) for r in residual} == {(lam, "blocks.0") for lam in (0.0, 0.5, 1.0)}
    with pytest.raises(ValueError, match="lams: the λ grid must contain 0, ½ and 1"):
        mae_pair(model, a, b, train, test, [0.0, 1.0])


def test_the_measure_stage_gives_the_mae_analyses_their_splits_on_the_process_device(monkeypatch):
    """θa, π(θb) and both splits reach the MAE analyses on the world's device: ``meta`` stands in for a GPU,
    with the analyses replaced by a recorder (nothing can be computed there)."""
    from lmclab.analysis import pair as measure
    from lmclab.analysis.compose import Analysis, Endpoints
    from lmclab.archs.checkpoint import Checkpoint
    from lmclab.core.distributed import World

    model, a, b = _pair()
    meta, seen = torch.device("meta"), []

    def recording(model, params_a, permuted_b, train, test, lams):
        seen.extend(t.device.type for t in (*params_a.values(), *permuted_b.values(), train.x, train.y, test.x, test.y))
        return [], [], {}

    monkeypatch.setattr(measure, "measure_and_analyze", lambda *args, **kwargs: ({}, {}))
    monkeypatch.setattr(measure, "mae_pair", recording)
    on_meta = {k: v.to(meta) for k, v in a.items()}  # as prepare_pair leaves θa
    ends = Endpoints(mae.permutation_spec(CONFIG), model, on_meta, on_meta, {"train": _images(6), "test": _images(4)})
    how = Analysis(lams=[0.0, 0.5, 1.0], gammas=[0.0], input_shape=CONFIG.input_shape)
    aligned, midpoint = (Checkpoint("mae", CONFIG, 1, p) for p in (b, lerp_params(a, b, 0.5)))
    tables, _ = measure.measure_method(measure.Pair(ends, how, None, None, World(device=meta)), aligned, midpoint)
    assert sorted(tables) == ["mae", "residual"] and set(seen) == {"meta"}
