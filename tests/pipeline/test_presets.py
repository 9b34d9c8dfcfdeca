"""Named presets: the paper's settings, the transformer extensions and the n-model one; each applies to
the repository's params.yaml, keeps its comments, and validates; a typo in a preset is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dvc_repo import ROOT
from typer.testing import CliRunner

from lmclab.cli import app
from lmclab.pipeline.preset import apply_preset, flatten, flow, set_values
from lmclab.pipeline.stage import parse_yaml
from lmclab.pipeline.validate import ParamsError, check_params

PRESETS = ROOT / "presets"
NAMES = sorted(p.stem for p in PRESETS.glob("*.yaml"))
PAPER = ["cifar10_resnet20", "cifar10_vgg11", "fashion_mnist_mlp", "imagenet_resnet50", "mnist_mlp"]
EXTENSIONS = ["cifar10_mae", "cifar10_vit", "mae", "vit"]  # transformers (docs/transformers.md)
MANY = ["cifar10_resnet20x4_many"]  # n models in one frame (docs/methods.md)
LANGUAGE = ["pydoc_gpt", "text_gpt_gpu"]  # language models (docs/language-models.md)


def test_the_papers_settings_and_the_extensions_are_all_there():
    assert sorted(PAPER + EXTENSIONS + MANY + LANGUAGE) == NAMES


def _applied(name: str, **local: str) -> dict:
    """The preset applied to params.yaml: its values set, every other line and comment kept, valid (with the
    ``data`` keys of ``local`` pointed at files made by the test)."""
    text = (ROOT / "params.yaml").read_text()
    new = apply_preset(name, text, PRESETS)
    preset = flatten(parse_yaml((PRESETS / f"{name}.yaml").read_text()))
    tree = parse_yaml(new)
    assert all(flatten(tree)[k] == v for k, v in preset.items())
    assert len(new.splitlines()) == len(text.splitlines())
    assert [ln.split(" # ", 1)[1] for ln in new.splitlines() if " # " in ln] == [
        ln.split(" # ", 1)[1] for ln in text.splitlines() if " # " in ln
    ]
    tree["data"] |= local
    check_params(tree)
    return tree


@pytest.mark.parametrize("name", PAPER)
def test_preset_applies_keeps_comments_and_validates(name):
    tree = _applied(name)
    assert tree["train"]["batch_size"] == 512 and len(tree["permute"]["pairs"]) == 5
    # every table runs the paper's WM and STE (the Sinkhorn methods, Appendix D.2) at its settings
    assert {"wm_sinkhorn", "ste_sinkhorn"} <= set(tree["permute"]["methods"])
    assert tree["three"]["methods"][:2] == ["wm_sinkhorn", "ste_sinkhorn"]
    lr = 10.0 if name == "imagenet_resnet50" else 1.0  # Appendix D: lr 10 for ResNet50
    assert tree["permute"]["ste_sinkhorn"]["lr"] == tree["permute"]["wm_sinkhorn"]["lr"] == lr
    assert tree["permute"]["ste_sinkhorn"]["epochs"] == 5
    assert tree["permute"]["wm_sinkhorn"]["epochs"] * tree["permute"]["wm_sinkhorn"]["iterations"] == 1000


def test_unknown_key_and_block_are_errors():
    text = "a:\n  b: 1   # units\n  c:\n    d: x\n"
    assert yaml.safe_load(set_values(text, {"a.b": [1, 2], "a.c.d": "y z"})) == {"a": {"b": [1, 2], "c": {"d": "y z"}}}
    assert "# units" in set_values(text, {"a.b": 2})
    with pytest.raises(ValueError, match="a.e"):
        set_values(text, {"a.e": 1})
    with pytest.raises(ValueError, match="block"):
        set_values(text, {"a.c": 1})


def test_a_value_glued_to_its_key_is_not_rewritten():
    # YAML reads `a:\n  c:#x` as a = "c:#x", no key a.c: refused rather than rewritten into a block
    with pytest.raises(ValueError, match=r"^a\.c: "):
        set_values("a:\n  c:#x\n", {"a.c": 1})


def test_a_set_value_keeps_its_comment_in_its_column():
    text = "a:\n  b: 1       # units\n  c: 2 # s\n"
    assert set_values(text, {"a.b": 22}).splitlines()[1] == "  b: 22      # units"
    assert set_values(text, {"a.b": [1, 2]}).splitlines()[1] == "  b: [1, 2]  # units"
    assert set_values(text, {"a.c": 12345}).splitlines()[2] == "  c: 12345 # s"  # no room left: one space


def test_only_quotes_hide_a_comment_and_any_other_letter_leaves_it_a_comment():
    text = "a:\n  arch: XLNet  # the model\n  tag: 'x # y'  # quoted\n"
    assert set_values(text, {"a.arch": "vit"}).splitlines()[1] == "  arch: vit    # the model"
    assert set_values(text, {"a.tag": "z"}).splitlines()[2] == "  tag: z        # quoted"


def test_a_hash_glued_to_the_word_before_it_is_part_of_the_value():
    """YAML starts a comment only at a ``#`` after a space: ``C#`` and ``a# b`` are values, replaced whole."""
    text = "a:\n  lang: C#  # the language\n  tag: a# b\n"
    new = set_values(text, {"a.lang": "go", "a.tag": "z"})
    assert new.splitlines()[1:] == ["  lang: go  # the language", "  tag: z"]


