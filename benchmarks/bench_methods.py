"""Benchmark: how long each pair method's search takes, with its default options, on models of several sizes,
through the public API (``lmclab.find_permutation``) — the table of docs/methods.md, and ``make bench``.

Two independently initialised models per size (random weights: a search's time depends on the sizes and
on the number of sweeps or epochs, which the table reports; ``mlp_trained``: the default run's seeds 0 and
1 when ``data/models`` has them), float32, 2,000 random training inputs for the methods that read data.
``--repeats`` runs per method and size, alternating the methods (the median is reported; the slowest
take minutes). Written through ``benchmarks/record.py``.

    python benchmarks/bench_methods.py            # the docs' sizes, write benchmarks/results/methods.json
    python benchmarks/bench_methods.py --docs     # the docs table, from that JSON
    python benchmarks/bench_methods.py --sizes mlp_trained --methods wm,am --repeats 5 \
        --out benchmarks/scratch/search.json      # make bench
    python benchmarks/bench_methods.py --sizes resnet20x16,vgg11x4 --methods wm --threads 1 \
        --out benchmarks/scratch/conv_search.json # WM on the paper's conv nets (target: ResNet20 ×16 < 30 s)
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import typer
from record import record  # benchmarks/record.py: the one shape of a result
from torch import nn

import lmclab

ROOT = Path(__file__).resolve().parent.parent
OUT, DOCS = ROOT / "benchmarks" / "results" / "methods.json", ROOT / "docs" / "methods.md"
START = "<!-- method times: generated from benchmarks/results/methods.json by benchmarks/bench_methods.py --docs -->"
END = "<!-- end of method times -->"
SAMPLES = 2000


def mlp() -> nn.Module:
    """The paper's MNIST model: 3 hidden layers of 512."""
    return nn.Sequential(
        nn.Flatten(),
        *(m for i in range(3) for m in (nn.Linear(784 if i == 0 else 512, 512), nn.ReLU())),
        nn.Linear(512, 10),
    )


def resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=64)
    return transformers.GPT2LMHeadModel(config)


def conv(arch: str, width: float) -> Callable[[int], nn.Module]:
    """One of the paper's conv nets (lmclab's registry) at ``width``, on CIFAR-shaped inputs."""
    from lmclab.archs import build_model, make_config

    config = make_config(arch, input_shape=(3, 32, 32), num_classes=10, width_multiplier=width)
    return lambda seed: build_model(arch, config, seed=seed)


def trained_mlp(seed: int) -> nn.Module:
    """The default run's MLP of ``seed`` (data/models), or a random one when the run has not been made."""
    from lmclab.archs import build_model
    from lmclab.archs.checkpoint import load_checkpoint

    path = ROOT / "data" / "models" / f"seed{seed}.pt"
    if not path.is_file():
        return seeded(mlp)(seed)
    ckpt = load_checkpoint(path)
    model = build_model(ckpt.arch, ckpt.config)
    model.load_state_dict(ckpt.state_dict)
    return model


def seeded(build: Callable[[], nn.Module]) -> Callable[[int], nn.Module]:
    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build()

    return make


IMAGES = lambda n: torch.randn(n, 3, 32, 32)  # noqa: E731
DIGITS = lambda n: torch.randn(n, 1, 28, 28)  # noqa: E731
TRAINED = "MLP 3 × 512, trained (data/models seed0, seed1; random init if absent)"
# name -> (the table's label, the model of a seed, inputs of `n` samples, the methods measured by default)
SIZES: dict[str, tuple[str, Callable[[int], nn.Module], Callable[[int], torch.Tensor], tuple[str, ...]]] = {
    "mlp": ("MLP 3 × 512 (MNIST, 784 inputs)", seeded(mlp), DIGITS, ("wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn")),
    "resnet18": ("torchvision resnet18 (3 × 32 × 32)", seeded(resnet18), IMAGES, ("wm", "am", "ste", "wm_sinkhorn")),
    "gpt2": (
        "GPT-2, 4 layers, width 128 (64 tokens)",
        seeded(gpt2),
        lambda n: torch.randint(0, 256, (n, 64)),
        ("wm", "am"),
    ),
    "mlp_trained": (TRAINED, trained_mlp, DIGITS, ("wm", "am")),
    "resnet20x16": ("ResNet20 ×16 (3 × 32 × 32)", conv("resnet20", 16), IMAGES, ("wm",)),
    "vgg11x4": ("VGG11 ×4 (3 × 32 × 32)", conv("vgg", 4), IMAGES, ("wm",)),
}
DOCS_SIZES = ("mlp", "resnet18", "gpt2")  # the table of docs/methods.md


