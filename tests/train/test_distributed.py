"""Data-parallel training under torchrun: two gloo processes of the train stage give the
single-process model on the same global batch (up to float reduction order), the launcher's command,
and the one-line refusals of impossible launches. The arithmetic behind it — each shard's loss scaling
and the batch-weighted BatchNorm statistics — is also checked fast, in one process against closed forms."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from dvc_repo import TINY, deep_update, run

from lmclab.analysis.landscape import landscape, plane_grid
from lmclab.archs import build_model, get_arch, make_config
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.bn_repair import bn_repair_hook, repair_bn
from lmclab.core.data import Split
from lmclab.core.distributed import ALONE, World, join_world, leave_world, torchrun_command
from lmclab.core.interpolation import measure_pair_with_repair
from lmclab.core.metrics import lambda_grid
from lmclab.pipeline.validate import ParamsError, check_params
from lmclab.train.training import Step

ROOT = Path(__file__).resolve().parents[2]
# max |Δθ| after 2 epochs of Adam on 800 digits: measured 3.0e-8 (float32 summation in another order);
# Adam's normalisation lets such differences grow (default MLP, 5 epochs on 4,000 digits: 1.3e-5,
# benchmarks/bench_ddp.py), so the bound is loose but far below any training effect (~1e-2)
TOLERANCE = 1e-6


def params(tmp_path: Path, **train: object) -> Path:
    tree = deep_update(
        copy.deepcopy(TINY),
        {"model": {"mlp": {"hidden": 2, "width": 32}}, "train": {"epochs": 2, "batch_size": 63, **train}},
    )  # shards of 32 and 31
    path = tmp_path / f"params-{train.get('nproc_per_node', 1)}-{train.get('precision', 'fp32')}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def train_stage(tmp_path: Path, prepared: Path, name: str, **train: object) -> tuple[dict, pd.DataFrame, str]:
    out, history = tmp_path / f"{name}.pt", tmp_path / f"{name}.parquet"
    proc = subprocess.run(
        [
            sys.executable,
            "stages/train.py",
            "--seed",
            "0",
            "--data",
            str(prepared),
            "--out",
            str(out),
            "--history",
            str(history),
            "--live",
            str(tmp_path / f"{name}-live"),
            "--params",
            str(params(tmp_path, **train)),
        ],
        cwd=ROOT,
        env={**os.environ, "LMCLAB_WARM": "0"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_checkpoint(out).state_dict, pd.read_parquet(history), proc.stdout


@pytest.mark.slow
def test_two_gloo_processes_train_the_single_process_model(tmp_path: Path, prepared: Path):
    one, history_one, _ = train_stage(tmp_path, prepared, "one")
    two, history_two, stdout = train_stage(tmp_path, prepared, "two", nproc_per_node=2)
    assert "(2 processes)" in stdout  # it did run under torchrun
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= TOLERANCE
    assert any(not torch.equal(one[k], two[k]) for k in one)  # two reductions, not one run twice
    pd.testing.assert_frame_equal(history_one, history_two, rtol=1e-4)
    # one DVCLive writer (rank 0): each epoch once, none of a second process's rows appended or racing
    steps = (tmp_path / "two-live/plots/metrics/test/acc.tsv").read_text().split()[2::2]
    assert steps == [str(e) for e in history_two["epoch"]]


@pytest.mark.slow
def test_bf16_autocast_trains_a_different_close_model(tmp_path: Path, prepared: Path):
    fp32, _, _ = train_stage(tmp_path, prepared, "fp32")
    bf16, history, _ = train_stage(tmp_path, prepared, "bf16", precision="bf16")
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    gap = max(float((fp32[k] - bf16[k]).abs().max()) for k in fp32)
    assert 0 < gap < 0.1 and all(v.dtype == torch.float32 for v in bf16.values() if v.is_floating_point())


def test_the_launcher_runs_standalone_on_one_machine_and_rendezvous_across_several():
    single = torchrun_command(
        "py", "stages/train.py", ["--seed", "0"], nproc_per_node=2, nnodes=1, rdzv_endpoint=None, run_id="r"
    )
    assert single == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "stages/train.py",
        "--seed",
        "0",
    ]
    multi = torchrun_command("py", "s.py", [], nproc_per_node=8, nnodes=2, rdzv_endpoint="node0:29400", run_id="r")
    assert "--nnodes=2" in multi and "--rdzv-endpoint=node0:29400" in multi and "--rdzv-backend=c10d" in multi
    with pytest.raises(ValueError, match="^rdzv_endpoint: 2 machines"):
        torchrun_command("py", "s.py", [], nproc_per_node=8, nnodes=2, rdzv_endpoint=None, run_id="r")


@pytest.mark.parametrize(
    "train,message",
    [
        ({"nnodes": 2}, "train.rdzv_endpoint: expected the host:port of torchrun's rendezvous for train.nnodes = 2"),
        ({"nproc_per_node": 4, "batch_size": 6}, "train.batch_size: expected at least 2 images for each of the 4"),
        ({"rdzv_endpoint": "no port"}, "train.rdzv_endpoint: expected"),
        ({"precision": "fp16"}, "train.precision: expected one of fp32, bf16"),
    ],
)
def test_impossible_launches_are_refused_in_one_line(train, message):
    with pytest.raises(ParamsError) as err:
        check_params(deep_update(copy.deepcopy(TINY), {"train": train}))
    assert any(line.startswith(message) for line in err.value.lines), err.value.lines


class Hub:
    """An all-reduce among threads that stand for the processes: each rank's tensor summed over ranks."""

    def __init__(self, size: int) -> None:
        self.barrier, self.slots = threading.Barrier(size, timeout=20), [torch.zeros(())] * size

    def all_reduce(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0].clone())
        self.barrier.wait()  # everyone has read before a rank writes its next tensor
        return total


