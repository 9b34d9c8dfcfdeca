"""What the command reads, called directly: a data set by name prepared in a private folder and read
back, its channels repeated for a colour model, the refusals named by the command's options, and the
inputs a model is traced on."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from lmclab.cli.inputs import (
    aligned_pair,
    check_inputs,
    load_data,
    load_models,
    output_for,
    output_path,
    parse_options,
    trace_inputs,
    traced_only,
)
from lmclab.core.data import Split, load_split, prepare
from lmclab.core.spec import apply_permutation
from lmclab.trace import trace_spec


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("digits")
    prepare("mnist5k", folder / "raw", folder / "prepared")
    return folder


def test_a_data_set_by_name_is_the_prepared_split_and_leaves_no_folder(digits, tmp_path, monkeypatch) -> None:
    import tempfile

    import lmclab.core.data

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the private folder is made here, then removed
    made = []

    def prepare_into(name, root, out):  # where and how the command prepares it
        made.append((out.parent.parent, out.parent.name, out.parent.stat().st_mode & 0o777))
        return prepare(name, root, out)

    monkeypatch.setattr(lmclab.core.data, "prepare", prepare_into)
    test = load_data("mnist5k", "test", digits / "raw", None)
    expected = load_split(digits / "prepared", "test")
    assert torch.equal(test.x, expected.x) and torch.equal(test.y, expected.y)
    [(parent, name, mode)] = made
    assert parent == tmp_path and name.startswith("lmclab-") and mode == 0o700  # named for lmclab, this user's only
    assert not any(tmp_path.iterdir())
    train = load_data(str(digits / "prepared"), "train", digits / "raw", None)
    assert len(train) == 4000 and torch.equal(train.x, load_split(digits / "prepared", "train").x)


def test_grey_digits_are_repeated_into_every_channel_a_colour_model_reads(digits) -> None:
    grey = load_split(digits / "prepared", "test")
    rgb = load_data(str(digits / "prepared"), "test", digits / "raw", 3)
    assert rgb.x.shape == (1000, 3, 28, 28) and torch.equal(rgb.y, grey.y)
    assert all(torch.equal(rgb.x[:, c], grey.x[:, 0]) for c in range(3))


def test_a_data_set_that_cannot_be_prepared_is_named_as_the_data_option(tmp_path, monkeypatch) -> None:
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens there: no network
    root = re.escape(str(tmp_path / "raw"))
    unavailable = rf"^--data: MNIST is not under {root} and could not be downloaded \(no network\? [^\n]+\)$"
    with pytest.raises(ValueError, match=unavailable):
        load_data("mnist", "test", tmp_path / "raw", None)
    expected = (
        "--data: expected one of ['cifar10', 'fashion_mnist', 'mnist', 'mnist5k'] or a prepared data folder, "
        f"got {str(tmp_path / 'nowhere')!r}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        load_data(str(tmp_path / "nowhere"), "test", tmp_path, None)


def test_a_prepared_folder_without_the_split_asked_for_is_refused_by_name(digits, tmp_path) -> None:
    folder = tmp_path / "prepared"
    folder.mkdir()
    (folder / "meta.json").write_bytes((digits / "prepared" / "meta.json").read_bytes())
    message = f"--data {folder}: a prepared folder without its test split (test.pt)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_data(str(folder), "test", digits / "raw", None)


def test_options_are_yaml_values_and_a_pair_without_a_key_is_refused() -> None:
    assert parse_options(["lr=1e-3", "steps=10", "name=x", "flag=true", "none=null"]) == {
        "lr": 0.001,
        "steps": 10,
        "name": "x",
        "flag": True,
        "none": None,
    }
    for bad in ("lr", "=3"):
        with pytest.raises(ValueError, match=rf"^--option: expected key=value, got '{bad}'$"):
            parse_options([bad])
    assert parse_options(["name=a=b"]) == {"name": "a=b"}  # the first = ends the key


def test_a_plain_module_is_traced_on_a_batch_of_two_zeros_of_the_given_shape() -> None:
    x = trace_inputs(nn.Linear(5, 2), (5,))
    assert torch.equal(x, torch.zeros(2, 5))
    assert trace_inputs(nn.Linear(5, 2), None) is None


def test_partial_is_refused_for_lmclab_checkpoints_only() -> None:
    traced_only(True, None)  # traced: --partial applies
    traced_only(False, object())
    expected = "--partial: the models are lmclab checkpoints, whose architecture gives the spec; nothing is traced"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        traced_only(True, object())


def test_in_channels_must_be_a_multiple_of_the_datas(digits, monkeypatch) -> None:
    """Two-channel data: 3 channels are refused (either neighbour of a multiple), 4 repeat it twice."""
    import lmclab.core.data as data_module

    two = Split(torch.arange(2 * 2 * 3 * 3.0).view(2, 2, 3, 3), torch.tensor([1, 0]))
    monkeypatch.setattr(data_module, "load_split", lambda folder, split: two)
    for bad in (3, 5):
        with pytest.raises(ValueError, match=rf"^--in-channels: {bad} is not a multiple of the data's 2$"):
            load_data(str(digits / "prepared"), "test", digits / "raw", bad)
    four = load_data(str(digits / "prepared"), "test", digits / "raw", 4)
    assert four.x.shape == (2, 4, 3, 3) and torch.equal(four.x[:, 2:], two.x) and torch.equal(four.y, two.y)


def _files(tmp_path) -> tuple:
    for i in range(2):
        torch.manual_seed(i)
        torch.save(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).state_dict(), tmp_path / f"m{i}.pt")
    (tmp_path / "input_nets.py").write_text(
        "from torch import nn\n\n\ndef mlp(width=4):\n"
        "    return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))\n"
    )
    return tmp_path / "m0.pt", tmp_path / "m1.pt"


def test_factory_kwargs_are_a_json_object(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    files = list(_files(tmp_path))
    reason = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    expected = f"--kwargs: not valid JSON ({reason}), got '{{width: 4}}'"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        load_models(files, "input_nets:mlp", "{width: 4}")
    for text in ("[4]", '"width"', "4"):
        with pytest.raises(ValueError, match="^--kwargs: expected a JSON object, got " + re.escape(repr(text)) + "$"):
            load_models(files, "input_nets:mlp", text)
    params, (net, spec, _) = load_models(files, "input_nets:mlp", '{"width": 4}')
    assert spec is None and net[0].out_features == 4 and len(params) == 2
    (alone,), (net, _, _) = load_models(files[:1], "input_nets:mlp", "{}")  # one file: its own module
    assert alone.keys() == net.state_dict().keys()


def test_a_permutation_of_a_factory_model_needs_the_input_shape_to_trace_it(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = _files(tmp_path)
    specless = {"format": "lmclab-permutation-1", "method": "wm", "stats": {}, "perm": {}}  # an earlier lmclab's
    torch.save(specless, tmp_path / "p.pt")
    expected = f"--input-shape: {tmp_path / 'p.pt'} carries no spec (an earlier lmclab): needed with --factory"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        aligned_pair(a, b, tmp_path / "p.pt", "input_nets:mlp", "{}", None)
    perm = {"P_0": torch.tensor([2, 0, 3, 1])}
    torch.save(specless | {"perm": perm}, tmp_path / "p.pt")
    params_a, params_b, net = aligned_pair(a, b, tmp_path / "p.pt", "input_nets:mlp", "{}", "3")  # traced on 2 × 3
    expected = apply_permutation(trace_spec(net, torch.zeros(2, 3)), perm, torch.load(b))
    assert params_b.keys() == expected.keys() and all(torch.equal(params_b[k], v) for k, v in expected.items())
    params_a, params_b, net = aligned_pair(a, b, None, "input_nets:mlp", "{}", None)  # no --alignment: nothing to trace
    assert torch.equal(params_b["0.weight"], torch.load(b)["0.weight"]) and net[0].in_features == 3
    params_a, params_b, net = aligned_pair(a, b, None, None, "{}", None, module=False)  # a merge: no module needed
    assert net is None and torch.equal(params_a["0.weight"], torch.load(a)["0.weight"])
    plain = f"{a}: a plain state dict needs --factory module:callable to build its module"
    with pytest.raises(ValueError, match=f"^{re.escape(plain)}$"):  # a barrier runs the module, alignment or none
        aligned_pair(a, b, None, None, "{}", None)


def test_the_output_of_a_hugging_face_merge_is_a_new_or_empty_folder_in_an_existing_one(tmp_path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert output_for(tmp_path / "new", hf, "--out") == tmp_path / "new"
    assert output_for(tmp_path / "empty", hf, "--out") == tmp_path / "empty"
    full = f"--out: {tmp_path / 'full'} exists; expected a new or empty folder for the merged Hugging Face model"
    with pytest.raises(ValueError, match=f"^{re.escape(full)}$"):
        output_for(tmp_path / "full", hf, "--out")
    nowhere = f"--out: the folder {tmp_path / 'nowhere'} of {tmp_path / 'nowhere' / 'merged'} does not exist"
    with pytest.raises(ValueError, match=f"^{re.escape(nowhere)}$"):
        output_for(tmp_path / "nowhere" / "merged", hf, "--out")
    folder = f"--json: {tmp_path / 'empty'} is a folder; expected a file name"
    with pytest.raises(ValueError, match=f"^{re.escape(folder)}$"):
        output_path(tmp_path / "empty", "--json")  # not a Hugging Face model: a file
    nowhere = f"--json: the folder {tmp_path / 'nowhere'} of {tmp_path / 'nowhere' / 'b.json'} does not exist"
    with pytest.raises(ValueError, match=f"^{re.escape(nowhere)}$"):
        output_path(tmp_path / "nowhere" / "b.json", "--json")
    assert output_path(tmp_path / "out.json", "--json") == tmp_path / "out.json"


PINNED_NET = '''import torch
from torch import nn


class Flipped(nn.Module):
    """a's units read by position (refused; pinned with --partial), a stream b + x + d that carries the input."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d, self.h = (nn.Linear(*io) for io in [(4, 8), (8, 4), (4, 8), (8, 4), (4, 3)])

    def forward(self, x):
        h = self.b(self.a(x).flip(-1)) + x
        return self.h(h + self.d(torch.relu(self.c(h))))


