"""Benchmark: what ``lmclab match`` and ``lmclab merge`` cost in time and memory on Llama-style checkpoints as
researchers bring them — two Hugging Face folders of bfloat16 safetensors shards built from a config with random
weights (nothing downloaded), one a planted copy of the other's permutation or an independent initialisation.

    python benchmarks/bench_llm_memory.py --shape 155m

Each command runs in its own process, started by this one while it holds no model (Linux keeps a process's peak
across ``exec``: the folders are built in another child); its wall time and peak resident memory (``wait4``'s
``ru_maxrss``: every page the process held at once, the interpreter's imports included) are one row, beside the
size of one checkpoint folder. ``--phases`` adds, for ``match``, the peak after each step of :func:`lmclab.align`
(reading the weights, tracing, the search, the L2 reduction) in one more process: where the memory goes. Writes
``benchmarks/results/llm_memory.json`` (the shape's rows replaced, the others kept).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
from record import RESULTS, record, this_run  # benchmarks/record.py: the one shape of a result

# hidden, layers, MLP units, query heads, key/value heads, vocabulary: the 155.7 M model and TinyLlama's
SHAPES = {"155m": (1024, 8, 2816, 16, 4, 32000), "1b": (2048, 22, 5632, 32, 4, 32000)}
OUT = RESULTS / "llm_memory.json"


def build(shape: str, folder: Path) -> int:
    """Two folders ``a`` and ``b`` of the shape (independent random weights, bfloat16, 200 MB shards); their
    parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, mlp, heads, kv, vocab = SHAPES[shape]
    config = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
        num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=256,
    )  # fmt: skip
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(folder / name, max_shard_size="200MB")
        count = sum(p.numel() for p in model.parameters())
        del model
    return count


def measured(args: list[str], cwd: Path) -> dict:
    """Wall seconds and peak resident memory (GB) of ``args`` run as a child process in ``cwd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{args}: {err[-500:]}")
    return {"seconds": round(seconds, 1), "peak_gb": round(usage.ru_maxrss / 1e6, 2), "output": out.strip()[-300:]}


def phases(a: str, b: str) -> None:
    """Print, as JSON, the peak resident memory after each step of ``lmclab match a b`` (run in this process)."""
    import resource

    import lmclab
    import lmclab.api.functions as functions
    from lmclab.cli.inputs import load_pair, trace_inputs

    steps: list[dict] = []

    def mark(step: str) -> None:
        steps.append({"step": step, "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)})

    mark("imports")
    params_a, params_b, (net, _, _) = load_pair(Path(a), Path(b), None, "{}")
    mark("both folders read, the module built")
    for name in ("read_weights", "resolve", "run_search"):
        inner = getattr(functions, name)

        def wrapped(*args, _inner=inner, _name=name, **kwargs):
            result = _inner(*args, **kwargs)
            mark({"read_weights": "float32 copies", "resolve": "traced", "run_search": "searched"}[_name])
            return result

        setattr(functions, name, wrapped)
    res = lmclab.align(params_a, params_b, method="wm", model=net, example_inputs=trace_inputs(net, None))
    lmclab.l2_reduction(params_a, params_b, res)
    mark("L2 reduction")
    print(json.dumps(steps))


def main(
    shape: str = typer.Option("155m", help=f"one of {sorted(SHAPES)}"),
    phases_of: str = typer.Option(None, help="internal: A,B folders whose match steps to profile"),
    build_into: Path = typer.Option(None, help="internal: build the shape's two folders there"),
    with_phases: bool = typer.Option(True, "--phases/--no-phases", help="also profile match step by step"),
) -> None:
    if phases_of:
        return phases(*phases_of.split(","))
    if build_into:
        return print(build(shape, build_into))
    layout = dict(zip(("hidden", "layers", "mlp", "heads", "kv_heads", "vocab"), SHAPES[shape], strict=True))
    run = this_run(shape=shape, layout=layout)
    lmclab = [sys.executable, "-m", "lmclab"]
    with tempfile.TemporaryDirectory(prefix="lmclab-bench-") as tmp:  # mode 0700: this user only
        work = Path(tmp)
        made = [sys.executable, __file__, "--shape", shape, "--build-into", str(work)]
        params = int(subprocess.run(made, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        folder = sum(f.stat().st_size for f in (work / "a").iterdir()) / 1e9
        rows = []
        for step, args in (
            ("match", [*lmclab, "match", "a", "b", "--method", "wm", "--out", "perm.pt"]),
            ("merge", [*lmclab, "merge", "a", "b", "--alignment", "perm.pt", "--out", "merged"]),
        ):
            found = measured(args, work)
            rows.append({"shape": shape, "params": params, "checkpoint_gb": round(folder, 3), "command": step, **found})
            print(rows[-1], flush=True)
        profile = []
        if with_phases:
            child = [sys.executable, __file__, "--phases-of", "a,b"]
            done = subprocess.run(child, cwd=work, capture_output=True, text=True, check=True)
            profile = json.loads(done.stdout.strip().splitlines()[-1])
    record(OUT, rows, run={**run, "phases": profile}, keep=lambda r: r["shape"] != shape)


if __name__ == "__main__":
    typer.run(main)
