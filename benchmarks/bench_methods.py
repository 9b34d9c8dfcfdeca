"""Benchmark: how long each pair method takes, with its default options, on models of several sizes,
through the public API (``lmclab.find_permutation``) — the table of docs/methods.md.

Two independently initialised models per size (random weights: a search's time depends on the sizes and
on the number of sweeps or epochs, which the table reports), float32, 2,000 random training inputs for the
methods that read data. One run per method and size (the slowest take minutes); the machine, the torch
thread count and the commit are recorded beside the figures.

    .venv/bin/python benchmarks/bench_methods.py            # measure, write benchmarks/results/methods.json
    .venv/bin/python benchmarks/bench_methods.py --docs     # the docs table, from that JSON
"""

from __future__ import annotations

import json
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


PAIR = ("wm", "am", "ste", "wm_sinkhorn")
# name -> (builder, inputs of `n` samples, the methods measured)
SIZES: dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor], tuple[str, ...]]] = {
    "MLP 3 × 512 (MNIST, 784 inputs)": (
        mlp,
        lambda n: torch.randn(n, 1, 28, 28),
        ("wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"),
    ),
    "torchvision resnet18 (3 × 32 × 32)": (
        resnet18,
        lambda n: torch.randn(n, 3, 32, 32),
        ("wm", "am", "ste", "wm_sinkhorn"),
    ),
    "GPT-2, 4 layers, width 128 (64 tokens)": (gpt2, lambda n: torch.randint(0, 256, (n, 64)), ("wm", "am")),
}


def measure(name: str) -> list[dict]:
    build, inputs, methods = SIZES[name]
    torch.manual_seed(0)
    a, b = build().eval(), build().eval()
    x = inputs(SAMPLES)
    y = torch.randint(0, 10, (SAMPLES,)) if x.dim() > 2 else torch.roll(x, -1, 1)
    params = sum(p.numel() for p in a.parameters())
    rows = []
    for method in methods:
        data = (x, y) if method in ("am", "ste", "ste_sinkhorn") else None
        start = time.perf_counter()
        found = lmclab.find_permutation(a, b, method=method, example_inputs=x[:2], data=data)
        seconds = time.perf_counter() - start
        steps = {k: found.stats[k] for k in ("sweeps", "epochs", "best_epoch") if k in found.stats}
        rows.append({"size": name, "params": params, "method": method, "seconds": round(seconds, 2)} | steps)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(data: dict) -> str:
    (run,) = data["runs"]  # the one shape of benchmarks/record.py
    machine = run["machine"]
    lines = [
        f"`{run['command']}` at commit `{run['commit']}` on {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['torch_threads']} torch threads ({run['date'][:10]}); default options, {SAMPLES:,} training inputs, "
        "one run each:",
        "",
        "| model | parameters | method | seconds | sweeps / epochs |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        steps = r.get("sweeps", r.get("epochs", "—"))
        lines.append(f"| {r['size']} | {r['params'] / 1e6:.2f} M | `{r['method']}` | {r['seconds']:.1f} | {steps} |")
    return "\n".join(lines)


def write_docs(page: Path, data: dict) -> None:
    text = page.read_text()
    head, rest = text.split(START)
    page.write_text(f"{head}{START}\n{table(data)}\n{END}{rest.split(END, 1)[1]}")


def main(docs: bool = typer.Option(False, help="only regenerate the docs table from the JSON")) -> None:
    if not docs:
        record(OUT, [row for name in SIZES for row in measure(name)])
    write_docs(DOCS, json.loads(OUT.read_text()))


if __name__ == "__main__":
    typer.run(main)