def measure(name: str, methods: list[str] | None, repeats: int) -> list[dict]:
    """Each method's search between the two models of size ``name``, ``repeats`` times alternating."""
    label, build, inputs, default = SIZES[name]
    a, b = build(0).eval(), build(1).eval()
    torch.manual_seed(0)
    x = inputs(SAMPLES)
    y = torch.randint(0, 10, (SAMPLES,)) if x.dim() > 2 else torch.roll(x, -1, 1)
    params = sum(p.numel() for p in a.parameters())
    seconds: dict[str, list[float]] = {m: [] for m in methods or default}
    steps: dict[str, dict] = {}
    for _ in range(repeats):
        for method in seconds:
            data = (x, y) if method in ("am", "ste", "ste_sinkhorn") else None
            start = time.perf_counter()
            found = lmclab.find_permutation(a, b, method=method, example_inputs=x[:2], data=data)
            seconds[method].append(round(time.perf_counter() - start, 2))
            steps[method] = {k: found.stats[k] for k in ("sweeps", "epochs", "best_epoch") if k in found.stats}
    rows = []
    for method, timed in seconds.items():
        median = statistics.median(timed)
        rows.append({"size": label, "params": params, "method": method, "seconds": median, "seconds_all": timed})
        rows[-1] |= steps[method]
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(data: dict) -> str:
    (run,) = data["runs"]  # the one shape of benchmarks/record.py
    machine = run["machine"]
    lines = [
        f"`{run['command']}` at commit `{run['commit']}` on {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['torch_threads']} torch threads ({run['date'][:10]}); default options, {SAMPLES:,} training inputs, "
        f"{_runs(data['rows'])}:",
        "",
        "| model | parameters | method | seconds | sweeps / epochs |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        steps = r.get("sweeps", r.get("epochs", "—"))
        lines.append(f"| {r['size']} | {r['params'] / 1e6:.2f} M | `{r['method']}` | {r['seconds']:.1f} | {steps} |")
    return "\n".join(lines)


def _runs(rows: list[dict]) -> str:
    counts = {len(r.get("seconds_all", [r["seconds"]])) for r in rows}
    return "one run each" if counts == {1} else f"median of {max(counts)} runs each, alternating"


def write_docs(page: Path, data: dict) -> None:
    text = page.read_text()
    head, rest = text.split(START)
    page.write_text(f"{head}{START}\n{table(data)}\n{END}{rest.split(END, 1)[1]}")


def main(
    docs: bool = typer.Option(False, help="only regenerate the docs table from the JSON"),
    sizes: str = typer.Option(",".join(DOCS_SIZES), help=f"comma-separated, of {', '.join(SIZES)}"),
    methods: str = typer.Option("", help="comma-separated methods (default: each size's own)"),
    repeats: int = typer.Option(1, min=1, help="runs of each method per size, alternating (the median is kept)"),
    threads: int = typer.Option(0, min=0, help="torch intra-op threads (0: torch's default)"),
    out: Path = typer.Option(OUT, help="the JSON; the docs table is written only from the default one"),
) -> None:
    names = [s for s in sizes.split(",") if s]
    unknown = sorted(set(names) - set(SIZES))
    if unknown or not names:
        raise SystemExit(f"error: --sizes: expected some of {', '.join(SIZES)}, got {sizes!r}")
    if threads:
        torch.set_num_threads(threads)
    if not docs:
        chosen = [m for m in methods.split(",") if m] or None
        record(out, [row for name in names for row in measure(name, chosen, repeats)], samples=SAMPLES)
    if out == OUT:
        write_docs(DOCS, json.loads(OUT.read_text()))


if __name__ == "__main__":
    typer.run(main)
