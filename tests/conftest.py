"""Shared fixtures: a small prepared slice of the real mnist5k digits and small trained MLPs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under pytest-xdist the workers share the cores: each worker's torch, and the stages and commands its tests
# start (they inherit the environment), runs cores // workers threads, which the suite measured faster than
# every process starting one per core (docs/testing.md). Set here, before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import torch  # noqa: E402

from lmclab.archs import make_config  # noqa: E402
from lmclab.archs.checkpoint import Checkpoint  # noqa: E402
from lmclab.core.data import Split, load_split, prepare  # noqa: E402
from lmclab.core.spec import PermutationSpec  # noqa: E402
from lmclab.train.training import train  # noqa: E402

pytest_plugins = ["suite_cost"]  # --record-durations (tests/suite_cost.py)

# small configurations for the float32 invariance tests (every arch: tests/archs/test_every_arch.py)
SMALL_CONFIGS: dict[str, dict] = {
    "mlp": {"hidden": 3, "width": 12},
}


# what the library and the stages read from the environment: set by the caller, they would change what runs
# (LMCLAB_WARM=0 turns warm start off; torchrun's variables make a stage join a process group)
CALLER_ENV = ("LMCLAB_",)
TORCHRUN_ENV = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under `make mutation` (tools/mutation.py), mutmut records which test calls which library function
    while MUTANT_UNDER_TEST=stats, in this process only (it keeps the mode in the process as well): a
    process a test starts (the `lmclab` command, a stage) runs the library plainly instead of failing to
    find mutmut's configuration from its own folder. When a mutant is tested, the processes inherit its
    name and run it too."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        del os.environ["MUTANT_UNDER_TEST"]


@pytest.fixture(scope="session", autouse=True)
def clean_environment() -> Iterator[None]:
    """Tests never depend on the caller's environment: its LMCLAB_* and torchrun variables are removed for
    the session (subprocesses inherit the cleaned environment; a test sets what it needs explicitly), and
    the stages' warm-start servers live in a private directory of the session, stopped at its end."""
    warm = Path(tempfile.mkdtemp(prefix="lmclab-warm-tests-"))  # 0700; short: a socket's path is limited
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith(CALLER_ENV) or k in TORCHRUN_ENV]:
            mp.delenv(name)
        mp.setenv("LMCLAB_WARM_DIR", str(warm))
        yield
    for lock in warm.glob("*.lock"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(lock.read_text()), signal.SIGTERM)
    shutil.rmtree(warm, ignore_errors=True)


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every process of this test session sees: pytest's base temporary directory, or under
    pytest-xdist the folder above the workers' own (each worker has its basetemp inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory):
    """The tiny pipeline (``dvc_repo.TINY``) reproduced once for the whole session, shared by the xdist
    workers; a test restores a copy of it (``tiny_run.restore(path)``) and never changes it."""
    from dvc_repo import tiny_run as reproduce

    return reproduce(shared_dir(tmp_path_factory))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """800 train / 200 test real digits in the prepared format."""
    out = tmp_path_factory.mktemp("data") / "prepared"
    prepare("mnist5k", tmp_path_factory.mktemp("raw"), out, max_train=800, max_test=200)
    return out


@pytest.fixture(scope="session")
def splits(prepared: Path) -> dict[str, Split]:
    return {"train": load_split(prepared, "train"), "test": load_split(prepared, "test")}


@pytest.fixture(scope="session")
def trained(splits: dict[str, Split]):  # returns a factory
    """``trained(seed, width=32, hidden=2, epochs=4) -> Checkpoint``, cached per argument set."""
    cache: dict[tuple, Checkpoint] = {}

    def make(seed: int, width: int = 32, hidden: int = 2, epochs: int = 4) -> Checkpoint:
        key = (seed, width, hidden, epochs)
        if key not in cache:
            config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=hidden, width=width)
            cache[key] = train(
                "mlp",
                config,
                seed,
                splits["train"],
                splits["test"],
                epochs=epochs,
                lr=1e-3,
                batch_size=100,
                progress=False,
            )[0]
        return cache[key]

    return make


def random_params(arch: str, config, seed: int) -> dict[str, torch.Tensor]:
    """A randomly initialised state_dict with non-trivial BatchNorm statistics, if any."""
    from lmclab.archs import build_model

    model = build_model(arch, config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    state = {}
    for k, v in model.state_dict().items():
        if k.endswith("running_mean"):
            v = torch.randn(v.shape, generator=gen) * 0.1
        elif k.endswith("running_var"):
            v = torch.rand(v.shape, generator=gen) + 0.5
        state[k] = v.clone()
    return state


def partition(spec: PermutationSpec) -> set[frozenset]:
    """The groups as sets of (parameter, axis): equal specs up to renaming of groups."""
    return {frozenset(places) for places in spec.groups.values()}


def headed(spec: PermutationSpec) -> tuple[dict[frozenset, int], set[frozenset]]:
    """The head count of each headed group (as its set of places) and the ties as sets of such groups:
    equal up to renaming of groups and of ties."""
    places = {g: frozenset(p) for g, p in spec.groups.items()}
    ties: dict[str, set] = {}
    for g, heads in spec.heads.items():
        ties.setdefault(heads.tie, set()).add(places[g])
    return {places[g]: heads.count for g, heads in spec.heads.items()}, {frozenset(t) for t in ties.values()}
