"""A stage script hands its work to a warm-start worker before it imports anything heavy: importing a
stage script loads neither torch nor numpy, pandas or scipy (``lmclab.pipeline.stage.run_warm``; the
train stage's keys come from options models in modules that load torch, so they are looked up lazily,
``LazyKeys``). A stage that imported torch at the top paid ~1.5 s per process before the handover."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys

import pytest
from dvc_repo import ROOT

from lmclab.pipeline.stage import LazyKeys

STAGES = sorted(p.name for p in (ROOT / "stages").glob("*.py") if p.name != "_repo_src.py")
HEAVY = ("torch", "numpy", "pandas", "scipy", "matplotlib")


def test_every_stage_script_imports_nothing_heavy_before_its_handover() -> None:
    code = (
        "import json, runpy, sys\n"
        f"loaded = {{}}\n"
        f"for name in {STAGES!r}:\n"
        "    runpy.run_path(name, run_name='imported')\n"
        f"    loaded[name] = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps(loaded))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "stages", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {name: [] for name in STAGES}


def test_the_train_stage_keys_name_params_yaml_once_looked_up() -> None:
    stage = runpy.run_path(str(ROOT / "stages" / "train.py"), run_name="imported")
    keys, mae = stage["KEYS"], stage["MAE_KEYS"]
    assert keys["mixup_alpha"] == "train.mixup_alpha" and keys["lr"] == "train.lr" and keys["nnodes"] == "train.nnodes"
    assert keys["precision"] == "train.precision" and "model" not in keys  # train()'s options and the launcher's
    assert mae["mask_ratio"] == "train.mae.mask_ratio" and mae["pool"] == "model.vit.pool"
    assert mae["lr"] == "train.lr" and mae["pretraining"] == "train.mae.pretraining"


def test_lazy_keys_are_made_once_at_the_first_look_up() -> None:
    made = []
    keys = LazyKeys(lambda: made.append(1) or {"n": "block.n"})
    assert made == []
    assert keys["n"] == "block.n" and "m" not in keys and list(keys) == ["n"] and len(keys) == 1
    assert made == [1]
    with pytest.raises(KeyError):
        keys["m"]
