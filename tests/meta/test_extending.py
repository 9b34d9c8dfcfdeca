"""A new pair method is its module plus one line in ``METHODS`` (and its params.yaml block); a new architecture
is its module plus one line in ``ARCHS`` (and its block). Both are written here, in this file alone, registered
for the test only, and reach params.yaml's validation, the parameter table, the Python API and the command."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import yaml
from dvc_repo import TINY
from torch import Tensor, nn
from typer.testing import CliRunner

import lmclab
from lmclab import cli
from lmclab.archs import ARCHS, build_model, make_config
from lmclab.archs.base import ArchConfig
from lmclab.archs.checkpoint import Checkpoint, save_checkpoint
from lmclab.core.options import Count, OptionError, Options, option, takes
from lmclab.core.spec import PermutationSpec, apply_permutation, build_spec, random_permutation
from lmclab.core.spec_builders import dense
from lmclab.pipeline.keys import key_rows
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.search import METHODS
from lmclab.search.result import SearchResult

# ---- a pair method: match units by the rank of their weights' norm ----------------------------------------


class NormRankOptions(Options):
    """Options of :func:`norm_rank`."""

    descending: bool = option(True, "norm rank: pair the largest units first (else the smallest)")


@takes(NormRankOptions)
def norm_rank(spec: PermutationSpec, params_a: dict, params_b: dict, *, options: NormRankOptions) -> SearchResult:
    """Each group's units of θb put in the order of θa's by the rank of the norm of everything they touch."""
    perm = {}
    for group, size in spec.group_sizes(params_a).items():
        norms = [_unit_norms(spec, params, group, size) for params in (params_a, params_b)]
        rank_a, rank_b = (torch.argsort(n, descending=options.descending) for n in norms)
        perm[group] = torch.empty(size, dtype=torch.long)
        perm[group][rank_a] = rank_b
    return SearchResult(perm, {"descending": options.descending})


def _unit_norms(spec: PermutationSpec, params: dict, group: str, size: int) -> Tensor:
    total = torch.zeros(size, dtype=torch.float64)
    for key, axes in spec.axes.items():
        for axis, g in enumerate(axes):
            if g == group:
                total += params[key].double().movedim(axis, 0).reshape(size, -1).pow(2).sum(1)
    return total


# ---- an architecture: a tanh MLP with one hidden layer --------------------------------------------------


class TanhConfig(ArchConfig):
    """One tanh hidden layer of ``width`` units."""

    width: Count = option(8, "units of the hidden layer")


class TanhModel(nn.Module):
    def __init__(self, config: TanhConfig) -> None:
        super().__init__()
        self.hidden = nn.Linear(int(torch.tensor(config.input_shape).prod()), config.width)
        self.act = nn.Tanh()
        self.out = nn.Linear(config.width, config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.act(self.hidden(x.flatten(1))))


tanh_mlp = types.ModuleType("tanh_mlp")
tanh_mlp.Config = TanhConfig
tanh_mlp.Model = TanhModel
tanh_mlp.permutation_spec = lambda config: build_spec(dense("hidden", "P_0", None), dense("out", None, "P_0"))
tanh_mlp.activation_points = lambda config: {"P_0": ["act"]}


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line each registry gets."""
    monkeypatch.setitem(METHODS, "norm_rank", norm_rank)
    monkeypatch.setitem(ARCHS, "tanh_mlp", tanh_mlp)


def _params(**blocks) -> dict:
    params = copy.deepcopy(TINY)
    params["permute"]["norm_rank"] = {"descending": True}
    params["model"]["tanh_mlp"] = {"width": 8}
    for dotted, value in blocks.items():
        node = params
        *path, last = dotted.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return params


def _planted(seed: int = 0) -> tuple[dict, dict, dict]:
    """A tanh MLP θa and its permuted copy θb = π(θa), and the π⁻¹ that aligns θb back."""
    config = make_config("tanh_mlp", input_shape=(1, 4, 4), num_classes=3, width=8)
    params_a = build_model("tanh_mlp", config, seed=seed).state_dict()
    spec = tanh_mlp.permutation_spec(config)
    perm = random_permutation(spec.group_sizes(params_a), torch.Generator().manual_seed(seed + 1))
    return params_a, apply_permutation(spec, perm, params_a), {g: torch.argsort(p) for g, p in perm.items()}