def build():
    return Flipped()
'''


def test_match_says_in_one_line_what_the_trace_left_unpermuted_and_trace_lists_it(tmp_path):
    from test_cli import lmclab  # tests/cli is on the import path

    (tmp_path / "pinned_net.py").write_text(PINNED_NET)
    torch.manual_seed(0)
    for name in ("a.pt", "b.pt"):
        torch.save(_flipped_state(), tmp_path / name)
    net = ["--factory", "pinned_net:build", "--input-shape", "4", "--partial"]
    proc = lmclab(tmp_path, "match", "a.pt", "b.pt", *net, "--out", "p.pt", shell=False)
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "residual streams" in warned[0] and "node 'add' in (top level)" in warned[0]
    listed = lmclab(tmp_path, "trace", "pinned_net:build", "--input-shape", "4", "--partial", shell=False).stdout
    assert "pinned: 8 units by node 'flip' in (top level)" in listed
    assert "pinned: 4 units, a residual stream by node 'add'" in listed and "b.weight[0]" in listed


LAYERNORM_NET = """
from torch import nn


def build():
    return nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
"""


def test_trace_for_orthogonal_maps_lists_each_kind_and_why_a_group_s_kind_is_narrower(tmp_path):
    from test_cli import lmclab  # tests/cli is on the import path

    (tmp_path / "ln_net.py").write_text(LAYERNORM_NET)
    args = ["trace", "ln_net:build", "--input-shape", "4"]
    assert lmclab(tmp_path, *args, "--symmetry", "orthogonal", shell=False).stdout.splitlines() == [
        "P_0 (6 units, centred): 0.weight[0], 0.bias[0], 1.bias[0], 2.weight[1]",
        "P_1 (5 units): 2.weight[0], 2.bias[0], 4.weight[1]",
        "kind: P_0 is centred: node '_1': LayerNorm's centring",
        "kind: P_1 stays a permutation group: node '_3': ReLU does not commute with rotations of its units",
        "gain: 1.weight folded into 2.weight",
        "2 groups over 8 tensors",
    ]
    assert "kind:" not in lmclab(tmp_path, *args, shell=False).stdout  # permutations only: no kinds, no reasons


def _flipped_state() -> dict[str, torch.Tensor]:
    shapes = {"a": (8, 4), "b": (4, 8), "c": (8, 4), "d": (4, 8), "h": (3, 4)}
    return {
        f"{k}.{p}": torch.randn(s if p == "weight" else s[:1]) for k, s in shapes.items() for p in ("weight", "bias")
    }


def test_an_input_shape_or_sample_count_of_zero_is_refused_and_one_is_read() -> None:
    from lmclab.cli.inputs import parse_samples, parse_shape

    assert parse_shape("1") == (1,) and parse_shape("3,1,1") == (3, 1, 1)  # the boundary: 1 is a size
    for bad in ("0", "3,0,2", "-1"):
        with pytest.raises(
            ValueError, match=f"^--input-shape: expected positive integers separated by commas, got '{bad}'$"
        ):
            parse_shape(bad)
    assert parse_samples("1") == 1 and parse_samples("all") is None
    with pytest.raises(ValueError, match="^--repair-samples: expected a positive integer or all, got '0'$"):
        parse_samples("0")


def test_the_spec_of_several_checkpoints_is_the_first_ones(tmp_path) -> None:
    """Two gpt checkpoints with 4 and 2 heads have the same tensor shapes and different specs (heads of
    4 and 2 units): the command works in the first model's spec — or refuses the second in one line."""
    from lmclab.archs import build_model, make_config
    from lmclab.archs.checkpoint import Checkpoint, save_checkpoint

    paths = []
    for heads in (4, 2):
        config = make_config("gpt", input_shape=(8,), num_classes=11, width=8, depth=1, heads=heads, mlp_ratio=2)
        paths.append(tmp_path / f"gpt{heads}.pt")
        save_checkpoint(paths[-1], Checkpoint("gpt", config, 0, build_model("gpt", config, seed=0).state_dict()))
    try:
        params, (net, spec, _) = load_models(paths, None, "{}")
    except ValueError as err:
        assert str(err).startswith(str(paths[1])) and "\n" not in str(err)
        return
    assert params[0].keys() == params[1].keys() and all(params[0][k].shape == params[1][k].shape for k in params[0])
    assert {h.count for h in spec.heads.values()} == {4}, spec.heads  # the first checkpoint's heads


def test_a_model_that_says_it_reads_pixel_values_takes_images_and_refuses_token_ids() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    net.main_input_name = "pixel_values"  # as a Hugging Face image model says
    check_inputs(net, net.state_dict(), Split(torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0])), "digits")
    tokens = Split(torch.randint(0, 9, (3, 4)), torch.tensor([0, 1, 0]))
    message = "--data text: holds token ids of shape (4,); the model (Sequential) reads images"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_inputs(net, net.state_dict(), tokens, "text")


def test_token_ids_beyond_the_models_embedding_are_refused_naming_the_data() -> None:
    net = nn.Sequential(nn.Embedding(10, 3), nn.Flatten(), nn.Linear(12, 2))
    check_inputs(net, net.state_dict(), Split(torch.tensor([[0, 9, 1, 2]]), torch.tensor([1])), "text")  # the last id
    tokens = Split(torch.tensor([[0, 10, 1, 2], [3, 4, 5, 6]]), torch.tensor([0, 1]))
    message = (
        "--data text: token ids up to 10; the model's embedding has 10 entries (a text prepared with another "
        "tokenizer?)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_inputs(net, net.state_dict(), tokens, "text")


def test_a_model_stored_in_two_precisions_is_checked_in_the_one_it_is_compared_in() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    state = {"1.weight": net[1].weight.detach().to(torch.bfloat16), "1.bias": net[1].bias.detach()}  # float32
    check_inputs(net, state, Split(torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0])), "digits")


def test_checking_the_data_leaves_the_module_in_its_mode_and_its_statistics_alone() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.5), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    check_inputs(net, net.state_dict(), Split(torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0])), "digits")
    assert all(m.training for m in net.modules())  # run in eval mode for the check, then back in train mode
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


class _Refusing(nn.Module):
    """A model that raises, on any input, an error of two lines and 300 more characters."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("cannot\n   read  this:" + "z" * 300)


def test_a_model_that_cannot_read_the_data_is_refused_with_its_error_on_one_line_cut_to_160_characters() -> None:
    net = _Refusing()
    images = Split(torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0]))
    reason = ("cannot read this:" + "z" * 300)[:160]
    message = f"--data digits: the model cannot read its images of shape (1, 2, 2) ({reason})"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_inputs(net, net.state_dict(), images, "digits")


def test_a_model_that_says_it_reads_input_ids_takes_token_ids_and_refuses_images() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))  # no embedding first: only its word says token ids
    net.main_input_name = "input_ids"  # as a Hugging Face language model says
    images = Split(torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0]))
    message = "--data digits: holds images of shape (1, 2, 2); the model (Sequential) reads token ids"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_inputs(net, net.state_dict(), images, "digits")


def test_tied_gpt_checkpoints_are_matched_untied_by_orthogonal_maps_traced_on_the_data(tmp_path) -> None:
    """lmclab's own language models (a head tied to the embeddings) traced on the first windows of ``--data``: the
    command unties the head as it does a Hugging Face folder's, and both learned and data-free searches run."""
    import json

    from test_cli import lmclab

    from lmclab.archs import build_model, make_config
    from lmclab.archs.checkpoint import Checkpoint, save_checkpoint

    config = make_config("gpt", input_shape=(8,), num_classes=11, width=8, depth=1, heads=2, mlp_ratio=2)
    for seed in (0, 1):
        state = build_model("gpt", config, seed=seed).state_dict()
        save_checkpoint(tmp_path / f"gpt{seed}.pt", Checkpoint("gpt", config, seed, state))
    x = torch.randint(0, 11, (32, 8), generator=torch.Generator().manual_seed(0))
    (tmp_path / "tokens").mkdir()
    for split in ("train", "test"):
        torch.save({"images": x, "labels": torch.roll(x, -1, 1)}, tmp_path / "tokens" / f"{split}.pt")
    meta = {"name": "toy", "kind": "tokens", "num_classes": 11, "input_shape": [8], "n_train": 32, "n_test": 32}
    (tmp_path / "tokens" / "meta.json").write_text(json.dumps(meta))
    learned = ("--method", "ste_sinkhorn", "--option", "epochs=1", "--option", "batch_size=16")
    for method in ((), learned):
        args = ("match", "gpt0.pt", "gpt1.pt", "--symmetry", "orthogonal", "--data", "tokens", *method)
        out = lmclab(tmp_path, *args, "--out", "rot.pt", shell=False).stdout
        assert " orthogonal); embed.weight and head.weight matched untied, " in out, out
    lmclab(tmp_path, "merge", "gpt0.pt", "gpt1.pt", "--alignment", "rot.pt", "--out", "merged.pt", shell=False)
    assert (tmp_path / "merged.pt").is_file()
