"""Training one endpoint model θ from a seed (SPEC.md §6: Adam 1e-3, batch 512).

Deterministic on CPU: the initialisation and the minibatch order are drawn from generators
seeded by ``seed`` alone, so the same seed gives bit-identical parameters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from lmclab.archs import build_model
from lmclab.checkpoint import Checkpoint
from lmclab.data import Split
from lmclab.evaluate import evaluate


def check_training_options(*, epochs: int, lr: float, batch_size: int, n_train: int) -> None:
    """One-line errors for impossible options, raised before any training starts."""
    if epochs < 1:
        raise ValueError(f"train.epochs must be a positive number of epochs, got {epochs}")
    if lr <= 0:
        raise ValueError(f"train.lr must be positive, got {lr}")
    if not 1 <= batch_size <= n_train:
        raise ValueError(f"train.batch_size must be between 1 and the {n_train} training samples, "
                         f"got {batch_size}")


def train(arch: str, config: Any, seed: int, train_split: Split, test_split: Split, *,
          epochs: int, lr: float = 1e-3, batch_size: int = 512,
          device: torch.device = torch.device("cpu"), progress: bool = True
          ) -> tuple[Checkpoint, list[dict[str, float]]]:
    """Train with Adam and cross-entropy; return the checkpoint and one history row per epoch.

    History rows: ``epoch``, ``train_loss``/``train_acc`` (running means over the epoch's
    minibatches) and ``test_loss``/``test_acc`` (full test split, eval mode, after the epoch).
    """
    check_training_options(epochs=epochs, lr=lr, batch_size=batch_size, n_train=len(train_split))
    model = build_model(arch, config, seed=seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    data = train_split.to(device)
    history = []
    bar = tqdm(range(1, epochs + 1), desc=f"train seed {seed}", disable=not progress, leave=False)
    for epoch in bar:
        model.train()
        batches = torch.randperm(len(data), generator=order).split(batch_size)
        loss_sum, correct = 0.0, 0
        for idx in batches:
            idx = idx.to(device)
            logits = model(data.x[idx])
            loss = F.cross_entropy(logits, data.y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == data.y[idx]).sum().item()
        test = evaluate(model, dict(model.state_dict()), test_split)
        row = {"epoch": epoch, "train_loss": loss_sum / len(data), "train_acc": correct / len(data),
               "test_loss": test.loss, "test_acc": test.acc}
        history.append(row)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", test_acc=f"{test.acc:.3f}")
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return Checkpoint(arch, config, seed, state), history
