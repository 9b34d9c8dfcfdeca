"""Which torchvision classification models ``lmclab.trace.trace_spec`` supports, and how fast.

For each model (``num_classes=10``, float64, eval mode, the random weights and BatchNorm statistics of
``tests/trace/test_trace.py``): the time to trace it (symbolic
trace + one ShapeProp forward on ``--size`` pixels; median of ``--repeats``), and either the number
of groups and the largest relative change of the logits under a random permutation of the traced
spec, or the one-line refusal.

    python benchmarks/bench_trace.py [--size 64] [--repeats 3] [--models resnet18,resnet50,...]
    python benchmarks/bench_trace.py --wm-vs-hand [--repeats 3]

``--wm-vs-hand``: weight matching between two random ResNet20 ×``--width`` (seeds 0, 1) on the hand-written
spec and on the traced one, alternating, median seconds of each. Same groups ⇒ same work per assignment;
WM visits groups in a random order of their sorted names, so with the traced names (P_0, P_1, …) it takes
another path (other sweeps, another local optimum); renamed as the hand spec's, it is the same search.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from lmclab.trace import TraceError, trace_spec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test fixtures

from test_trace import permuted_copy, randomised  # noqa: E402  (the tests' random weights and permuted copies)

MODELS = (
    "resnet18,resnet50,wide_resnet50_2,resnext50_32x4d,mobilenet_v2,mobilenet_v3_small,vgg11_bn,alexnet,"
    "densenet121,efficientnet_b0,googlenet,regnet_x_400mf,regnet_y_400mf,shufflenet_v2_x0_5,squeezenet1_0,convnext_tiny,"
    "mnasnet0_5,swin_t,vit_b_16"
)


def invariance(name: str, model: torch.nn.Module, spec, x: torch.Tensor) -> float:
    """Largest change of the logits under a random permutation, relative to their largest magnitude."""
    copy, _ = permuted_copy(name, model, spec, seed=1)
    with torch.no_grad():
        y, y_perm = model(x), copy(x)
    return float((y - y_perm).abs().max() / y.abs().max())


def renamed(spec, like):
    """``spec`` with its groups named as the groups of ``like`` that act on the same (parameter, axis) pairs."""
    from lmclab.core.spec import PermutationSpec

    names = {g: h for g, places in spec.groups.items() for h, other in like.groups.items() if set(places) == set(other)}
    return PermutationSpec(
        axes={k: tuple(names.get(e, e) for e in axes) for k, axes in spec.axes.items()}, stats=spec.stats
    )


def wm_vs_hand(repeats: int, width: int) -> None:
    from lmclab.archs import build_model, get_arch, make_config
    from lmclab.search.weight_matching import weight_matching

    config = make_config("resnet20", input_shape=(3, 32, 32), num_classes=10, width_multiplier=width)
    params_a = build_model("resnet20", config, seed=0).state_dict()
    params_b = build_model("resnet20", config, seed=1).state_dict()
    hand = get_arch("resnet20").permutation_spec(config)
    traced = trace_spec(build_model("resnet20", config), torch.zeros(2, 3, 32, 32))
    specs = {
        "hand": hand,
        "traced, groups renamed as the hand spec's": renamed(traced, hand),
        "traced, groups P_0, P_1, …": traced,
    }
    times: dict[str, list[float]] = {k: [] for k in specs}
    for _ in range(repeats):
        for kind, spec in specs.items():
            start = time.perf_counter()
            weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
            times[kind].append(time.perf_counter() - start)
    print(
        f"| WM on ResNet20 ×{width} | median s | ratio to hand | sweeps | assignments | objective |\n"
        "|---|---|---|---|---|---|"
    )
    for kind, spec in specs.items():  # one more run each for the stats (deterministic)
        stats = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0)).stats
        seconds = statistics.median(times[kind])
        print(
            f"| {kind} | {seconds:.2f} | {seconds / statistics.median(times['hand']):.2f} | {stats['sweeps']} | "
            f"{stats['assignments']} | {stats['objective'][-1]:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--wm-vs-hand", action="store_true")
    parser.add_argument("--width", type=int, default=16, help="ResNet20 width multiplier for --wm-vs-hand")
    args = parser.parse_args()
    if args.wm_vs_hand:
        return wm_vs_hand(args.repeats, args.width)
    print("| model | result | groups | trace s | max rel. change of the logits | refusal |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        try:
            model = randomised(name, args.size)  # He weights, BN statistics of a random batch: logits depend on x
        except Exception as exc:  # the model does not run at this size (ViT wants 224 pixels)
            print(
                f"| {name} | refused | — | — | — | does not run on {args.size} × {args.size}: "
                f"{' '.join(str(exc).split())[:60]} |",
                flush=True,
            )
            continue
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
            print(
                f"| {name} | supported | {len(spec.groups)} | {seconds} | {invariance(name, model, spec, x):.1e} | |",
                flush=True,
            )


if __name__ == "__main__":
    main()
