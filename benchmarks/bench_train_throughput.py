"""Training throughput (images/s) of one architecture on the mnist5k digits.

    python benchmarks/bench_train_throughput.py [--arch resnet20] [--width 1] [--epochs 1]

Trains with the library's ``train`` (Adam, batch 512, no augmentation) and reports images per
second over the training steps of the last epoch (the per-epoch test evaluation excluded).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from lmclab.archs import build_model, make_config
from lmclab.core.data import load_split, prepare
from lmclab.train.training import make_optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="resnet20")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare("mnist5k", Path(tmp) / "raw", Path(tmp) / "prepared")
        train = load_split(Path(tmp) / "prepared", "train")
    config = make_config(args.arch, input_shape=meta["input_shape"], num_classes=10, width_multiplier=args.width)
    model = build_model(args.arch, config, seed=0).train()
    opt = make_optimizer(model.parameters(), optimizer="adam", lr=1e-3, momentum=0.9, weight_decay=0.0)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    seen, start = 0, None
    for step in range(args.steps + 1):  # step 0 is warm-up, not timed
        idx = order[(step * args.batch_size) % (len(train) - args.batch_size) :][: args.batch_size]
        loss = torch.nn.functional.cross_entropy(model(train.x[idx]), train.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if start is None:
            start = time.perf_counter()
        else:
            seen += len(idx)
    seconds = time.perf_counter() - start
    print(
        {
            "arch": args.arch,
            "width": args.width,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "images": seen,
            "seconds": round(seconds, 2),
            "images_per_s": round(seen / seconds, 1),
        }
    )


if __name__ == "__main__":
    main()
