"""Masked autoencoder (He et al. 2022) on the project's pre-LN ViT (:mod:`lmclab.archs.vit`).

The encoder is the ViT without its head (``embed``, ``cls_token``, ``pos_embed``, ``blocks``, ``norm``:
the supervised ViT's names, so :func:`encoder_params` loads into :func:`probe_config`'s ViT for a linear
probe). It sees only the visible patches of each image (plus the class token), with their positions.
The narrower decoder (``decoder_width``, ``decoder_depth``, ``decoder_heads``) maps the encoded tokens
by ``decoder_embed`` (Linear, encoder width → decoder width), puts the learned ``mask_token`` at every
masked position, adds ``decoder_pos_embed``, runs pre-LN ``decoder_blocks`` and ``decoder_norm``, and
``decoder_pred`` (Linear to p·p·C) predicts every patch's pixels. ``forward(x, mask)`` is the loss of
:func:`lmclab.archs.masking.masked_mse` over the masked patches; :meth:`Model.predict` the predictions.

Permutation symmetries: the encoder's groups as in the ViT (``P_res``, headed ``P_qk_k``/``P_vo_k`` tied
by ``P_heads_k``, ``P_mlp_k``); the decoder's residual stream ``P_dec`` (``decoder_embed``'s output,
``mask_token``, ``decoder_pos_embed``, its LayerNorms, ``decoder_pred``'s input) with its own headed
``P_dec_qk_k``/``P_dec_vo_k`` (tied by ``P_dec_heads_k``) and ``P_dec_mlp_k``. Pixels are never permuted.

Training (``train.objective: mae``, :func:`lmclab.train.mae_training.train_mae`) draws fresh masks per
batch and minimises the loss::

    mask = random_masks(len(x), config.patches, config.mask_ratio, generator)  # seeded generator
    loss = model(x, mask)  # or functional_call(model, params, (x, mask))

Without a mask (``model(x)``, as activation matching calls it) the masks are drawn from
``mask_seed``: the same masks for both endpoints of a pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from lmclab.archs import vit
from lmclab.archs.base import DATA_FIELDS
from lmclab.archs.masking import masked_mse, pixel_targets, random_masks, visible_indices
from lmclab.core.objective import RECONSTRUCTION
from lmclab.core.options import Count, OptionError, got, one_of, option
from lmclab.core.spec import Params, PermutationSpec, build_spec
from lmclab.core.spec_builders import dense, norm

STREAM = vit.STREAM
DECODER = "P_dec"
OBJECTIVE = "mae"  # reached by train.objective: mae (its forward returns the loss), not by model.arch


class Config(vit.Config):
    """The ViT encoder's options (always a class token), the decoder's and the masking's."""

    num_classes: Annotated[int, Field(ge=0)] = option(0, "not used in pretraining: the classes of the probe's ViT")
    pool: Literal["cls"] = option("cls", "an MAE encoder has a class token")
    position: one_of(vit.POSITIONS) = option("sincos", "MAE's fixed sin-cos tables (encoder and decoder), or learned")
    decoder_width: Count = option(32, "channels of the decoder's residual stream (a multiple of its heads; of 4)")
    decoder_depth: Count = option(2, "decoder blocks")
    decoder_heads: Count = option(4, "attention heads per decoder block")
    mask_ratio: Annotated[float, Field(gt=0, lt=1)] = option(0.75, "fraction of each image's patches masked")
    norm_pix: bool = option(False, "targets are each patch's pixels normalised to mean 0, variance 1")
    mask_seed: Annotated[int, Field(ge=0)] = option(
        0, "seeds the fixed masks of every evaluation (the same at every λ; model(x) without a mask)"
    )

    @model_validator(mode="after")
    def _decoder_fits(self) -> Config:
        """One-line :class:`OptionError` s naming the decoder's and the masking's fields (the encoder's are
        the ViT's own checks)."""
        if self.decoder_width % self.decoder_heads:
            raise OptionError(
                f"{{decoder_heads}}: {self.decoder_heads} heads do not divide {{decoder_width}} {self.decoder_width}"
            )
        if self.position == "sincos" and self.decoder_width % 4:
            raise OptionError(
                f"{{decoder_width}}: a sin-cos position table needs a multiple of 4, got {self.decoder_width}"
            )
        count = round(self.mask_ratio * self.patches)  # masking.masked_count's rule
        if not 0 < count < self.patches:
            raise OptionError(
                f"{{mask_ratio}}: {self.mask_ratio} masks {count} of {self.patches} patches; "
                "at least one must be masked and one visible"
            )
        return self

    @property
    def encoder(self) -> vit.Config:
        """The encoder as a supervised ViT's config (class token; its head unused)."""
        keys = ("input_shape", "num_classes", "patch_size", "width", "depth", "heads", "head_dim", "mlp_ratio")
        keys += ("position",)
        return vit.Config(**{k: getattr(self, k) for k in keys}, pool="cls")

    @property
    def decoder(self) -> vit.Config:
        """The decoder's blocks as a ViT's config of the decoder width, depth and heads."""
        update = {"width": self.decoder_width, "depth": self.decoder_depth, "heads": self.decoder_heads}
        update |= {"head_dim": None}  # decoder_width / decoder_heads features per head
        return vit.Config(**{**self.encoder.model_dump(), **update})

    @property
    def patches(self) -> int:
        grid = self.encoder.grid
        return grid[0] * grid[1]