def test_a_value_is_written_on_one_line_however_long():
    """Past a million characters too, where PyYAML would otherwise wrap it onto a second line."""
    assert flow(["x" * 1_800_000, 1]) == f"[{'x' * 1_800_000}, 1]"


def test_unknown_preset_is_one_line_error():
    with pytest.raises(FileNotFoundError, match="known"):
        apply_preset("cifar100_wrn", Path(ROOT / "params.yaml").read_text(), PRESETS)


@pytest.mark.parametrize("name", EXTENSIONS)
def test_transformer_presets_pretrain_or_train_the_same_vit_and_measure_repair(name):
    tree = _applied(name)
    assert tree["model"]["arch"] == "vit" and tree["model"]["vit"]["pool"] == "cls"
    assert tree["train"]["objective"] == ("mae" if name.endswith("mae") else "supervised")
    assert tree["data"]["name"] == ("cifar10" if name.startswith("cifar10") else "mnist5k")  # offline: mnist5k
    assert {"identity", "wm", "am", "ste", "wm_sinkhorn", "ste_sinkhorn"} <= set(tree["permute"]["methods"])
    assert tree["measure"]["repair"] == "repair" and len(tree["permute"]["pairs"]) >= 3
    twin = _applied(name.replace("mae", "vit") if name.endswith("mae") else name.replace("vit", "mae"))
    assert twin["model"]["vit"] == tree["model"]["vit"]  # supervised and MAE: the same encoder
    assert twin["train"]["seeds"] == tree["train"]["seeds"] and twin["permute"]["pairs"] == tree["permute"]["pairs"]


@pytest.mark.parametrize("name", MANY)
def test_many_model_preset_merges_five_batchnorm_nets_by_every_method_with_bn_repair(name):
    tree = _applied(name)
    assert tree["model"]["arch"] == "resnet20" and tree["model"]["resnet20"]["width_multiplier"] == 4
    assert tree["merge_many"]["seeds"] == tree["train"]["seeds"] == [0, 1, 2, 3, 4]
    assert tree["merge_many"]["methods"] == ["merge_many", "c2m3", "sync", "star"]
    assert tree["merge_many"]["repair"] == "bn"  # validate refuses REPAIR on a BatchNorm net


def test_the_cpu_language_model_preset_trains_a_byte_level_gpt_on_pydoc_with_every_method():
    tree = _applied("pydoc_gpt")
    assert (tree["data"]["name"], tree["data"]["tokenizer"], tree["train"]["objective"]) == ("pydoc", None, "lm")
    assert tree["model"]["arch"] == "gpt" and tree["model"]["gpt"]["width"] % tree["model"]["gpt"]["heads"] == 0
    assert {"identity", "wm", "am", "wm_sinkhorn", "ste_sinkhorn"} <= set(tree["permute"]["methods"])
    assert tree["measure"]["repair"] == "repair" and len(tree["permute"]["pairs"]) >= 3


def test_the_gpu_language_model_preset_reads_a_local_corpus_with_a_llama_layout(tmp_path):
    """Its corpus and tokenizer are the user's: validation refuses them until they exist, and passes once they do."""
    from test_corpus import word_tokenizer

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text to train on")
    tok = word_tokenizer(tmp_path / "tok", ["some text to train on"])
    tree = _applied("text_gpt_gpu", root=str(tmp_path / "corpus"), tokenizer=str(tok))
    gpt = tree["model"]["gpt"]
    assert (gpt["norm"], gpt["position"], gpt["mlp"], gpt["tie_embeddings"]) == ("rmsnorm", "rotary", "swiglu", False)
    assert gpt["heads"] % gpt["kv_heads"] == 0 < gpt["kv_heads"] < gpt["heads"]  # grouped-query attention
    assert tree["train"]["precision"] == "bf16" and tree["data"]["name"] == "text"
    with pytest.raises(ParamsError) as err:
        _applied("text_gpt_gpu")
    assert [line.split(":")[0] for line in err.value.lines] == ["data.root", "data.tokenizer"]


