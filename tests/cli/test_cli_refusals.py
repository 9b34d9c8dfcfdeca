"""The ``lmclab`` command's refusals, in a folder outside the repository: each bad argument, file, shape or
output path is one line on stderr and exit code 1, before any work and without writing anything; and
the checkpoint layouts a researcher brings (nested, safetensors) read as the same model. The refusals run the
command's app in this process (typer's runner: the same code, without a shell's ~2.7 s of imports each);
tests/cli/test_cli.py runs the installed command from a shell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_cli import lmclab, make_work


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_work(tmp_path_factory.mktemp("cli_refusals"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a.pt"], "error: MODELS: expected at least 2 model files, got 1"),
        (
            ["a.pt", "b.pt", "--method", "wm"],
            "error: --method: unknown n-model method 'wm'; expected one of ['merge_many', 'c2m3', 'sync', "
            "'star', 'cca', 'zipit']",
        ),
        (
            ["a.pt", "b.pt", "--method", "cca"],
            "error: --data: method 'cca' reads activations; give a data set name or prepared folder",
        ),
        (
            ["a.pt", "b.pt", "--repair", "auto"],
            "error: --data: --repair auto measures statistics; give a data set name or prepared folder",
        ),
        (
            ["a.pt", "b.pt", "--method", "zipit", "--option", "partial_zip=1"],
            "error: --option partial_zip: a partial zip is one network per model, no single model to write",
        ),
        (
            ["a.pt", "b.pt", "--option", "seed=1"],
            "error: --option: unknown option(s) ['seed']; expected some of ['lap_backend', 'max_iter', "
            "'tol', 'wm_max_iter']",
        ),
        (["a.pt", "b.pt", "--option", "max_iter=0"], "error: --option max_iter must be a positive integer, got 0"),
        (
            ["a.pt", "b.pt", "--input-shape", "1,28,28"],
            "error: a.pt: a plain state dict needs --factory module:callable to build its module",
        ),
        (
            ["a.pt", "b.pt", "--factory", "nets:mlp"],
            "error: --input-shape: needed with --factory to trace the spec (or give --data)",
        ),
        (
            ["a.pt", "b.pt", "wide.pt", "--factory", "nets:mlp", "--input-shape", "1,28,28"],
            "error: wide.pt: tensor '1.weight' has shape (32, 784), a.pt's (16, 784)",  # the file, not its index
        ),
    ],
)
def test_merge_many_refuses_bad_input_in_one_line(work: Path, args: list[str], message: str) -> None:
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    torch.save(mlp(width=32).state_dict(), work / "wide.pt")
    err = lmclab(work, "merge-many", *args, "--out", "never.pt", ok=False, shell=False).stderr
    assert err == f"{message}\n", err
    assert not (work / "never.pt").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["match", "missing.pt", "b.pt", "--out", "x.pt"], "error: missing.pt: file not found"),
        (["match", "a.pt", "missing.pt", "--out", "x.pt"], "error: missing.pt: file not found"),
        (["merge", "a.pt", "gone.pt", "--out", "x.pt"], "error: gone.pt: file not found"),
        (["merge", "gone.pt", "b.pt", "--out", "x.pt"], "error: gone.pt: file not found"),
        (
            ["match", "a.pt", "b.pt", "--out", "x.pt"],
            "error: a.pt: a plain state dict needs --factory module:callable to build its module",
        ),
        (
            ["match", "a.pt", "b.pt", "--factory", "nets:mlp", "--input-shape", "1,x", "--out", "x.pt"],
            "error: --input-shape: expected positive integers separated by commas, got '1,x'",
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
            "error: --option max_iter must be a positive integer, got 0",
        ),
        (
            ["barrier", "a.pt", "b.pt", "--factory", "nets:mlp", "--data", "nowhere"],
            "error: --data: expected one of ['cifar10', 'fashion_mnist', 'mnist', 'mnist5k'] or a prepared "
            "data folder, got 'nowhere'",
        ),
        (["--threads", "0", "validate", "x.yaml"], "error: --threads: expected auto or a positive integer, got '0'"),
        (
            ["match", "a.pt", "b.pt", "--method", "am", "--out", "x.pt"],
            "error: --data: method 'am' reads training data; give a data set name or prepared folder",
        ),
        (
            [
                "barrier",
                "a.pt",
                "b.pt",
                "--factory",
                "nets:mlp",
                "--alignment",
                "a.pt",
                "--input-shape",
                "1,28,28",
                "--data",
                "digits",
            ],
            "error: a.pt: expected an alignment written by `lmclab match` or Alignment.save (format "
            "lmclab-alignment-2)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(work: Path, args: list[str], message: str) -> None:
    err = lmclab(work, *args, ok=False, shell=False).stderr
    assert err == f"{message}\n", err


@pytest.fixture(scope="module")
def broken(work: Path) -> Path:
    """Files a researcher may hand the command by mistake, beside the good ones."""
    from safetensors.torch import save_file

    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    torch.save(mlp(width=32).state_dict(), work / "wide.pt")
    torch.save(mlp(width=32).state_dict(), work / "wide_b.pt")
    good = (work / "a.pt").read_bytes()
    (work / "truncated.pt").write_bytes(good[: len(good) // 2])
    torch.save(mlp(), work / "module.pt")  # the pickled module, not its state dict
    save_file(torch.load(work / "a.pt"), str(work / "a.safetensors"))
    tensors = (work / "a.safetensors").read_bytes()
    (work / "truncated.safetensors").write_bytes(tensors[:-7])
    (work / "text.safetensors").write_text("not a safetensors file")
    torch.save({"model": torch.load(work / "a.pt"), "epoch": 3}, work / "nested.pt")
    return work


FACTORY = ["--factory", "nets:mlp", "--input-shape", "1,28,28"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["match", "a.pt", "wide.pt", *FACTORY],
            "error: wide.pt: tensor '1.weight' has shape (32, 784), a.pt's (16, 784)",
        ),
        (
            ["match", "wide.pt", "wide.pt", *FACTORY],
            "error: wide.pt: tensor '1.weight' has shape (32, 784), the module of --factory nets:mlp's (16, 784)",
        ),
        (
            ["match", "a.pt", "b.pt", "--factory", "nets:mlp", "--kwargs", '{"width": 8}', "--input-shape", "1,28,28"],
            "error: a.pt: tensor '1.weight' has shape (16, 784), the module of --factory nets:mlp's (8, 784)",
        ),
        (
            ["match", "truncated.pt", "b.pt", *FACTORY],
            "error: truncated.pt: not a readable PyTorch file (truncated or corrupted? [Errno 22] Invalid argument)",
        ),
        (
            ["match", "module.pt", "b.pt", *FACTORY],
            "error: module.pt: holds pickled objects, not only tensors (save model.state_dict(), not the module)",
        ),
        (
            ["match", "truncated.safetensors", "b.pt", *FACTORY],
            "error: truncated.safetensors: not a readable safetensors file (truncated or corrupted? Error "
            "while deserializing header: incomplete metadata, file not fully covered)",
        ),
        (
            ["match", "text.safetensors", "b.pt", *FACTORY],
            "error: text.safetensors: not a readable safetensors file (truncated or corrupted? Error while "
            "deserializing header: header too large)",
        ),
        (
            ["merge", "a.pt", "wide.pt", "--factory", "nets:mlp"],
            "error: wide.pt: tensor '1.weight' has shape (32, 784), a.pt's (16, 784)",
        ),
        (
            ["merge-many", "a.pt", "b.pt", "wide.pt", *FACTORY],
            "error: wide.pt: tensor '1.weight' has shape (32, 784), a.pt's (16, 784)",
        ),
    ],
)
def test_bad_files_and_shapes_are_one_line_before_any_work(broken: Path, args: list[str], message: str) -> None:
    out = broken / "never.pt"
    err = lmclab(broken, *args, "--out", str(out), ok=False, shell=False).stderr
    assert err == f"{message}\n", err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["match", "a.pt", "b.pt", *FACTORY, "--out", "no_such_dir/p.pt"],
            "error: --out: the folder no_such_dir of no_such_dir/p.pt does not exist",
        ),
        (["match", "a.pt", "b.pt", *FACTORY, "--out", "."], "error: --out: . is a folder; expected a file name"),
        (
            ["merge", "a.pt", "b.pt", "--factory", "nets:mlp", "--out", "no_such_dir/m.pt"],
            "error: --out: the folder no_such_dir of no_such_dir/m.pt does not exist",
        ),
        (
            ["barrier", "a.pt", "b.pt", "--factory", "nets:mlp", "--data", "nowhere", "--json", "no_such_dir/b.json"],
            "error: --json: the folder no_such_dir of no_such_dir/b.json does not exist",  # before --data is read
        ),
    ],
)
def test_output_paths_are_checked_before_any_work(broken: Path, args: list[str], message: str) -> None:
    err = lmclab(broken, *args, ok=False, shell=False).stderr
    assert err == f"{message}\n", err


def test_nested_and_safetensors_checkpoints_are_read(broken: Path) -> None:
    """``{"model": state_dict, …}`` (a training script's checkpoint) and ``.safetensors`` are the same model."""
    out = broken / "nested_perm.pt"
    lmclab(broken, "match", "nested.pt", "b.pt", *FACTORY, "--out", str(out))
    first = torch.load(out)["perm"]
    lmclab(broken, "match", "a.safetensors", "b.pt", *FACTORY, "--out", str(out))
    assert all(torch.equal(first[g], p) for g, p in torch.load(out)["perm"].items())


def _tokens(folder: Path, high: int = 256, count: int = 8) -> Path:
    """A prepared text (``kind: tokens``): windows of 8 token ids below ``high`` and their next tokens."""
    import json

    folder.mkdir(exist_ok=True)
    ids = torch.randint(0, high, (count, 9), generator=torch.Generator().manual_seed(0))
    ids[0, 0] = high - 1  # the largest id occurs
    for split in ("train", "test"):
        torch.save({"images": ids[:, :-1], "labels": ids[:, 1:]}, folder / f"{split}.pt")
    meta = {"name": "tokens", "kind": "tokens", "num_classes": high, "input_shape": [8]}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def odd(broken: Path) -> Path:
    """Models with a NaN or an infinity in one weight, an empty prepared folder, a prepared text, and an
    alignment found for a.pt and b.pt (width 16), beside the broken files."""
    a = torch.load(broken / "a.pt")
    for name, bad in (("nan", float("nan")), ("posinf", float("inf")), ("neginf", -float("inf"))):
        state = {k: v.clone() for k, v in a.items()}
        state["3.weight"][2, 5] = bad
        torch.save(state, broken / f"{name}.pt")
    (broken / "empty").mkdir(exist_ok=True)
    (broken / "empty" / "meta.json").write_text((broken / "digits" / "meta.json").read_text())
    for split in ("train", "test"):
        nothing = {"images": torch.zeros(0, 1, 28, 28, dtype=torch.uint8), "labels": torch.zeros(0, dtype=torch.long)}
        torch.save(nothing, broken / "empty" / f"{split}.pt")
    _tokens(broken / "tokens")
    lmclab(broken, "match", "a.pt", "b.pt", *FACTORY, "--out", "ab.pt", shell=False)
    return broken


DIGITS = ["--factory", "nets:mlp", "--data", "digits"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        *[
            (
                [command, "a.pt", f"{name}.pt", *extra],
                f"error: {name}.pt: tensor '3.weight' has 1 {kind} entry; expected finite weights",
            )
            for command, extra in (
                ("match", FACTORY),
                ("merge", []),  # the naive merge: it would write the NaN on
                ("barrier", DIGITS),  # and the naive curve would measure it
                ("merge-many", FACTORY),
            )
            for name, kind in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
        ],
        (
            ["barrier", "nan.pt", "b.pt", *DIGITS],
            "error: nan.pt: tensor '3.weight' has 1 NaN entry; expected finite weights",
        ),  # θa too
        (
            ["barrier", "a.pt", "b.pt", "--factory", "nets:mlp", "--data", "empty"],
            "error: --data empty: its test split has no samples (an empty prepared folder)",
        ),
        (
            ["match", "a.pt", "b.pt", "--factory", "nets:mlp", "--method", "am", "--data", "empty"],
            "error: --data empty: its train split has no samples (an empty prepared folder)",
        ),
        (
            ["merge-many", "a.pt", "b.pt", *FACTORY, "--method", "cca", "--data", "empty"],
            "error: --data empty: its train split has no samples (an empty prepared folder)",
        ),
        (
            ["barrier", "a.pt", "b.pt", *DIGITS[:2], "--data", "tokens"],
            "error: --data tokens: the model cannot read its token ids of shape (8,) (mat1 and mat2 must "
            "have the same dtype, but got Long and Float)",
        ),
        (
            ["match", "a.pt", "b.pt", "--factory", "nets:mlp", "--method", "am", "--data", "tokens"],
            "error: --data tokens: the model cannot read its token ids of shape (8,) (mat1 and mat2 must "
            "have the same dtype, but got Long and Float)",
        ),
        (
            ["barrier", "a.pt", "b.pt", *DIGITS, "--num-lambdas", "1"],
            "error: --num-lambdas must be at least 2 (both endpoints), got 1",
        ),
        (
            ["barrier", "a.pt", "b.pt", *DIGITS, "--repair", "best"],
            "error: --repair must be one of ['auto', 'none', 'bn', 'repair'], got 'best'",
        ),
        (
            ["barrier", "a.pt", "b.pt", *DIGITS, "--repair", "bn"],
            "error: --repair: 'bn' does not fit this model; use repair or none: the model has no BatchNorm",
        ),
        (["barrier", "a.pt", "b.pt", *DIGITS, "--split", "val"], "error: --split: expected train or test, got 'val'"),
        (
            ["merge-many", "a.pt", "b.pt", *FACTORY, "--repair", "best"],
            "error: --repair must be one of ['auto', 'none', 'bn', 'repair'], got 'best'",
        ),
        (["merge", "a.pt", "b.pt", "--lam", "1.5"], "error: --lam must be in [0, 1], got 1.5"),
        (["merge", "a.pt", "b.pt", "--lam", "-0.1"], "error: --lam must be in [0, 1], got -0.1"),
        (
            ["merge", "wide.pt", "wide_b.pt", "--alignment", "ab.pt"],
            "error: --alignment ab.pt: found for another model than wide_b.pt: group 'P_0' has 32 units in "
            "wide_b.pt, 16 in the alignment",
        ),
        (
            ["barrier", "wide.pt", "wide_b.pt", "--alignment", "ab.pt", "--factory", "nets:mlp", "--kwargs"]
            + ['{"width": 32}', "--data", "digits"],
            "error: --alignment ab.pt: found for another model than wide_b.pt: group 'P_0' has 32 units in "
            "wide_b.pt, 16 in the alignment",
        ),
        (["merge", "a.pt", "wide.pt"], "error: wide.pt: tensor '1.weight' has shape (32, 784), a.pt's (16, 784)"),
    ],
)
def test_weights_data_and_flags_are_refused_naming_the_file_or_the_flag(
    odd: Path, args: list[str], message: str
) -> None:
    before = sorted(p.name for p in odd.iterdir())
    out = ["--json", "never.json"] if args[0] == "barrier" else ["--out", "never.pt"]
    err = lmclab(odd, *args, *out, ok=False, shell=False).stderr
    assert err == f"{message}\n", err
    assert sorted(p.name for p in odd.iterdir()) == before  # nothing written, not even a temporary file