# the ViT's options it takes
ENCODER_KEYS = ("patch_size", "width", "depth", "heads", "head_dim", "mlp_ratio", "position")
PRETRAINING_KEYS = tuple(k for k in Config.model_fields if k not in (*DATA_FIELDS, *ENCODER_KEYS, "pool"))


def from_vit(encoder: vit.Config, **pretraining: object) -> Config:
    """The MAE whose encoder is the supervised ViT ``encoder`` (its classes become the probe's), with the
    decoder and masking options ``pretraining`` (:class:`Config`'s other fields). The encoder must pool
    by its class token; an unknown option or a bad value is a one-line :class:`OptionError` naming it."""
    if encoder.pool != "cls":
        raise OptionError(f"{{pool}}: an MAE encoder has a class token: expected 'cls', got {got(encoder.pool)}")
    for name in sorted(set(pretraining) - set(PRETRAINING_KEYS)):
        raise OptionError(
            f"{{pretraining}}: unknown option {got(name)}; expected some of {got(sorted(PRETRAINING_KEYS))}"
        )
    shared = {k: getattr(encoder, k) for k in ("input_shape", "num_classes", *ENCODER_KEYS)}
    return Config(**shared, **pretraining)


def position_table(module: nn.Module, name: str, config: vit.Config) -> None:
    """Register ``name`` (1, 1 + patches, width): a learned parameter or the fixed sin-cos buffer."""
    if config.position == "learned":
        module.register_parameter(name, nn.Parameter(0.02 * torch.randn(1, config.tokens, config.width)))
    else:
        module.register_buffer(name, vit.sincos_table(config.width, config.grid, cls=True))


def gather_tokens(tokens: Tensor, index: Tensor) -> Tensor:
    """``tokens[i, index[i]]`` for every sample ``i``. (n, len(index[i]), width)."""
    return tokens.gather(1, index[..., None].expand(-1, -1, tokens.shape[-1]))