def test_applying_a_preset_whose_corpus_is_not_there_yet_notes_it_and_writes(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    result = CliRunner().invoke(app, ["preset", "text_gpt_gpu", "--params", str(params), "--presets", str(PRESETS)])
    assert result.exit_code == 0, result.output
    assert "note: preset text_gpt_gpu: data.root: data/corpus is not a folder" in result.output
    assert parse_yaml(params.read_text())["data"]["name"] == "text"
    # beside a real error the missing corpus is not mentioned, and nothing is written
    (tmp_path / "presets").mkdir()
    bad = (PRESETS / "text_gpt_gpu.yaml").read_text().replace("lr: 0.0006", "lr: -1.0")
    (tmp_path / "presets" / "bad.yaml").write_text(bad)
    params.write_text((ROOT / "params.yaml").read_text())
    refused = CliRunner().invoke(
        app, ["preset", "bad", "--params", str(params), "--presets", str(tmp_path / "presets")]
    )
    assert refused.exit_code == 1 and refused.output == "error: preset bad: train.lr: expected a number > 0, got -1.0\n"
    assert "data.root" not in refused.output and params.read_text() == (ROOT / "params.yaml").read_text()


def test_a_preset_with_two_bad_values_is_refused_with_one_line_for_each(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    (tmp_path / "presets").mkdir()
    bad = (PRESETS / "mnist_mlp.yaml").read_text().replace("lr: 0.001", "lr: -1.0").replace("width: 512", "width: 0")
    (tmp_path / "presets" / "bad.yaml").write_text(bad)
    refused = CliRunner().invoke(
        app, ["preset", "bad", "--params", str(params), "--presets", str(tmp_path / "presets")]
    )
    assert refused.exit_code == 1 and refused.output.splitlines() == [
        "error: preset bad: model.mlp.width: expected an integer ≥ 1, got 0",
        "error: preset bad: train.lr: expected a number > 0, got -1.0",
    ]
    assert params.read_text() == (ROOT / "params.yaml").read_text()


def test_the_command_lists_the_presets_and_prints_dvc_flags_without_writing(tmp_path, monkeypatch):
    """``--list`` names every preset of ``--presets``; ``--set-params`` prints the `dvc exp run -S` flags and
    leaves params.yaml as it was; the help lists ./presets when the command runs in a pipeline checkout."""
    listed = CliRunner().invoke(app, ["preset", "--list", "--presets", str(PRESETS)])
    assert listed.exit_code == 0 and listed.output.split() == NAMES
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    args = ["preset", "mnist_mlp", "--set-params", "--params", str(params), "--presets", str(PRESETS)]
    flags = CliRunner().invoke(app, args)
    assert flags.exit_code == 0 and flags.output.startswith("dvc exp run -S ")
    assert "-S model.arch=mlp" in flags.output and params.read_text() == (ROOT / "params.yaml").read_text()
    unnamed = CliRunner().invoke(app, ["preset", "--params", str(params), "--presets", str(PRESETS)])
    assert unnamed.exit_code == 1 and unnamed.output == f"error: NAME: give a preset (known: {NAMES})\n"
    missing = CliRunner().invoke(app, ["preset", "mnist_mlp", "--params", str(tmp_path / "none.yaml")])
    no_file = f"error: --params: {tmp_path / 'none.yaml'}: no such file (run in a checkout of the pipeline)\n"
    assert missing.exit_code == 1 and missing.output == no_file
    import lmclab.cli.preset as command

    first = "Apply a named paper preset (presets/NAME.yaml) to params.yaml, in a checkout of the pipeline "
    first += "(not a DVC stage)."  # the docstring's first paragraph, its line break a space
    monkeypatch.chdir(ROOT)
    assert command._help().startswith(first + "\n\nPresets in presets/: cifar10_mae, cifar10_resnet20,")
    monkeypatch.chdir(tmp_path)
    assert command._help() == first  # the docstring's first paragraph on one line, without a list of presets
