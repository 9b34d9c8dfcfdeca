"""``partial=True`` wherever the tracer's refusal suggests it: a model with one op the tracer cannot
prove is refused in one line, and with ``partial`` its other groups are matched exactly while the
unproven ones stay as they are; the command's ``--partial`` likewise."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import lmclab
from lmclab.core.spec import random_permutation
from lmclab.trace import TraceError, trace_spec

UNPROVED = (
    "trace_spec: node 'cumsum': cumsum in (top level) cannot be proved permutation-equivariant (an operation the "
    "tracer does not know); pass partial=True to leave its channels unpermuted"
)

NETS = '''
import torch
from torch import nn


class Cumulative(nn.Module):
    """An MLP whose first hidden layer is summed cumulatively over its units: no permutation of
    them keeps the function, so a tracer must not permute them."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)).cumsum(-1))))


def cumulative():
    return Cumulative()
'''


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("partial")
    (folder / "partial_nets.py").write_text(NETS)
    sys.path.insert(0, str(folder))
    try:
        import partial_nets
    finally:
        sys.path.remove(str(folder))
    return folder, partial_nets


def _planted(net: nn.Module, x: torch.Tensor) -> tuple[dict, dict]:
    """θb = π(θa) for a random π of the partial spec's groups (only the provable one), and π."""
    spec = trace_spec(net, x, partial=True)
    perm = random_permutation(spec.group_sizes(net.state_dict()), torch.Generator().manual_seed(3))
    return lmclab.apply_permutation(spec, perm, net.state_dict()), perm


def test_the_refusal_names_partial_and_partial_permutes_only_what_is_proven(nets) -> None:
    _, module = nets
    torch.manual_seed(0)
    net, x = module.cumulative(), torch.randn(32, 12)
    with pytest.raises(TraceError, match=f"^{re.escape(UNPROVED)}$"):
        lmclab.find_permutation(net, net, example_inputs=x)
    spec = trace_spec(net, x, partial=True)
    assert spec.axes["fc1.weight"] == (None, None) and spec.axes["fc2.weight"] == ("P_0", None)
    b, perm = _planted(net, x)
    assert not torch.equal(b["fc2.weight"], net.state_dict()["fc2.weight"])  # the planted π moves something
    for method in ("wm", "am"):
        res = lmclab.find_permutation(net, b, method=method, example_inputs=x, data=(x, x[:, 0]), partial=True)
        aligned = res.apply(b)
        assert res.spec == spec and all(torch.equal(aligned[k], v) for k, v in net.state_dict().items())
    with pytest.raises(
        ValueError, match=r"^partial: applies to a traced spec; a spec given as spec= is used as it is$"
    ):
        lmclab.find_permutation(net, b, spec=spec, partial=True)


def test_merge_many_takes_partial_and_keeps_the_function(nets) -> None:
    _, module = nets
    torch.manual_seed(0)
    net, x = module.cumulative(), torch.randn(32, 12)
    copies = [net.state_dict(), _planted(net, x)[0]]
    with pytest.raises(TraceError, match=f"^{re.escape(UNPROVED)}$"):
        lmclab.merge_many(copies, method="c2m3", model=net, example_inputs=x)
    res = lmclab.merge_many(copies, method="c2m3", model=net, example_inputs=x, partial=True)
    merged = torch.func.functional_call(net, res.merged, (x,))
    assert torch.allclose(merged, net(x), atol=1e-5)


def _command_files(nets) -> tuple[Path, nn.Module, list[str]]:
    """θa and a planted permutation of it as files for the command, and the arguments naming the factory."""
    folder, module = nets
    torch.manual_seed(0)
    net, x = module.cumulative(), torch.randn(2, 12)
    torch.save(net.state_dict(), folder / "a.pt")
    torch.save(_planted(net, x)[0], folder / "b.pt")
    return folder, net, ["--factory", "partial_nets:cumulative", "--input-shape", "12"]


def test_the_command_says_partial_and_takes_it(nets) -> None:
    from test_cli import lmclab as run

    folder, net, factory = _command_files(nets)
    refused = run(folder, "match", "a.pt", "b.pt", *factory, "--out", "p.pt", ok=False)
    unproved = (
        "error: trace_spec: node 'cumsum': cumsum in (top level) cannot be proved permutation-equivariant (an "
        "operation the tracer does not know); pass --partial to leave its channels unpermuted\n"
    )
    assert refused.stderr == unproved, refused.stderr
    assert not (folder / "p.pt").exists()
    out = run(folder, "match", "a.pt", "b.pt", *factory, "--partial", "--out", "p.pt").stdout
    assert "L2 reduction 100.00 %" in out
    run(folder, "merge", "a.pt", "b.pt", "--alignment", "p.pt", *factory, "--partial", "--out", "m.pt")
    merged = torch.load(folder / "m.pt")
    assert all(torch.allclose(merged[k], v) for k, v in net.state_dict().items())  # θa = π(θb): the midpoint is θa


def test_merge_many_takes_partial_too(nets) -> None:
    from test_cli import lmclab as run

    folder, _, factory = _command_files(nets)
    out = run(folder, "merge-many", "a.pt", "b.pt", "a.pt", *factory, "--partial", "--out", "mm.pt").stdout
    assert "wrote mm.pt" in out
    assert Path(folder / "mm.pt").is_file()
