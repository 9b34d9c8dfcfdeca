"""The defaults of ``params.yaml`` that differ from the library's own options, each with the reason: the one
place they are written (the schema, :mod:`lmclab.pipeline.schema`, puts them in the blocks it derives; the
docs' table of keys, :mod:`lmclab.pipeline.keys`, shows both)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Override(NamedTuple):
    """A params.yaml default that differs from the library's, and why."""

    default: Any
    reason: str


_SINKHORN_BUDGET = (
    "params.yaml runs at most 25 × 10 Sinkhorn WM steps to fit the default run's time budget "
    "(⟨θa, π(θb)⟩ within 0.1 % of 30 × 10); wm_sinkhorn() runs the paper's 1,000 as 100 × 10"
)
_MERGE_MANY_BUDGET = (
    "params.yaml stops MergeMany after 3 passes or a pass gaining < 1e-4 (the default run's Σ‖·‖² is within "
    "0.5 % of its limit by then); merge_many() runs 20 passes to 1e-7"
)
# the only pipeline defaults of the library's options that are not the library's
PIPELINE_DEFAULTS: dict[str, Override] = {
    "permute.wm_sinkhorn.epochs": Override(25, _SINKHORN_BUDGET),
    "merge_many.merge_many.max_iter": Override(3, _MERGE_MANY_BUDGET),
    "merge_many.merge_many.tol": Override(1.0e-4, _MERGE_MANY_BUDGET),
    "train.epochs": Override(20, "20 epochs fit the default run's CPU budget and show WM's negative B½ (10 do not)"),
    "model.vgg.width_multiplier": Override(4, "the paper's VGG11 is 4 times as wide as the plain VGG11 of vgg.Config"),
    "model.resnet20.width_multiplier": Override(
        16, "the paper's ResNet20 is 16 times as wide as the plain ResNet20 of resnet20.Config"
    ),
    "model.traced.in_channels": Override(
        3, "the torchvision and timm factories take colour images: the digits' one channel is repeated"
    ),
}
