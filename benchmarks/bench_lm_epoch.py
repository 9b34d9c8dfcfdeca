"""Seconds per training epoch of the language-model preset and of the candidates it was chosen from: a byte-level
GPT of depth 4 and 4 heads at widths 64 (``presets/pydoc_gpt.yaml``), 128 and 256 on pydoc (context 64),
measured in one run, alternating (lone timings drift by half on a shared machine).

    python benchmarks/bench_lm_epoch.py [--repeats 3] [--out benchmarks/results/lm_epoch.json]

Each repeat times one epoch of next-token training of each width from the library's ``train`` (the test
evaluation after the epoch included, as in the pipeline) with the preset's batch size and learning rate; the
median of the repeats is reported. The performance page generates its table from the result.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from record import record, this_run  # benchmarks/record.py: the one shape of a result

from lmclab.archs import make_config
from lmclab.core.data import load_split, prepare
from lmclab.pipeline.stage import parse_yaml
from lmclab.train.training import train

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (64, 128, 256)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lm_epoch.json")
    args = parser.parse_args()
    preset = parse_yaml((ROOT / "presets" / "pydoc_gpt.yaml").read_text())
    data, gpt, opts = preset["data"], preset["model"]["gpt"], preset["train"]
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare(data["name"], Path(tmp), Path(tmp) / "prepared", context=data["context"])
        splits = {s: load_split(Path(tmp) / "prepared", s) for s in ("train", "test")}
    times: dict[str, list[float]] = {str(w): [] for w in WIDTHS}
    for _ in range(args.repeats):
        for width in WIDTHS:
            config = make_config(
                "gpt", input_shape=meta["input_shape"], num_classes=meta["num_classes"], **(gpt | {"width": width})
            )
            start = time.perf_counter()
            train(
                "gpt",
                config,
                0,
                splits["train"],
                splits["test"],
                epochs=1,
                lr=opts["lr"],
                batch_size=opts["batch_size"],
            )
            times[str(width)].append(time.perf_counter() - start)
    preset = {"width": gpt["width"], "depth": gpt["depth"], "heads": gpt["heads"], "context": data["context"]}
    windows = {"train": meta["n_train"], "test": meta["n_test"]}
    run = this_run(preset=preset, windows=windows, batch_size=opts["batch_size"])
    rows = [{"width": int(w), "seconds_per_epoch": sorted(v)[len(v) // 2], "all": v} for w, v in times.items()]
    record(args.out, rows, run=run)
    print(json.dumps({r["width"]: r["seconds_per_epoch"] for r in rows}))


if __name__ == "__main__":
    main()