class Model(nn.Module):
    objective = RECONSTRUCTION  # forward(x) is the loss (lmclab.core.objective)

    def __init__(self, config: Config) -> None:
        super().__init__()
        enc, dec = config.encoder, config.decoder
        self.config = config
        self.embed = nn.Conv2d(config.input_shape[0], enc.width, enc.patch_size, stride=enc.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, enc.width))
        position_table(self, "pos_embed", enc)
        self.blocks = nn.ModuleList(vit.Block(enc) for _ in range(enc.depth))
        self.norm = nn.LayerNorm(enc.width)
        self.decoder_embed = nn.Linear(enc.width, dec.width)
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, dec.width))
        position_table(self, "decoder_pos_embed", dec)
        self.decoder_blocks = nn.ModuleList(vit.Block(dec) for _ in range(dec.depth))
        self.decoder_norm = nn.LayerNorm(dec.width)
        self.decoder_pred = nn.Linear(dec.width, config.patch_size**2 * config.input_shape[0])

    def encode(self, x: Tensor, visible: Tensor) -> Tensor:
        """The class token and the ``visible`` patches through the encoder. (n, 1 + visible, width)."""
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos_embed[:, 1:]  # (n, patches, width)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        z = torch.cat([cls, gather_tokens(tokens, visible)], dim=1)
        for block in self.blocks:
            z = block(z)
        return self.norm(z)

    def decode(self, latent: Tensor, visible: Tensor) -> Tensor:
        """Mask tokens everywhere but at the ``visible`` patches, through the decoder. (n, patches, p·p·C)."""
        y = self.decoder_embed(latent)  # (n, 1 + visible, decoder width)
        index = visible[..., None].expand(-1, -1, y.shape[-1])
        full = self.mask_token.expand(y.shape[0], self.config.patches, -1).scatter(1, index, y[:, 1:])
        z = torch.cat([y[:, :1], full], dim=1) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            z = block(z)
        return self.decoder_pred(self.decoder_norm(z))[:, 1:]

    def default_mask(self, n: int) -> Tensor:
        """The masks of ``n`` images called without one: drawn from ``config.mask_seed``."""
        generator = torch.Generator().manual_seed(self.config.mask_seed)
        return random_masks(n, self.config.patches, self.config.mask_ratio, generator)

    def predict(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The decoder's pixel predictions of every patch (the loss uses the masked ones). (n, patches, p·p·C)."""
        mask = self.default_mask(x.shape[0]) if mask is None else mask
        if mask.shape != (x.shape[0], self.config.patches):
            raise ValueError(f"mask: shape {tuple(mask.shape)}, expected ({x.shape[0]}, {self.config.patches})")
        visible = visible_indices(mask).to(x.device)
        return self.decode(self.encode(x, visible), visible)

    def prediction_loss(self, prediction: Tensor, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The MAE loss of the pixel predictions ``prediction`` (n, patches, p·p·C) of images ``x`` under ``mask``."""
        mask = self.default_mask(x.shape[0]) if mask is None else mask
        target = pixel_targets(x, self.config.patch_size, self.config.norm_pix)
        return masked_mse(prediction, target, mask.to(x.device))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The MAE loss of images ``x`` (n, C, H, W) under ``mask`` (n, patches): MSE over masked patches."""
        mask = self.default_mask(x.shape[0]) if mask is None else mask
        return self.prediction_loss(self.predict(x, mask), x, mask)


def permutation_spec(config: Config) -> PermutationSpec:
    """The ViT's spec of the encoder (without its head), the decoder stream and the decoder's groups."""
    encoder = vit.permutation_spec(config.encoder)
    dec = config.decoder
    parts = [
        {k: v for k, v in encoder.axes.items() if not k.startswith("head.")},
        dense("decoder_embed", DECODER, STREAM),
        {"mask_token": (None, None, DECODER), "decoder_pos_embed": (None, None, DECODER)},
        *(vit.block_spec(f"decoder_blocks.{k}", k, DECODER, DECODER) for k in range(dec.depth)),
        norm("decoder_norm", DECODER, running_stats=False),
        dense("decoder_pred", None, DECODER),
    ]
    return build_spec(*parts, heads={**encoder.heads, **vit.head_groups(dec.depth, dec.heads, DECODER)})


def activation_points(config: Config) -> dict[str, list[str]]:
    """The ViT's points of the encoder and the same of the decoder (its LayerNorms, q/k, v, GELUs)."""
    return {
        **vit.stack_points("blocks", "norm", config.depth),
        **vit.stack_points("decoder_blocks", "decoder_norm", config.decoder_depth, DECODER, DECODER),
    }


def encoder_params(params: Mapping[str, Tensor]) -> Params:
    """The encoder's entries of an MAE ``state_dict``: a probe's ViT takes them (its head apart)."""
    return {k: v for k, v in params.items() if not k.startswith(("decoder_", "mask_token"))}


def probe_config(config: Config, num_classes: int) -> vit.Config:
    """The supervised ViT whose ``state_dict`` is :func:`encoder_params` plus a ``head`` of ``num_classes``."""
    return vit.Config(**{**config.encoder.model_dump(), "num_classes": num_classes})
