"""The authors' Sinkhorn re-basin and lmclab side by side, in one process, interleaved per repeat.

The reference (github.com/fagp/sinkhorn-rebasin, commit 1c601d4) is *not* part of lmclab: check it
out anywhere outside the project and pass its folder; its package needs ``torchviz`` and
``graphviz`` (pure Python; e.g. ``pip install --target /tmp/ref-site torchviz graphviz`` and
``--site /tmp/ref-site``). The reference runs exactly as its examples do (``RebasinNet``,
``DistL2Loss`` / ``MidLoss``, its optimisers); the pair, the settings of lmclab's side and the
scoring of both final permutations come from ``bench_sinkhorn.py``.

    python benchmarks/bench_sinkhorn_reference.py --reference /tmp/sinkhorn-rebasin \\
        --site /tmp/ref-site --which wm --repeats 3      # DistL2Loss vs wm_sinkhorn (~15 min)
    python benchmarks/bench_sinkhorn_reference.py ... --which mid --repeats 5   # MidLoss vs ste_sinkhorn (fp32, bf16)

Prints one JSON row per run (``curve``: objective and seconds after each reference epoch, and after
each of lmclab's). ``wm_sinkhorn`` runs three times per repeat: with its defaults (the reference's 1,000
steps, scored every 10, stopped after 10 scores without a better one), with the fixed schedule
(``patience: None``), and started at coordinate-descent weight matching's permutation (``init: wm``; its
seconds include that search). With ``--out`` the rows are also written there as JSON with the command, commit,
date and machine, and each DistL2 row gets ``time_to_target_s``: the seconds until its curve first
reached the final ⟨θa, π(θb)⟩ of the reference in the same repeat (the performance page's Sinkhorn table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sinkhorn as bench
from record import record  # benchmarks/record.py: the one shape of a result


def reference_perm(rebasin_net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The reference's hard permutation (its ``matching`` on each ``P``) as an lmclab permutation."""
    perm = {}
    for i, p in enumerate(rebasin_net.p):
        rows, cols = linear_sum_assignment(-p.detach().cpu().numpy())
        perm[f"P_{i}"] = torch.from_numpy(cols[rows.argsort()]).long()
    return perm


def _models(pair: bench.Pair) -> tuple[torch.nn.Module, torch.nn.Module]:
    model_a, model_b = pair.model(), pair.model()
    model_a.load_state_dict(pair.params_a)
    model_b.load_state_dict(pair.params_b)
    return model_a, model_b


def reference_wm(pair: bench.Pair, seed: int, epochs: int = 10, iterations: int = 100) -> dict:
    """DistL2Loss: Adam lr 1 on ``RebasinNet(θb)`` towards θa, the paper's 10 × 100 steps."""
    from rebasin import RebasinNet
    from rebasin.loss import DistL2Loss

    torch.manual_seed(seed)
    model_a, model_b = _models(pair)
    net, loss_fn = RebasinNet(model_b, input_shape=(1, 784)), DistL2Loss(model_a)
    optimizer = torch.optim.Adam(net.p.parameters(), lr=1.0)
    curve, spent = [], 0.0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        net.train()
        for _ in range(iterations):
            loss = loss_fn(net())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        spent += time.perf_counter() - start
        objective = bench.matching_objective(pair.spec, reference_perm(net), pair.params_a, pair.params_b)
        curve.append({"epoch": epoch, "objective": objective, "seconds": spent})
    return {
        "method": "reference DistL2Loss",
        "seed": seed,
        "seconds": spent,
        **pair.score(reference_perm(net)),
        "curve": curve,
    }


def reference_mid(pair: bench.Pair, seed: int, epochs: int = 5) -> dict:
    """MidLoss as the authors' MLP example: AdamW lr 0.1, a shuffled DataLoader of batch 512."""
    from rebasin import RebasinNet
    from rebasin.loss import MidLoss

    torch.manual_seed(seed)
    model_a, model_b = _models(pair)
    net = RebasinNet(model_b, input_shape=(1, 784))
    loss_fn = MidLoss(model_a, criterion=torch.nn.CrossEntropyLoss())
    optimizer = torch.optim.AdamW(net.p.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(pair.train.x, pair.train.y)
    loader = torch.utils.data.DataLoader(data, batch_size=512, shuffle=True)
    start, steps = time.perf_counter(), 0
    for _ in range(epochs):
        net.train()
        for x, y in loader:
            loss = loss_fn(net(), x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    spent = time.perf_counter() - start
    return {
        "method": "reference MidLoss",
        "seed": seed,
        "seconds": spent,
        "steps": steps,
        **pair.score(reference_perm(net)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="checkout of fagp/sinkhorn-rebasin")
    parser.add_argument("--site", type=Path, help="folder with torchviz and graphviz, if not installed")
    parser.add_argument("--data-dir", type=Path, default=bench.ROOT / "data")
    parser.add_argument("--cache", type=Path, default=bench.ROOT / "data" / "bench_pair_mlp_30ep.pt")
    parser.add_argument("--which", choices=["wm", "mid"], default="wm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the rows there, with the command, commit and machine")
    args = parser.parse_args()
    sys.path[:0] = [str(args.reference)] + ([str(args.site)] if args.site else [])
    pair = bench.Pair(args.data_dir, args.cache)
    # the first optimiser of a process imports torch._dynamo (~1.5 s): pay it before timing
    bench.run(pair, "wm_sinkhorn", 99, epochs=1, iterations=2)
    reference_wm(pair, 99, epochs=1, iterations=2)
    if args.which == "mid":  # and the first bfloat16 products compile their kernels
        reference_mid(pair, 99, epochs=1)
        for precision in ("fp32", "bf16"):
            bench.run(pair, "ste_sinkhorn", 99, epochs=1, precision=precision)
    written = []
    for seed in range(args.repeats):
        if args.which == "wm":
            rows = [
                reference_wm(pair, seed),
                bench.run(pair, "wm_sinkhorn", seed),
                {**bench.run(pair, "wm_sinkhorn", seed, patience=None), "method": "wm_sinkhorn, fixed schedule"},
                {**bench.run(pair, "wm_sinkhorn", seed, init="wm"), "method": "wm_sinkhorn, init wm"},
            ]
            for row in rows:
                row["time_to_target_s"] = bench.time_to(row["curve"], rows[0]["objective"])
        else:
            rows = [
                reference_mid(pair, seed),
                bench.run(pair, "ste_sinkhorn", seed),
                {**bench.run(pair, "ste_sinkhorn", seed, precision="bf16"), "method": "ste_sinkhorn, bf16"},
            ]
        for row in rows:
            print(json.dumps(row), flush=True)
        written += rows
        if args.out:
            _write(args.out, written)


def _write(out: Path, rows: list[dict]) -> None:
    record(out, rows)  # benchmarks/record.py: the command, commit, date and machine beside the rows


if __name__ == "__main__":
    main()
