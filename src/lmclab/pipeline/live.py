"""The train stage's per-epoch metrics through DVCLive (docs/live-training.md): one DVCLive directory per
seed holding ``metrics.json`` (the latest epoch's numbers and its ``step``) and ``plots/metrics/*.tsv``
(one row per epoch), which dvc.yaml declares as the stage's ``metrics:`` and ``plots:``, so
``dvc exp show``, ``dvc plots show`` and the DVC VS Code extension read them while the stage runs.

``step`` is the epoch (1, 2, …). Every run starts the directory afresh (``resume=False``): training
itself always restarts from epoch 1, so a rerun after an interruption must not append to the
interrupted run's rows. DVCLive writes no ``dvc.yaml`` of its own (``dvcyaml=None``: ours declares the
files) and saves no experiment (``save_dvc_exp=False``: ``dvc exp run`` does that). No timestamps are
logged, so the files are the same on every run of the same training (DVC hashes them in dvc.lock).
dvclive is imported only here, by the stage, never by the library: it is a pipeline dependency."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SPLITS = ("train", "test")  # history keys ``<split>_<metric>`` are logged as ``<split>/<metric>``


def live_name(key: str) -> str:
    """DVCLive's name of a history key: ``train_loss`` → ``train/loss`` (a ``train`` block in
    metrics.json, ``plots/metrics/train/loss.tsv``); any other key (``lr``) as it is."""
    split, _, metric = key.partition("_")
    return f"{split}/{metric}" if split in SPLITS and metric else key


def log_epoch(live: Any, row: Mapping[str, float]) -> None:
    """One history row (:func:`lmclab.train.training.train`) as DVCLive step ``row["epoch"]``: every
    other number logged, then ``metrics.json`` rewritten and the step marked done (``next_step``)."""
    live.step = int(row["epoch"])
    for key, value in row.items():
        if key != "epoch":
            live.log_metric(live_name(key), value)
    live.next_step()


@contextmanager
def epoch_logger(directory: Path | None, *, main: bool = True) -> Iterator[Callable[[Mapping], None] | None]:
    """``on_epoch`` for :func:`lmclab.train.training.train` writing to the DVCLive directory
    ``directory``, or ``None`` (nothing logged, nothing imported) when ``directory`` is ``None`` or this
    is not the main process (under torchrun only rank 0 logs). The run is ended (DVCLive's step marker for
    VS Code removed) on the way out, also when training fails."""
    if directory is None or not main:
        yield None
        return
    live = _live_class()(dir=str(directory), resume=False, report=None, save_dvc_exp=False, dvcyaml=None)
    try:
        yield lambda row: log_epoch(live, row)
    finally:
        live.end()


def _live_class() -> type:
    """DVCLive's ``Live``, also in a git repository without a commit yet (``git init``, then ``dvc repro``):
    DVCLive 3.49 asks git for HEAD before it checks for commits, and fails (the bug of
    treeverse/dvclive#522, back). Without a commit there is no experiment to attach the run to; the
    files are written all the same."""
    from dvclive import Live
    from scmrepo.exceptions import SCMError

    class StageLive(Live):
        def _init_dvc(self) -> None:
            try:
                super()._init_dvc()
            except SCMError:  # raised where DVCLive reads the baseline commit, after it found the repository
                self._dvc_file = "dvc.yaml"  # what DVCLive sets next (unused: we pass dvcyaml=None)

    return StageLive