@pytest.fixture(scope="module")
def rotated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny GPTs with LayerNorm (a gain beside a bias) as state dicts, an orthogonal alignment of them, and
    each with a zero in one gain (``a0.pt``, ``b0.pt``)."""
    import lmclab as api
    from lmclab.archs import gpt

    work = tmp_path_factory.mktemp("cli_rotated")
    shapes = dict(width=12, depth=1, heads=2, mlp_ratio=2, norm="layernorm", position="rotary", tie_embeddings=False)
    models = []
    for seed, name in ((0, "a"), (1, "b")):
        torch.manual_seed(seed)
        models.append(gpt.Model(gpt.Config(input_shape=(8,), num_classes=23, **shapes)).eval())
        state = {k: v.clone() for k, v in models[-1].state_dict().items()}
        torch.save(state, work / f"{name}.pt")
        state["blocks.0.norm1.weight"][0] = 0.0
        torch.save(state, work / f"{name}0.pt")
    x = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(0))
    api.align(*models, symmetry="orthogonal", example_inputs=x).save(work / "rot.pt")
    return work


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        (("a0.pt", "b.pt"), "error: a0.pt: "),
        (("a.pt", "b0.pt"), "error: b0.pt: "),  # the model's own weights, not the alignment
    ],
)
def test_a_zero_gain_beside_a_bias_is_refused_naming_the_file_it_is_in(
    rotated: Path, pair: tuple[str, str], message: str
) -> None:
    zero = "the gain 'blocks.0.norm1.weight' has a zero entry; its bias 'blocks.0.norm1.bias' cannot be folded"
    err = lmclab(rotated, "merge", *pair, "--alignment", "rot.pt", "--out", "m.pt", ok=False, shell=False).stderr
    assert err == f"{message}{zero}\n", err
    lmclab(rotated, "merge", "a.pt", "b.pt", "--alignment", "rot.pt", "--out", "m.pt", shell=False)


@pytest.mark.parametrize(
    "error",
    [ValueError("first line\nsecond line"), TypeError("first line"), FileNotFoundError("first line")],
    ids=["ValueError", "TypeError", "FileNotFoundError"],
)
def test_a_commands_bad_input_is_its_first_line_and_exit_1(capsys, error: Exception) -> None:
    import typer

    from lmclab.cli.common import one_line

    @one_line
    def command() -> None:
        raise error

    with pytest.raises(typer.Exit) as exited:
        command()
    assert exited.value.exit_code == 1 and capsys.readouterr().err == "error: first line\n"


def test_trace_names_kwargs_that_are_not_json(work: Path) -> None:
    args = ["trace", "nets:mlp", "--input-shape", "1,28,28", "--kwargs", "{num_classes: 10}"]
    err = lmclab(work, *args, ok=False, shell=False).stderr
    reason = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert err == f"error: --kwargs: not valid JSON ({reason}), got '{{num_classes: 10}}'\n", err