@dataclass(frozen=True)
class ThreadWorld(World):
    """A :class:`World` whose sums over processes go through a :class:`Hub` (no process group)."""

    hub: Hub | None = None

    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hub.all_reduce(self.rank, tensor)

    def all_sum(self, *values: float) -> list[float]:
        return self.reduce(torch.tensor(values, dtype=torch.float64)).tolist()


def on_threads(size: int, fn):
    """``[fn(world) for each rank]``, the ranks running at once on threads joined by one hub."""
    hub, results = Hub(size), [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(ThreadWorld(rank, size, hub=hub))
        except BaseException as exc:
            hub.barrier.abort()
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_each_shards_scaled_loss_gives_ddp_the_global_batchs_mean_gradient():
    """A global batch of 63 in shards of 32 and 31: DDP averages the shards' gradients, so each shard's loss
    must be its summed cross-entropy × W/B; the mean of the gradients is then that of the global mean loss,
    and the reported sums add up to the global summed loss."""
    gen = torch.Generator().manual_seed(0)
    data = Split(torch.randn(70, 2, 3, dtype=torch.float64, generator=gen), torch.randint(0, 4, (70,), generator=gen))
    template = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 4)).double()
    idx = torch.randperm(70, generator=gen)[:63]

    def shard_gradient(world: World) -> tuple[list[torch.Tensor], float, int]:
        model = copy.deepcopy(template)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the step leaves the model as it is
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        summed, _, n = Step(model, opt, sched, data, "none", torch.Generator(), world, "fp32").one(idx)
        return [p.grad for p in model.parameters()], summed, n

    (g0, s0, n0), (g1, s1, n1) = shard_gradient(World(0, 2)), shard_gradient(World(1, 2))
    loss = F.cross_entropy(template(data.x[idx]), data.y[idx])
    expected = torch.autograd.grad(loss, list(template.parameters()))
    assert (n0, n1) == (32, 31)
    for a, b, want in zip(g0, g1, expected, strict=True):
        torch.testing.assert_close((a + b) / 2, want, rtol=1e-12, atol=1e-14)
    assert s0 + s1 == pytest.approx(loss.item() * 63, rel=1e-12)


def test_bn_repair_weights_each_process_by_its_number_of_batches():
    """Five repair batches of 4 with different means: rank 0 runs 3 of them, rank 1 runs 2. The combined
    statistics are the single process's cumulative average: the mean over all 5 batches of the batch means
    and of the unbiased batch variances (weighting the ranks equally would give another mean)."""
    gen = torch.Generator().manual_seed(0)
    row = torch.arange(20, dtype=torch.float64)[:, None]
    x = torch.randn(20, 3, dtype=torch.float64, generator=gen) * (1 + row // 4) + row  # batches' moments differ
    data, model = Split(x, torch.zeros(20, dtype=torch.long)), torch.nn.Sequential(torch.nn.BatchNorm1d(3)).double()
    batches = x.split(4)
    mean, var = torch.stack([b.mean(0) for b in batches]).mean(0), torch.stack([b.var(0) for b in batches]).mean(0)
    alone = repair_bn(model, model.state_dict(), data, batch_size=4)
    ranks = on_threads(2, lambda world: repair_bn(model, model.state_dict(), data, batch_size=4, world=world))
    for params in (alone, *ranks):
        torch.testing.assert_close(params["0.running_mean"], mean, rtol=1e-12, atol=0)
        torch.testing.assert_close(params["0.running_var"], var, rtol=1e-12, atol=0)
        assert int(params["0.num_batches_tracked"]) == 5


def sharded_curve(rank: int, size: int, port: int, out: str, data: Split) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    world = join_world(rank, size, rank, "cpu")
    model, spec, params_a, params_b = bn_pair()
    repair = bn_repair_hook(model, data, repair_samples=None, batch_size=40, world=world)
    curve, summary = measure_pair_with_repair(
        spec, model, params_a, params_b, params_b, lambda_grid(5), {"test": data}, repair=repair, world=world
    )
    plane = plane_of(model, spec, params_a, params_b, data, world)
    if world.is_main:
        torch.save((curve, summary, plane), out)
    leave_world(world)


def plane_of(model, spec, params_a, params_b, data, world=ALONE):
    params_c = {
        k: (v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(0)) if v.is_floating_point() else v)
        for k, v in params_b.items()
    }
    return landscape(
        model, params_a, params_b, params_c, plane_grid(2, 0.1), data, keys=sorted(spec.matched(params_a)), world=world
    )


