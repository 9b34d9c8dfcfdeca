"""Masked autoencoders on the ViT: masks, patches, the masked-only loss, the permutation symmetry of encoder
and decoder in float64, planted recovery by WM and AM, the encoder's reuse by a probe, and the
reconstruction curve on fixed masks."""

from __future__ import annotations

import pytest
import torch

from lmclab.analysis.mae import fixed_masks, masked_visible_error
from lmclab.archs import build_model, get_arch, mae
from lmclab.archs.masking import masked_mse, patchify, random_masks, unpatchify, visible_indices
from lmclab.core.data import Split
from lmclab.core.spec import apply_permutation, check_permutation, invert, random_permutation
from lmclab.search import SearchProblem, run_search

SMALL = {"patch_size": 7, "width": 16, "heads": 4, "depth": 2}
SMALL |= {"decoder_width": 8, "decoder_depth": 2, "decoder_heads": 2}


def _mae(seed: int = 0, noise: float = 0.1, **options):
    config = mae.Config(input_shape=(1, 28, 28), **{**SMALL, **options})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = mae.Model(config).double()
    gen = torch.Generator().manual_seed(seed + 100)
    params = {k: v + noise * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in model.state_dict().items()}
    return config, model, mae.permutation_spec(config), params


def _images(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _loss(model, params, x, mask) -> torch.Tensor:
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x, mask))


def test_random_masks_mask_exactly_round_ratio_differ_per_sample_and_are_reproducible():
    masks = random_masks(64, 16, 0.75, torch.Generator().manual_seed(0))
    assert masks.dtype == torch.bool and masks.shape == (64, 16)
    assert (masks.sum(1) == 12).all()
    assert len({tuple(m.tolist()) for m in masks}) > 50  # per-sample, not one mask repeated
    assert masks.float().mean(0).min() > 0.4  # every patch position gets masked (uniform order)
    assert torch.equal(masks, random_masks(64, 16, 0.75, torch.Generator().manual_seed(0)))
    assert not torch.equal(masks, random_masks(64, 16, 0.75, torch.Generator().manual_seed(1)))
    assert (random_masks(5, 16, 0.3, torch.Generator().manual_seed(0)).sum(1) == 5).all()  # round(4.8)
    assert torch.equal(visible_indices(masks)[0], torch.nonzero(~masks[0]).flatten())
    with pytest.raises(ValueError, match=r"^mask_ratio: 1.0 masks 16 of 16 patches"):
        random_masks(2, 16, 1.0, torch.Generator())
    with pytest.raises(ValueError, match=r"^mask: every sample must mask the same number of patches"):
        visible_indices(torch.tensor([[True, False], [False, False]]))


def test_patchify_lays_out_patches_row_major_with_pixels_row_column_channel_and_unpatchify_inverts_it():
    x = torch.randn(2, 3, 8, 12, generator=torch.Generator().manual_seed(0))
    patches = patchify(x, 4)  # grid 2 × 3
    assert patches.shape == (2, 6, 48)
    n, row, col, r, q, c = 1, 1, 2, 3, 1, 2  # patch (1, 2) is number 1·3 + 2; its pixel (r, q) of channel c
    assert patches[n, row * 3 + col, (r * 4 + q) * 3 + c] == x[n, c, row * 4 + r, col * 4 + q]
    assert torch.equal(unpatchify(patches, 4, (3, 8, 12)), x)


@pytest.mark.parametrize("norm_pix", [False, True])
def test_loss_is_the_mse_of_masked_patches_only(norm_pix):
    """Replace each masked patch by its own prediction: the encoder never saw it, so the predictions stay
    and the loss is 0, while the visible patches are predicted badly; and the loss equals a hand computation."""
    _, model, _, params = _mae(norm_pix=norm_pix)
    x, mask = _images(6), random_masks(6, 16, 0.75, torch.Generator().manual_seed(3))
    model.load_state_dict(params)
    with torch.no_grad():
        pred = model.predict(x, mask)
        target = patchify(x, 7)
        if norm_pix:
            target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
        hand = ((pred - target) ** 2).mean(-1)[mask].mean()
        assert abs(float(model(x, mask) - hand)) < 1e-12
        assert float(((pred - target) ** 2).mean(-1)[~mask].mean()) > 0.1
        if not norm_pix:  # the normalised target of a predicted patch is not the prediction
            completed = unpatchify(torch.where(mask[..., None], pred, patchify(x, 7)), 7, (1, 28, 28))
            assert torch.allclose(model.predict(completed, mask), pred, rtol=0, atol=1e-12)
            assert float(model(completed, mask)) < 1e-24
    assert float(masked_mse(pred, torch.where(mask[..., None], pred, pred + 1.0), mask)) == 0.0


