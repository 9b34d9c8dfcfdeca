"""Benchmark: what ``lmclab match`` and ``lmclab merge`` cost in time and memory on Llama-style checkpoints as
researchers bring them — Hugging Face folders of bfloat16 safetensors shards built from a config with random
weights (nothing downloaded): ``a``, ``b`` (an independent initialisation) and ``p`` (a planted copy: ``a``
moved by a random permutation of every group its traced spec has).

    python benchmarks/bench_llm_memory.py --shape 155m --in-memory --rotated 5
    python benchmarks/bench_llm_memory.py --shape 1b
    python benchmarks/bench_llm_memory.py --shape 3b    # checks the projection (13.7 GB of folders)

Each command runs in its own process, started by this one while it holds no model (Linux keeps a process's peak
across ``exec``: the folders are built in another child); its wall time and peak resident memory (``wait4``'s
``ru_maxrss``: every page the process held at once, the interpreter's imports included) are one row, beside the
size of one checkpoint folder, for the independent and the planted pair on the streamed path (``--stream``) and,
with ``--in-memory``, the independent pair on the in-memory one (``--no-stream``: the path before streaming), and
with ``--rotated N`` the independent pair by orthogonal maps (``--symmetry orthogonal``, N sweeps at most). The
command's own line gives the search's seconds, its sweeps and the bytes it read. A last child checks that the
planted copy was recovered exactly (π(θp) = θa in every entry) and that ``from_pretrained`` loads the merged
folder. ``BENCH_TMP`` chooses the disk the folders go to. Writes ``benchmarks/results/llm_memory.json`` (the
shape's rows replaced, the others kept).
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

# hidden, layers, MLP units, query heads, key/value heads, vocabulary: a 155.7 M model, TinyLlama's and OpenLLaMA 3B's
SHAPES = {
    "155m": (1024, 8, 2816, 16, 4, 32000),
    "1b": (2048, 22, 5632, 32, 4, 32000),
    "3b": (3200, 26, 8640, 32, 32, 32000),
}
# the shapes projected (Llama-2 7B and 70B), beside the measured ones
PROJECTED = {**SHAPES, "7b": (4096, 32, 11008, 32, 32, 32000), "70b": (8192, 80, 28672, 64, 8, 32000)}
GPU_FLOPS = 19.5e12  # an A100's float32 peak (not tensor cores): the projection's GPU, assumed — none here
OUT = RESULTS / "llm_memory.json"


def build(shape: str, folder: Path) -> int:
    """Folders ``a`` and ``b`` of the shape (independent random weights, bfloat16, 200 MB shards) and ``p``, a's
    planted copy (every group of its traced spec moved by a random permutation, heads whole; the permutation in
    ``planted.pt``); the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmclab.api.hf import example_inputs
    from lmclab.core.spec import apply_permutation, random_permutation
    from lmclab.trace import trace

    hidden, layers, mlp, heads, kv, vocab = SHAPES[shape]
    config = LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
        num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(folder / name, max_shard_size="200MB")
        count = sum(p.numel() for p in model.parameters())
        if name == "a":
            with torch.device("meta"):
                skeleton = LlamaForCausalLM(config).eval()
            spec = trace(skeleton, example_inputs(skeleton, None).to("meta")).spec
            state = model.state_dict()
            perm = random_permutation(spec.group_sizes(state), torch.Generator().manual_seed(2), spec.heads)
            model.load_state_dict(apply_permutation(spec, perm, state))
            model.save_pretrained(folder / "p", max_shard_size="200MB")
            torch.save(perm, folder / "planted.pt")
        del model
    return count


def check(a: str, p: str, alignment: str, merged: str) -> None:
    """Print, as JSON, whether the alignment of ``p`` to ``a`` recovers it exactly (π(θp) = θa in every entry,
    read one at a time) and whether transformers' ``from_pretrained`` loads the merged folder."""
    import torch
    from transformers import LlamaForCausalLM

    from lmclab.api import load_alignment
    from lmclab.api.folders import open_folders
    from lmclab.core.spec import permute_entry

    found = load_alignment(alignment)
    streamed = open_folders([Path(a), Path(p)], ["a", "p"], torch.device("cpu"))
    weights_a, weights_p = streamed.weights
    worst = max(
        float((weights_a[k] - permute_entry(found.spec, found.perm, k, weights_p[k])).abs().max()) for k in weights_a
    )
    loads = LlamaForCausalLM.from_pretrained(merged) is not None
    print(json.dumps({"recovered": worst == 0.0, "largest_difference": worst, "merged_loads": loads}))


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