def test_validation_takes_the_new_method_and_architecture_with_their_blocks(registered) -> None:
    params = check_params(
        _params(permute__methods=["identity", "norm_rank"], three__methods=["norm_rank"], model__arch="tanh_mlp")
    )
    assert params.permute.norm_rank.descending is True and params.model.tanh_mlp.width == 8
    rows = {key: meaning for key, _, _, meaning in key_rows()}
    assert rows["permute.norm_rank.descending"].startswith("norm rank: pair the largest")
    assert rows["model.tanh_mlp.width"] == "units of the hidden layer"
    with pytest.raises(ParamsError, match=r"^permute\.norm_rank\.descending: expected true or false, got 'yes'$"):
        check_params(_params(permute__norm_rank={"descending": "yes"}))
    with pytest.raises(ParamsError, match=r"^model\.tanh_mlp\.width: expected an integer ≥ 1, got 0$"):
        check_params(_params(model__arch="tanh_mlp", model__tanh_mlp={"width": 0}))
    with pytest.raises(ParamsError, match=r"^permute\.norm_rank: missing; expected a block with the keys descending"):
        params = _params()
        del params["permute"]["norm_rank"]
        check_params(params)


def test_without_the_registry_line_neither_is_known() -> None:
    with pytest.raises(ParamsError) as err:
        check_params(_params(permute__methods=["norm_rank"], model__arch="tanh_mlp"))
    assert any(line.startswith("permute.methods: expected") for line in err.value.lines)
    assert any(line.startswith("model.arch: expected") for line in err.value.lines)
    assert any(line.startswith("permute.norm_rank: unknown key") for line in err.value.lines)


def test_the_api_runs_the_new_method_on_the_new_architecture(registered) -> None:
    params_a, params_b, truth = _planted()
    spec = tanh_mlp.permutation_spec(None)
    found = lmclab.find_permutation(params_a, params_b, method="norm_rank", spec=spec, options={"descending": False})
    assert found.stats["descending"] is False
    assert all(torch.equal(found.perm[g], truth[g]) for g in truth)  # the planted permutation, recovered
    with pytest.raises(ValueError, match=r"^options\['descending'\] must be true or false, got 1$"):
        lmclab.find_permutation(params_a, params_b, method="norm_rank", spec=spec, options={"descending": 1})


def test_the_command_matches_checkpoints_of_the_new_architecture_with_the_new_method(registered, tmp_path) -> None:
    params_a, params_b, truth = _planted(seed=3)
    config = make_config("tanh_mlp", input_shape=(1, 4, 4), num_classes=3, width=8)
    for name, state in (("a.pt", params_a), ("b.pt", params_b)):
        save_checkpoint(tmp_path / name, Checkpoint("tanh_mlp", config, 0, state))
    out = tmp_path / "perm.pt"
    result = CliRunner().invoke(
        cli.app, ["match", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--method", "norm_rank", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "norm_rank: 1 groups" in result.output
    assert torch.equal(lmclab.load_alignment(out).perm["P_0"], truth["P_0"])
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(_params(model__arch="tanh_mlp", permute__methods=["norm_rank"], three__methods=["norm_rank"]))
    )
    result = CliRunner().invoke(cli.app, ["validate", str(tmp_path / "params.yaml")])
    assert result.exit_code == 0, result.output


def test_the_options_model_of_the_new_architecture_refuses_in_one_line(registered) -> None:
    with pytest.raises(OptionError, match=r"^width must be a positive integer, got 0$"):
        make_config("tanh_mlp", input_shape=(1, 4, 4), num_classes=3, width=0)


def test_no_module_reads_an_architectures_interface_around_it() -> None:
    """The members code outside an architecture reads are :class:`lmclab.archs.base.Interface`'s
    (``lmclab.archs.base.interface``): no module of the library reads one by ``getattr``/``hasattr`` with a
    default of its own. (Read from the source, so here: mutation testing rewrites the library's files.)"""
    import re
    from pathlib import Path

    from lmclab.archs.base import Interface

    members = "|".join(Interface._fields)
    around = re.compile(rf"(getattr|hasattr)\(.{{0,80}}?[\"']({members})[\"']")
    src = Path(__file__).resolve().parents[2] / "src" / "lmclab"
    readers = [str(p) for p in src.rglob("*.py") if around.search(p.read_text())]
    assert not readers, readers
