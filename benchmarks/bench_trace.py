"""Which torchvision classification models ``lmclab.trace.trace_spec`` supports, and how fast.

For each model (``weights=None, num_classes=10``, float64, eval mode): the time to trace it (symbolic
trace + one ShapeProp forward on ``--size`` pixels; median of ``--repeats``), and either the number
of groups and the largest relative change of the logits under a random permutation of the traced
spec, or the one-line refusal.

    python benchmarks/bench_trace.py [--size 64] [--repeats 3] [--models resnet18,resnet50,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from lmclab.spec import apply_permutation, random_permutation  # noqa: E402
from lmclab.trace import TraceError, trace_spec  # noqa: E402

MODELS = ("resnet18,resnet50,wide_resnet50_2,resnext50_32x4d,mobilenet_v2,mobilenet_v3_small,vgg11_bn,alexnet,"
          "densenet121,efficientnet_b0,regnet_x_400mf,shufflenet_v2_x0_5,squeezenet1_0,convnext_tiny,mnasnet0_5")


def invariance(name: str, model: torch.nn.Module, spec, x: torch.Tensor) -> float:
    state = model.state_dict()
    permuted = OrderedDict(apply_permutation(spec, random_permutation(spec.group_sizes(state),
                                                                      torch.Generator().manual_seed(0)), state))
    permuted._metadata = getattr(state, "_metadata", None)
    copy = getattr(torchvision.models, name)(weights=None, num_classes=10).double().eval()
    copy.load_state_dict(permuted)
    with torch.no_grad():
        y, y_perm = model(x), copy(x)
    return float((y - y_perm).abs().max() / y.abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=MODELS)
    args = parser.parse_args()
    print("| model | result | groups | trace s | max rel. change of the logits | refusal |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = getattr(torchvision.models, name)(weights=None, num_classes=10).double().eval()
        x = torch.randn(2, 3, args.size, args.size, dtype=torch.float64)
        times, spec, refusal = [], None, ""
        for _ in range(args.repeats):
            start = time.perf_counter()
            try:
                spec = trace_spec(model, x)
            except TraceError as exc:
                refusal = str(exc).split("cannot be proved permutation-equivariant")[-1].strip(" ;")[:90]
                refusal = refusal or str(exc)[:90]
            times.append(time.perf_counter() - start)
        seconds = f"{statistics.median(times):.2f}"
        if spec is None:
            print(f"| {name} | refused | — | {seconds} | — | {refusal} |", flush=True)
        else:
            print(f"| {name} | supported | {len(spec.groups)} | {seconds} | {invariance(name, model, spec, x):.1e} | |",
                  flush=True)


if __name__ == "__main__":
    main()