def project() -> list[dict]:
    """The cost model (:mod:`lmclab.search.wm_estimate`) on each shape of :data:`PROJECTED`, traced on the meta
    device with this machine's rates measured on the spot: a sweep's products and seconds on this CPU and on one
    GPU (:data:`GPU_FLOPS`, the assignments still on this CPU), and the streamed search's memory beyond the
    process's (the process's own: the measured shapes' imports and trace)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmclab.api.hf import example_inputs
    from lmclab.search.wm_estimate import LAP_EXPONENT, calibrate, estimate
    from lmclab.trace import trace

    rates, rows = calibrate(), []
    for shape, (hidden, layers, mlp, heads, kv, vocab) in PROJECTED.items():
        config = LlamaConfig(
            hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
            num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=256,
        )  # fmt: skip
        with torch.device("meta"):
            model = LlamaForCausalLM(config).eval()
        spec = trace(model, example_inputs(model, None).to("meta")).spec
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        found = estimate(spec, shapes, rates)
        sizes = spec.group_sizes({k: torch.empty(s, device="meta") for k, s in shapes.items()})
        lap = sum(rates[1] * (n / 1024) ** LAP_EXPONENT for n in sizes.values())
        params = sum(v.numel() for v in shapes.values())
        rows.append({"shape": shape, "params": params, "checkpoint_gb": 2 * params / 1e9, "groups": found.groups})
        rows[-1] |= {"tflop_per_sweep": found.flops / 1e12, "cpu_s_per_sweep": found.seconds}
        rows[-1] |= {"gpu_s_per_sweep": found.flops / GPU_FLOPS + lap, "search_gb": found.bytes / 1e9}
        print(rows[-1], flush=True)
    return [{"cpu_flops": rates[0], "lap_1024_s": rates[1], "gpu_flops": GPU_FLOPS}, *rows]


def main(
    shape: str = typer.Option("155m", help=f"one of {sorted(SHAPES)}"),
    build_into: Path = typer.Option(None, help="internal: build the shape's folders there"),
    check_of: str = typer.Option(None, help="internal: A,P,ALIGNMENT,MERGED to check"),
    in_memory: bool = typer.Option(False, help="also time the in-memory path (--no-stream)"),
    projection: bool = typer.Option(False, help="only the cost model's projection to every shape (no run)"),
    rotated: int = typer.Option(0, help="also match the independent pair by orthogonal maps, this many sweeps at most"),
) -> None:
    if projection:  # every measured row kept with its run; the projection's own run beside them
        rates, *rows = project()
        return record(OUT, [], run=this_run(projection=True), keep=lambda r: True, projection=rows, rates=rates)
    if check_of:
        return check(*check_of.split(","))
    if build_into:
        return print(build(shape, build_into))
    layout = dict(zip(("hidden", "layers", "mlp", "heads", "kv_heads", "vocab"), SHAPES[shape], strict=True))
    run = this_run(shape=shape, layout=layout)
    lmclab = [sys.executable, "-m", "lmclab"]
    with tempfile.TemporaryDirectory(prefix="lmclab-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:  # mode 0700
        work = Path(tmp)
        made = [sys.executable, __file__, "--shape", shape, "--build-into", str(work)]
        params = int(subprocess.run(made, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        folder = sum(f.stat().st_size for f in (work / "a").iterdir()) / 1e9
        rows, checks = [], {}
        runs = [("independent", "b", "--stream", []), ("planted", "p", "--stream", [])]
        runs += [("independent", "b", "--no-stream", [])] * in_memory
        runs += [("independent", "b", "--stream", ["--symmetry", "orthogonal", "--option", f"max_iter={rotated}"])] * (
            rotated > 0
        )
        for pair, b, path, extra in runs:
            for step, args in (
                ("match", [*lmclab, "match", "a", b, "--method", "wm", "--out", f"{b}.pt", path, *extra]),
                ("merge", [*lmclab, "merge", "a", b, "--alignment", f"{b}.pt", "--out", f"merged-{b}", path]),
            ):
                found = measured(args, work)
                row = {"shape": shape, "params": params, "checkpoint_gb": round(folder, 3), "pair": pair}
                symmetry = f"orthogonal, {rotated} sweeps at most" if extra else "permutation"
                rows.append(row | {"path": path.strip("-"), "symmetry": symmetry, "command": step, **found})
                print(rows[-1], flush=True)
            if pair == "planted":
                child = [sys.executable, __file__, "--check-of", f"a,{b},{b}.pt,merged-{b}"]
                done = subprocess.run(child, cwd=work, capture_output=True, text=True, check=True)
                checks = json.loads(done.stdout.strip().splitlines()[-1])
                print(checks, flush=True)
            subprocess.run(["rm", "-rf", f"merged-{b}"], cwd=work, check=True)
    kept = (
        {k: v for k, v in json.loads(OUT.read_text()).items() if k in ("projection", "rates")} if OUT.is_file() else {}
    )
    record(OUT, rows, run={**run, "planted_check": checks}, keep=lambda r: r["shape"] != shape, **kept)


if __name__ == "__main__":
    typer.run(main)
