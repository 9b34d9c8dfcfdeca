"""Two model files in different precisions through the command (lmclab.api.weights): for every ordered pair of
float32, float16, bfloat16 and float64 (θb = π(θa) cast to the other dtype), ``lmclab match`` recovers the
planted permutation, ``lmclab merge --alignment`` (and ``merge-many``) writes θa's dtype and ``lmclab barrier
--alignment`` measures a zero barrier; the models are compared in float64 when either is float64, else in
float32. In this process (typer's runner): the command's own code, without a shell per run."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from test_cli import lmclab, make_work

from lmclab.core.spec import apply_permutation, random_permutation
from lmclab.trace import trace_spec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
PAIRS = [(a, b) for a, b in itertools.product(DTYPES, DTYPES) if a != b]
FACTORY = ["--factory", "nets:mlp", "--input-shape", "1,28,28"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """θa (``a_<dtype>.pt``) and θb = π(θa) (``b_<dtype>.pt``) in every dtype, π in ``planted.pt``."""
    work = make_work(tmp_path_factory.mktemp("cli_precision"))
    sys.path.insert(0, str(work))
    try:
        from nets import mlp
    finally:
        sys.path.remove(str(work))
    net = mlp()
    spec = trace_spec(net, torch.zeros(2, 1, 28, 28))
    perm = random_permutation(spec.group_sizes(net.state_dict()), torch.Generator().manual_seed(3))
    b = apply_permutation(spec, perm, net.state_dict())
    for name, dtype in DTYPES.items():
        torch.save({k: v.to(dtype) for k, v in net.state_dict().items()}, work / f"a_{name}.pt")
        torch.save({k: v.to(dtype) for k, v in b.items()}, work / f"b_{name}.pt")
    torch.save(perm, work / "planted.pt")
    return work


@pytest.mark.parametrize(("dtype_a", "dtype_b"), PAIRS)
def test_match_merge_and_barrier_take_two_precisions(work: Path, dtype_a: str, dtype_b: str) -> None:
    a, b, perm = f"a_{dtype_a}.pt", f"b_{dtype_b}.pt", f"perm_{dtype_a}_{dtype_b}.pt"
    lmclab(work, "match", a, b, *FACTORY, "--out", perm, shell=False)
    found, planted = torch.load(work / perm)["perm"], torch.load(work / "planted.pt")
    assert all(torch.equal(planted[g][p], torch.arange(len(p))) for g, p in found.items())  # π(θb) = θa
    merged = f"merged_{dtype_a}_{dtype_b}.pt"
    lmclab(work, "merge", a, b, "--alignment", perm, "--lam", "0.5", "--out", merged, shell=False)
    state, own = torch.load(work / merged), torch.load(work / a)
    assert all(v.dtype == DTYPES[dtype_a] for v in state.values())  # the merge in θa's dtype
    close = 0.0 if {dtype_a, dtype_b} <= {"fp32", "f64"} else 1e-2  # the midpoint of θa and θa rounded
    assert all(torch.allclose(v.double(), own[k].double(), atol=close) for k, v in state.items())
    lmclab(work, "merge-many", a, b, *FACTORY, "--out", f"many_{merged}", shell=False)
    assert all(v.dtype == DTYPES[dtype_a] for v in torch.load(work / f"many_{merged}").values())
    out = f"barrier_{dtype_a}_{dtype_b}.json"
    args = ["barrier", a, b, "--alignment", perm, "--factory", "nets:mlp", "--data", "digits", "--num-lambdas", "3"]
    lmclab(work, *args, "--json", out, shell=False)
    barriers = json.loads((work / out).read_text())["barriers"]
    assert barriers["test_loss_barrier_max"] == pytest.approx(0.0, abs=1e-6 if close == 0.0 else 1e-2)