@pytest.mark.parametrize(
    "options", [{"position": "learned"}, {"position": "sincos"}, {"position": "sincos", "norm_pix": True}]
)
def test_random_permutation_leaves_the_mae_loss_and_predictions_unchanged_in_float64(options):
    config, model, spec, params = _mae(**options)
    assert set(spec.axes) == set(model.state_dict())
    spec.check(params)
    sizes = spec.group_sizes(params)
    assert {"P_res", "P_dec", "P_dec_qk_1", "P_dec_vo_1", "P_dec_mlp_1"} <= set(sizes) and sizes["P_dec"] == 8
    perm = random_permutation(sizes, torch.Generator().manual_seed(1), spec.heads)
    check_permutation(perm, sizes, spec.heads)
    assert all(not torch.equal(p, torch.arange(len(p))) for p in perm.values())
    permuted = apply_permutation(spec, perm, params)
    x, mask = _images(4), random_masks(4, 16, 0.75, torch.Generator().manual_seed(3))
    before, after = _loss(model, params, x, mask), _loss(model, permuted, x, mask)
    assert float((after - before).abs() / before) <= 1e-12
    with torch.no_grad():
        model.load_state_dict(params)
        pred = model.predict(x, mask)
        model.load_state_dict(permuted)
        assert float((model.predict(x, mask) - pred).abs().max() / pred.abs().max()) <= 1e-12
    restored = apply_permutation(spec, invert(perm), permuted)
    assert all(torch.equal(restored[k], v) for k, v in params.items())


def test_the_pixel_axis_is_never_permuted():
    _, _, spec, _ = _mae()
    assert spec.axes["decoder_pred.weight"] == (None, "P_dec") and spec.axes["decoder_pred.bias"] == (None,)
    assert spec.axes["decoder_embed.weight"] == ("P_dec", "P_res")
    assert spec.heads["P_dec_qk_0"].tie == spec.heads["P_dec_vo_0"].tie == "P_dec_heads_0"


def _planted_problem():
    """θb = π(θa) for MAE encoder and decoder and a random headed π."""
    config, model, spec, params_a = _mae(noise=0.2, width=32, decoder_width=16)
    planted = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(5), spec.heads)
    params_b = apply_permutation(spec, planted, params_a)
    x = _images(128, seed=6)
    train = Split(x, torch.zeros(128, dtype=torch.long))
    problem = SearchProblem(spec, params_a, params_b, model=model, points=mae.activation_points(config), train=train)
    return problem, invert(planted)


@pytest.mark.parametrize("method", ["wm", "am"])
def test_wm_and_am_recover_a_planted_permutation_of_encoder_and_decoder(method):
    problem, expected = _planted_problem()
    found = run_search(method, problem, seed=0).perm
    assert set(found) == set(expected)
    for g, p in expected.items():
        assert torch.equal(found[g], p), g


def test_activation_points_name_modules_and_cover_every_group():
    config, model, spec, params = _mae()
    points = mae.activation_points(config)
    assert set(points) == set(spec.group_sizes(params))
    modules = dict(model.named_modules())
    assert all(name.partition("@")[0] in modules for names in points.values() for name in names)


@pytest.mark.parametrize("position", ["learned", "sincos"])
def test_the_encoder_loads_into_the_supervised_vit_for_a_linear_probe(position):
    config, model, spec, params = _mae(position=position)
    learned = {n for n, _ in model.named_parameters() if n.endswith("pos_embed")}  # fixed tables are buffers
    assert learned == ({"pos_embed", "decoder_pos_embed"} if position == "learned" else set())
    vit_config = mae.probe_config(config, num_classes=10)
    vit = build_model("vit", vit_config, seed=0).double()
    encoder = mae.encoder_params(params)
    assert set(vit.state_dict()) - set(encoder) == {"head.weight", "head.bias"}
    assert all(vit.state_dict()[k].shape == v.shape for k, v in encoder.items())
    missing, unexpected = vit.load_state_dict(encoder, strict=False)
    assert sorted(missing) == ["head.bias", "head.weight"] and unexpected == []
    vit_spec = get_arch("vit").permutation_spec(vit_config)
    assert all(vit_spec.axes[k] == spec.axes[k] for k in encoder)


def test_learned_position_tables_start_small_like_the_vits():
    _, model, _, _ = _mae(position="learned")
    for table in (model.pos_embed.detach(), model.decoder_pos_embed.detach()):
        assert 0.015 < float(table.std()) < 0.025 and float(table.abs().max()) < 0.1  # 0.02 · N(0, 1)


def test_fixed_masks_are_reproducible_and_the_masked_error_is_the_mae_loss():
    _, model, _, params = _mae(seed=0)
    x = _images(10)
    masks = fixed_masks(10, 16, 0.75, seed=4)
    assert torch.equal(masks, fixed_masks(10, 16, 0.75, seed=4))
    errors = masked_visible_error(model, params, x, masks, batch_size=3)  # batches weighted by their patches
    assert abs(errors["masked"] - float(_loss(model, params, x, masks))) < 1e-12
    assert errors["visible"] > 0


def test_the_mask_token_starts_small_like_the_position_tables():
    _, model, _, _ = _mae(decoder_width=64)
    token = model.mask_token.detach()
    assert token.shape == (1, 1, 64)
    assert 0.015 < float(token.std()) < 0.025 and float(token.abs().max()) < 0.1  # 0.02 · N(0, 1)
