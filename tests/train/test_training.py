"""Training determinism, checkpoints and their one-line errors."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lmclab.archs import make_config
from lmclab.archs.checkpoint import CheckpointError, check_same_architecture, load_checkpoint, save_checkpoint
from lmclab.train.training import train


def _train(splits, seed: int, epochs: int = 2):
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=16)
    return train(
        "mlp", config, seed, splits["train"], splits["test"], epochs=epochs, lr=1e-3, batch_size=128, progress=False
    )


def test_same_seed_gives_a_bit_identical_checkpoint(splits, tmp_path) -> None:
    (c1, h1), (c2, h2), (c3, _) = _train(splits, 5), _train(splits, 5), _train(splits, 6)
    assert all(torch.equal(c1.state_dict[k], c2.state_dict[k]) for k in c1.state_dict)
    assert h1 == h2
    assert not torch.equal(c1.state_dict["layers.0.weight"], c3.state_dict["layers.0.weight"])
    # the file itself is byte-identical too (DVC hashes files), written to the same stage path
    save_checkpoint(tmp_path / "run1" / "seed5.pt", c1)
    save_checkpoint(tmp_path / "run2" / "seed5.pt", c2)
    digest = lambda p: hashlib.md5(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "run1" / "seed5.pt") == digest(tmp_path / "run2" / "seed5.pt")


def test_training_learns_and_records_history(splits) -> None:
    ckpt, history = _train(splits, 0, epochs=6)
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5, 6]
    assert history[-1]["test_acc"] > 0.6 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert ckpt.seed == 0 and ckpt.arch == "mlp"


def test_on_epoch_sees_each_row_as_it_is_measured_and_cannot_change_the_history(splits) -> None:
    seen = []

    def on_epoch(row: dict) -> None:
        seen.append(dict(row))
        row["test_acc"] = -1.0  # a copy: the history keeps its own

    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=2, width=16)
    _, history = train("mlp", config, 0, splits["train"], splits["test"], epochs=3, batch_size=128, on_epoch=on_epoch)
    _, plain = _train(splits, 0, epochs=3)
    assert history == plain  # the rows (and so the history Parquet) are the same with a callback
    assert [r["epoch"] for r in seen] == [1, 2, 3]
    assert seen[:2] == history[:2] and {k: history[-1][k] for k in seen[-1]} == seen[-1]  # the last row gains NC stats


def test_checkpoint_round_trip(trained, tmp_path) -> None:
    ckpt = trained(0)
    save_checkpoint(tmp_path / "m.pt", ckpt)
    back = load_checkpoint(tmp_path / "m.pt")
    assert back.arch == "mlp" and back.config == ckpt.config and back.seed == 0
    assert all(torch.equal(back.state_dict[k], v) for k, v in ckpt.state_dict.items())
    assert not list(tmp_path.glob(".*.tmp"))


def test_corrupted_and_foreign_checkpoints_are_one_line_errors(trained, tmp_path) -> None:
    save_checkpoint(tmp_path / "m.pt", trained(0))
    data = (tmp_path / "m.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    for name, pattern in (
        ("truncated.pt", "truncated or corrupted"),
        ("garbage.pt", "truncated or corrupted"),
        ("foreign.pt", "not an lmclab checkpoint"),
        ("absent.pt", "not found"),
    ):
        with pytest.raises(CheckpointError, match=pattern) as err:
            load_checkpoint(tmp_path / name)
        assert str(err.value).startswith(str(tmp_path / name)) and "\n" not in str(err.value)


def test_checkpoints_of_different_widths_cannot_be_paired(trained, tmp_path) -> None:
    a, b = trained(0, width=32), trained(1, width=16)
    with pytest.raises(CheckpointError, match="differs from"):
        check_same_architecture(a, b, tmp_path / "seed0.pt", tmp_path / "seed1.pt")
    check_same_architecture(a, trained(1, width=32), tmp_path / "seed0.pt", tmp_path / "seed1.pt")


def test_bad_training_options(splits) -> None:
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=4)
    for opts, pattern in (
        ({"epochs": 0}, "^epochs must"),
        ({"epochs": 1, "lr": 0.0}, "^lr must"),
        ({"epochs": 1, "batch_size": 10_000}, "^batch_size must"),
    ):
        with pytest.raises(ValueError, match=pattern):
            train("mlp", config, 0, splits["train"], splits["test"], progress=False, **opts)
    with pytest.raises(ValueError, match="^width must be a positive integer, got 0"):
        make_config("mlp", input_shape=(1, 28, 28), num_classes=10, width=0)
    with pytest.raises(ValueError, match="^arch: unknown architecture 'transformer'"):
        make_config("transformer", input_shape=(1, 28, 28), num_classes=10)
    with pytest.raises(ValueError, match=r"^config: mlp takes no option\(s\) \['depth'\]"):
        make_config("mlp", input_shape=(1, 28, 28), num_classes=10, depth=3)