def bn_pair():
    config = make_config("resnet20", input_shape=(1, 28, 28), num_classes=10, width_multiplier=1)
    model = build_model("resnet20", config, seed=0)
    params = [build_model("resnet20", config, seed=s).state_dict() for s in (0, 1)]
    return model, get_arch("resnet20").permutation_spec(config), *params


@pytest.mark.slow
def test_a_sharded_measure_gives_the_unsharded_curve_barriers_and_landscape(tmp_path: Path, splits):
    """Two gloo processes: each evaluates its rows at every λ and repairs BN on every other batch."""
    # repair batches of 40: 3 on one process, 2 on the other
    data = Split(splits["test"].x[:175], splits["test"].y[:175])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(sharded_curve, args=(2, port, str(tmp_path / "curve.pt"), data), nprocs=2)
    curve, summary, plane = torch.load(tmp_path / "curve.pt")
    model, spec, params_a, params_b = bn_pair()
    repair = bn_repair_hook(model, data, repair_samples=None, batch_size=40)
    expected, expected_summary = measure_pair_with_repair(
        spec, model, params_a, params_b, params_b, lambda_grid(5), {"test": data}, repair=repair
    )
    assert [(r["lam"], r["repair"]) for r in curve] == [(r["lam"], r["repair"]) for r in expected]
    for got, want in zip(curve, expected, strict=True):
        assert got["acc"] == want["acc"] and got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert summary["test_loss_barrier_mid"] == pytest.approx(expected_summary["test_loss_barrier_mid"], rel=1e-5)
    assert any(r["loss"] != w["loss"] for r, w in zip(curve, expected, strict=True) if r["repair"])  # another summation
    whole = plane_of(model, spec, params_a, params_b, data)  # connect's landscape
    for got, want in zip(plane, whole, strict=True):
        assert got["acc"] == want["acc"] and got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert any(got["loss"] != want["loss"] for got, want in zip(plane, whole, strict=True))  # summed in two shards


@pytest.mark.slow
def test_measure_and_connect_under_torchrun_write_the_single_process_numbers(tmp_path: Path, tiny_run):
    """A BatchNorm ResNet through `dvc repro`, then the measure and connect stages again with
    measure.nproc_per_node = 2."""
    tree = deep_update(
        copy.deepcopy(TINY),
        {
            "model": {"arch": "resnet20", "resnet20": {"width_multiplier": 0.25}},
            "permute": {"methods": ["identity", "wm"]},
            "measure": {"repair": "bn", "repair_samples": 150, "num_lambdas": 3},  # λ = ½ and the endpoints
            "three": {"resolution": 2},
        },
    )
    repo = tiny_run.restore(tmp_path / "repo")  # the tiny run: its prepared digits stay cached
    (repo / "params.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    run(repo, "dvc", "repro", "measure@pair0", "connect@triple0-wm")
    tree["measure"]["nproc_per_node"] = 2
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(tree))
    out = run(
        repo,
        sys.executable,
        "stages/measure.py",
        "--seed-a",
        "0",
        "--seed-b",
        "1",
        "--model-a",
        "data/models/seed0.pt",
        "--model-b",
        "data/models/seed1.pt",
        "--merged",
        "data/merged/seed0-seed1",
        "--data",
        "data/prepared",
        "--out",
        str(tmp_path / "two"),
        "--params",
        str(tmp_path / "two.yaml"),
    )
    assert "(2 processes)" in out
    for method in ("identity", "wm"):
        one = json.loads((repo / "data" / "measure" / "seed0-seed1" / method / "summary.json").read_text())
        two = json.loads((tmp_path / "two" / method / "summary.json").read_text())
        assert one["bn_repair"] and two["bn_repair"]
        for key in ("test_loss_barrier_mid", "test_acc_barrier_max", "train_loss_barrier_mid", "l2_after"):
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    out = run(
        repo,
        sys.executable,
        "stages/connect.py",
        "--method",
        "wm",
        "--seeds",
        "0,1,2",
        "--models",
        "data/models",
        "--data",
        "data/prepared",
        "--out",
        str(tmp_path / "three"),
        "--params",
        str(tmp_path / "two.yaml"),
    )
    one = json.loads((repo / "data" / "connect" / "seed0-seed1-seed2" / "wm" / "edges.json").read_text())["edges"]
    two = json.loads((tmp_path / "three" / "edges.json").read_text())["edges"]
    for a, b in zip(one, two, strict=True):
        assert b["test_loss_barrier_max"] == pytest.approx(a["test_loss_barrier_max"], rel=1e-5, abs=1e-6)
    landscape_one = pd.read_parquet(repo / "data" / "connect" / "seed0-seed1-seed2" / "wm" / "landscape.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "three" / "landscape.parquet"), landscape_one, rtol=1e-5)
