"""The encoder of a masked autoencoder as a representation (He et al. 2022, §4: linear probing; the kNN
classifier of Wu et al. 2018 / DINO), along the segment between two MAE endpoints, and how much each block
changes the residual stream.

Features are the encoder's output on *all* patches (no mask), after its final LayerNorm: the class token
(``pool="cls"``) or the mean of the patch tokens (``pool="mean"``). The convention of the curve is the
project's (:func:`lmclab.core.merge.lerp_params`): ``θ(λ) = λ θa + (1 − λ) θb``, θa at λ = 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmclab.core.data import Split
from lmclab.core.merge import lerp_params
from lmclab.core.objective import functional_method

POOLS = ("cls", "mean")
PROBE_L2 = 1e-4  # the probe's L2 penalty λ_2 on its weights (not its bias)
PROBE_STEPS = 100  # L-BFGS iterations of the probe
KNN_K = 20  # neighbours of the kNN classifier (DINO: 20)


def _all_patches(model: nn.Module, x: Tensor) -> Tensor:
    """Every patch index as visible, for each image. (n, patches)."""
    return torch.arange(model.config.patches, device=x.device).expand(x.shape[0], -1)


@torch.no_grad()
def encoder_features(
    model: nn.Module, params: Mapping[str, Tensor], images: Tensor, *, pool: str = "cls", batch_size: int = 256
) -> Tensor:
    """The encoder's ``pool`` feature of each image (all patches visible). (n, width)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {list(POOLS)}, got {pool!r}")
    parts = []
    for start in range(0, images.shape[0], batch_size):
        x = images[start : start + batch_size]
        z = functional_method(model, params, "encode", x, _all_patches(model, x))  # (n, 1 + patches, width)
        parts.append(z[:, 0] if pool == "cls" else z[:, 1:].mean(1))
    return torch.cat(parts)


def linear_probe_accuracy(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    *,
    l2: float = PROBE_L2,
    steps: int = PROBE_STEPS,
) -> float:
    """Test accuracy of a multinomial logistic regression on the features, standardised with the training
    features' mean and std: ``min_{W,b} CE(W z + b, y) + λ_2/2 ‖W‖²`` by full-batch L-BFGS (strong-Wolfe line
    search, ``steps`` iterations, from zero; float64, deterministic)."""
    if steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps}")
    mean, std = train_features.double().mean(0), train_features.double().std(0).clamp_min(1e-12)
    z_train, z_test = (train_features.double() - mean) / std, (test_features.double() - mean) / std
    classes = int(max(train_labels.max(), test_labels.max())) + 1
    weight = torch.zeros(classes, z_train.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weight, bias], max_iter=steps, tolerance_grad=1e-12, tolerance_change=1e-15, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(z_train @ weight.T + bias, train_labels) + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        return float(((z_test @ weight.T + bias).argmax(1) == test_labels).double().mean())


@torch.no_grad()
def knn_accuracy(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    *,
    k: int = KNN_K,
    batch_size: int = 1024,
) -> float:
    """Test accuracy of the majority vote of the ``k`` training features of highest cosine similarity
    (a tie of votes goes to the class of larger summed similarity)."""
    if not 1 <= k <= len(train_labels):
        raise ValueError(f"k must be between 1 and the {len(train_labels)} training features, got {k}")
    bank = F.normalize(train_features.double(), dim=1)  # (n_train, d)
    classes = int(max(train_labels.max(), test_labels.max())) + 1
    correct = 0
    for start in range(0, len(test_labels), batch_size):
        query = F.normalize(test_features[start : start + batch_size].double(), dim=1)
        sim, idx = (query @ bank.T).topk(k, dim=1)  # (m, k)
        labels = train_labels[idx]
        votes = torch.zeros(len(query), classes, dtype=torch.float64).scatter_add_(1, labels, torch.ones_like(sim))
        votes.scatter_add_(1, labels, sim / (2 * k + 1))  # |Σ sim| / (2k + 1) < ½: only breaks ties
        correct += int((votes.argmax(1) == test_labels[start : start + batch_size]).sum())
    return correct / len(test_labels)


def probe_curve(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    train: Split,
    test: Split,
    lams: Sequence[float],
    *,
    pool: str = "cls",
    l2: float = PROBE_L2,
    steps: int = PROBE_STEPS,
    k: int = KNN_K,
) -> list[dict]:
    """Rows ``{lam, probe_acc, knn_acc}``: the linear-probe and kNN test accuracy of the encoder of
    ``θ(λ) = λθa + (1−λ)θb``, a probe fitted afresh at each λ on ``train``'s features."""
    rows = []
    for lam in lams:
        params = lerp_params(params_a, params_b, lam)
        f_train, f_test = (encoder_features(model, params, s.x, pool=pool) for s in (train, test))
        probe = linear_probe_accuracy(f_train, train.y, f_test, test.y, l2=l2, steps=steps)
        knn = knn_accuracy(f_train, train.y, f_test, test.y, k=k)
        rows.append({"lam": float(lam), "probe_acc": probe, "knn_acc": knn})
    return rows


@torch.no_grad()
def residual_change(
    model: nn.Module,
    params: Mapping[str, Tensor],
    images: Tensor,
    masks: Tensor | None = None,
    *,
    batch_size: int = 256,
) -> dict[str, float]:
    """Per block, ``‖block(x) − x‖ / ‖x‖`` of each token's residual stream ``x``, averaged over tokens and
    images: how far the block moves the stream (a token of zero stream is left out: the class token entering
    the first block while ``cls_token`` and its position are zero). Without ``masks``, the encoder's blocks on
    all patches; with ``masks``, the encoder's on the visible patches and the decoder's (``decoder_blocks.k``)."""
    blocks = {f"{stack}.{i}": b for stack in ("blocks", "decoder_blocks") for i, b in enumerate(getattr(model, stack))}
    sums, counts = dict.fromkeys(blocks, 0.0), dict.fromkeys(blocks, 0)

    def record(name: str):
        def hook(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            size = inputs[0].norm(dim=-1)  # (n, tokens)
            ratio = ((output - inputs[0]).norm(dim=-1) / size)[size > 0]
            sums[name] += float(ratio.sum())
            counts[name] += ratio.numel()

        return hook

    hooks = [b.register_forward_hook(record(name)) for name, b in blocks.items()]
    try:
        for start in range(0, images.shape[0], batch_size):
            x = images[start : start + batch_size]
            if masks is None:
                functional_method(model, params, "encode", x, _all_patches(model, x))
            else:
                functional_method(model, params, "predict", x, masks[start : start + batch_size])
    finally:
        for h in hooks:
            h.remove()
    return {name: sums[name] / counts[name] for name in blocks if counts[name]}
